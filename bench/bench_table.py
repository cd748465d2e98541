"""The README's table of today's figures, from what ``make bench`` just ran (not a bench).

    .venv/bin/python bench/bench_table.py var/bench > var/bench/table.md

Reads ``results.jsonl`` (each bench's ``budget_row``s) and ``exits`` ("bench/x.py CODE" a
line, in the order they ran) from the folder given, and prints one Markdown table: a row for
each budget a bench judged, with its figure, the floor measured beside it, the ratio to the
budget and the load average then; a bench that ended without judging any budget (it failed,
or does not record rows yet) gets a row saying how it exited. ``make bench`` writes it to
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
        f"Figures of `make bench` on {datetime.now(UTC):%Y-%m-%d} (commit {commit or 'unknown'},"
        f" {os.cpu_count()} cores; the load average is the one-minute figure as each budget"
        " was judged):"
    )
    print()
    print(
        "| bench | budget | figure | floor, measured beside it | ratio to budget | load | standing |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for script, code in exits:
        name = Path(script).name
        mine = [row for row in rows if row["bench"] == name]
        for row in mine:
            ratio = "—" if row["ratio"] is None else f"{row['ratio']:.2f}×"
            standing = "within" if row["within"] else "**over**"
            print(
                f"| `{name}` | {row['budget']} | {row['figure']} | {row['floor']} | {ratio}"
                f" | {row['load']:.1f} | {standing} |"
            )
        if not mine:
            what = "judged no budget here" if code == "0" else f"**exited {code}**"
            print(f"| `{name}` | — | — | — | — | — | {what} (see its output) |")
        elif code != "0" and all(row["within"] for row in mine):
            print(f"| `{name}` | — | — | — | — | — | **exited {code}** (see its output) |")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "var/bench"))
