"""The compatibility doc's table (``Table.markdown``, written by the conformance run): a
``|`` in a command or a note stays inside its cell."""

from __future__ import annotations

import re

from tests.vast.test_cli_conformance import Table


def cells(line: str) -> list[str]:
    """A markdown table row's cells, split where GitHub splits them: at each bare ``|``."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def test_a_pipe_in_a_command_or_a_note_is_escaped_and_the_row_keeps_three_cells():
    table = Table()
    table.works("set role host|client", "chooses a|b\n  on  two lines", True, "")
    table.works("(another team's id)", "answers 404 | nothing changes", True, "")
    rows = table.markdown().splitlines()[-2:]
    assert [cells(row) for row in rows] == [
        ["`vastai set role host\\|client`", "yes", "chooses a\\|b on two lines"],
        ["(another team's id)", "yes", "answers 404 \\| nothing changes"],
    ]
