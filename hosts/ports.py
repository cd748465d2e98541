"""Host ports for published container ports, from each machine's configured range."""

from __future__ import annotations


def pick_free_ports(start: int, end: int, used: set[int], count: int) -> list[int]:
    """The lowest ``count`` ports in ``start..end`` not in ``used`` (fewer if the range is full)."""
    if count <= 0:
        return []
    picked = []
    for port in range(start, end + 1):
        if port not in used:
            picked.append(port)
            if len(picked) == count:
                break
    return picked
