"""The slowest test files first, so parallel workers finish together (loaded as a plugin,
``-p tests.ordering``, after pytest-randomly's shuffle and pytest-django's grouping).

``make test`` hands whole files to its xdist workers (``--dist loadfile``: a file's module
and session fixtures, such as its simulated hosts or its installation, are made once). xdist
would hand them out largest first by number of tests, which puts the system tests' files
(few tests, minutes each) last: the suite then ended with one worker alone on a fault matrix
while the others sat idle. Here a file's cost is estimated from its tests' marks and it runs
in order of that cost, the longest first (the longest-processing-time rule), so the short
ones fill in at the end.

Only the order of files changes; what runs, and the order within a file (shuffled by
pytest-randomly when it is on), stay as they were. Files of the same estimated cost keep the
order they came in, shuffled or not.
"""

from __future__ import annotations

import pytest

# A rough cost per test, in seconds on the 2-core CI machine, for ordering only: a test on
# simulated hosts (sshd, Docker) or a whole installation costs about twenty plain ones; a
# Chromium test, a dozen. Measured from a whole run's durations (issue 31); exact figures
# matter little, only that the files with minutes of work go first.
COST_OF = {"system": 5.0, "browser": 3.0}
PLAIN_TEST_COST = 0.25
# The fault matrix and the installation's system tests start a whole installation (web,
# workers, beat, Caddy, PostgreSQL and Redis of their own) once for the file.
INSTALLATION_COST = 60.0
INSTALLATION_FIXTURES = {"installation"}


def cost_of_test(item: pytest.Item) -> float:
    for mark, cost in COST_OF.items():
        if item.get_closest_marker(mark) is not None:
            return cost
    return PLAIN_TEST_COST


def file_costs(items: list[pytest.Item]) -> dict[str, float]:
    costs: dict[str, float] = {}
    installations: set[str] = set()
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        costs[path] = costs.get(path, 0.0) + cost_of_test(item)
        if INSTALLATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            installations.add(path)
    for path in installations:
        costs[path] += INSTALLATION_COST
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
