"""Subscribers to the billing room's domain events (signals): push them to consoles, etc."""

from __future__ import annotations

from django.dispatch import receiver

from billing.money import format_usd
from billing.selectors import team_balance, team_earnings_balance
from billing.signals import balance_changed
from marketplace.events import publish_team_event


@receiver(balance_changed, dispatch_uid="marketplace.push_balance_changed")
def push_balance_changed(sender, team_id: int, **kwargs) -> None:
    """Consoles of the team show the new balance without a reload."""
    balance = team_balance(team_id)
    publish_team_event(
        team_id,
        "balance.changed",
        {
            "available": balance.available,
            "held": balance.held,
            "earnings": team_earnings_balance(team_id),
            "available_display": format_usd(balance.available),
            "held_display": format_usd(balance.held),
        },
    )
