"""Demo data for `make run` (called by marketplace's demo_data command)."""

from __future__ import annotations


def demo_step(users: dict, simhosts: list[dict]) -> str:
    return ""
