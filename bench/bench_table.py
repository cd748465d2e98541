"""The README's table of today's figures, from what ``make bench`` just ran (not a bench).

    .venv/bin/python bench/bench_table.py var/bench > var/bench/table.md

Reads ``results.jsonl`` (each bench's ``budget_row``s) and ``exits`` ("bench/x.py CODE" a
line, in the order they ran) from the folder given, and prints one Markdown table, a row for
each bench: each budget it judged, with its figure, the floor measured beside it, the ratio to
the budget and the load average then (several budgets of one bench in order, joined by
semicolons; "over (budget 2 of 3)" names which); a bench that ended without judging any budget (it
failed, or does not record rows yet) gets a row saying how it exited. ``make bench`` writes it to
``var/bench/table.md``; the README's "Performance budgets" section is that file, pasted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path


def main(folder: Path) -> None:
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    exits = [line.rsplit(" ", 1) for line in (folder / "exits").read_text().splitlines()]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(
        "`make bench` runs every bench in `bench/`, fails when any is over its budget (the"
        " project guide's) or fails, and writes this table to `var/bench/table.md`.\nThis run:"
        f" {datetime.now(UTC):%Y-%m-%d}, commit {commit or 'unknown'}, {os.cpu_count()} cores;"
        " ratio = figure ÷ budget; load = the one-minute load average as each budget was"
        " judged.\nEvery earlier round: [docs/benchmarks.md](docs/benchmarks.md)."
    )
    speed = _machine_speed(folder / "machine")
    if speed:
        print(speed)
    print()
    print("| bench | budget | figure | floor, measured beside it | ratio | load | standing |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for script, code in exits:
        print(
            _row(
                Path(script).name, code, [row for row in rows if row["bench"] == Path(script).name]
            )
        )


def _machine_speed(path: Path) -> str:
    """The line on the machine's speeds (``bench_common.reference_loop_ms`` and
    ``reference_round_trip_us``, before and after the benches), or nothing when they were
    not measured."""
    if not path.exists():
        return ""
    taken = dict(line.split(" ", 1) for line in path.read_text().splitlines() if " " in line)
    measured = ", ".join(f"{taken[when]} {when}" for when in ("before", "after") if when in taken)
    return (
        "The machine (`bench/bench_common.py`): a Python loop of 3,000,000 additions, and a"
        f" byte's round trip to another thread over a local socket: {measured} the benches."
        " Figures from a round whose machine measured otherwise are not comparable one for one."
    )


def _row(name: str, code: str, mine: list[dict]) -> str:
    """One line for a bench: its budgets, figures, floors and ratios joined in order."""
    if not mine:
        what = "judged no budget here" if code == "0" else f"**exited {code}**"
        return f"| `{name}` | — | — | — | — | — | {what} (see its output) |"
    ratios = "; ".join("—" if r["ratio"] is None else f"{r['ratio']:.2f}×" for r in mine)
    floors = "; ".join(r["floor"] for r in mine if r["floor"] != "—") or "—"
    loads = sorted({r["load"] for r in mine})
    load = f"{loads[0]:.1f}" if len(loads) == 1 else f"{loads[0]:.1f}–{loads[-1]:.1f}"
    over = [n + 1 for n, r in enumerate(mine) if not r["within"]]
    if over:
        which = f" (budget {', '.join(map(str, over))} of {len(mine)})" if len(mine) > 1 else ""
        standing = f"**over**{which}"
    else:
        standing = "within" if code == "0" else f"**exited {code}**"
    return (
        f"| `{name}` | {'; '.join(r['budget'] for r in mine)} | {'; '.join(r['figure'] for r in mine)}"
        f" | {floors} | {ratios} | {load} | {standing} |"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "var/bench"))
