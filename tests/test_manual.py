"""The README and docs/ stay a manual a reader can follow: every relative link lands on a file
and, where it names one, a heading that exists (sections move between the README and docs/, and
a link that still points at the old place fails silently on GitHub), and the README stays short
enough to read (issue 31: under 700 lines; history and contributor notes belong in docs/)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MANUAL = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MOST_LINES = 700


def _without_code(text: str) -> str:
    """The text outside fenced code blocks, where a `](` or a `#` is not Markdown."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", _without_code(path.read_text()), flags=re.M):
        anchor = _anchor(heading)
        repeats = seen.get(anchor, 0)
        seen[anchor] = repeats + 1
        found.add(anchor if repeats == 0 else f"{anchor}-{repeats}")
    return found


def _broken_links(path: Path) -> list[str]:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _without_code(path.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / file_part).resolve() if file_part else path
        if not destination.exists():
            broken.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
        elif anchor and (destination.is_dir() or anchor not in _anchors(destination)):
            broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    return broken


def test_every_relative_link_in_the_manual_lands_on_a_file_and_heading() -> None:
    broken = [link for path in MANUAL for link in _broken_links(path)]
    assert broken == []


def test_the_readme_stays_a_manual_not_a_diary() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines < README_MOST_LINES, (
        f"README.md has {lines} lines; move history to docs/benchmarks.md and contributor notes"
        " to docs/contributing.md"
    )
