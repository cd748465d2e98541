"""The slowest test files first, so parallel workers finish together (loaded as a plugin,
``-p tests.ordering``, after pytest-randomly's shuffle and pytest-django's grouping).

``make test`` hands whole files to its xdist workers (``--dist loadfile``: a file's module
and session fixtures, such as its simulated hosts or its installation, are made once). xdist
would hand them out largest first by number of tests, which puts the files of one or a few
long tests last (the vastai CLI's single test, minutes long, went out last of all): the run
then ends with one worker alone on them while the others sit idle. Here a file's cost is
estimated from its tests' marks (and a short table of the few outliers) and files go out in
order of that cost, the longest first (the longest-processing-time rule), so the short ones
fill in at the end.

Only the order of files changes; what runs, and the order within a file (shuffled by
pytest-randomly when it is on), stay as they were. Files of the same estimated cost keep the
order they came in, shuffled or not.
"""

from __future__ import annotations

import pytest

# A rough cost per test, for ordering only: a test on simulated hosts (sshd, Docker) or a
# live server costs about twenty plain ones. Exact figures matter little, only that the files
# with minutes of work go first.
COST_OF = {"system": 5.0, "browser": 5.0}
PLAIN_TEST_COST = 0.25
# Files whose cost the marks do not tell: one test that drives the vastai CLI through a whole
# session, whole installations (web, workers, beat, Caddy, a PostgreSQL and a Redis of their
# own) made once per file, the tenancy matrix's hundred requests per route. Relative figures
# from runs of each file alone; a file missing here is only ordered by its marks.
KNOWN_COST = {
    "tests/vast/test_cli_conformance.py": 300.0,
    "tests/faults/test_fault_matrix.py": 300.0,
    "tests/system/test_cluster.py": 300.0,
    "tests/clusters/test_cluster_gateway.py": 180.0,
    "tests/marketplace/test_tenancy_matrix.py": 150.0,
    "tests/system/test_embedded_sqlite.py": 90.0,
}


def cost_of_test(item: pytest.Item) -> float:
    for mark, cost in COST_OF.items():
        if item.get_closest_marker(mark) is not None:
            return cost
    return PLAIN_TEST_COST


def file_costs(items: list[pytest.Item]) -> dict[str, float]:
    costs: dict[str, float] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        costs[path] = costs.get(path, 0.0) + cost_of_test(item)
    for path in costs.keys() & KNOWN_COST.keys():
        costs[path] = max(costs[path], KNOWN_COST[path])
    return costs


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    costs = file_costs(items)
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(item.nodeid.split("::", 1)[0], index)

    def key(item: pytest.Item) -> tuple[float, int]:
        path = item.nodeid.split("::", 1)[0]
        return (-costs[path], first_seen[path])

    items.sort(key=key)  # stable: a file's tests keep their order


def pytest_configure(config: pytest.Config) -> None:
    # xdist's own reordering (largest file by number of tests first) would undo the order
    # above; it applies to --dist loadfile and loadscope only.
    if getattr(config.option, "dist", "no") in ("loadfile", "loadscope"):
        config.option.loadscopereorder = False
