"""Demo data for `make run` (called by marketplace's demo_data command)."""

from __future__ import annotations

from typing import Any

from billing.credits import credit_grant
from billing.money import MICRO_PER_DOLLAR, format_usd

DEMO_CREDIT = 500 * MICRO_PER_DOLLAR


def demo_step(users: dict[str, Any], simhosts: list[dict[str, Any]]) -> str:
    """Give the renter's personal team $500 of demo credit, once (idempotent by key).

    ``users`` are marketplace's users by role (billing imports no other app, so Any)."""
    renter = users.get("renter")
    if renter is None:
        return ""
    membership = renter.memberships.filter(team__personal=True).first()
    if membership is None:
        return ""
    credit_grant(
        team_id=membership.team_id,
        amount=DEMO_CREDIT,
        reason="Demo credit",
        idempotency_key=f"demo-credit:team-{membership.team_id}",
    )
    return f"billing: {renter.username}'s team has {format_usd(DEMO_CREDIT)} of demo credit"
