"""Subscribers to the billing room's domain events (signals): push them to consoles, etc."""

from __future__ import annotations

from django.dispatch import receiver

from billing.money import format_usd
from billing.selectors import team_balance, team_earnings_balance
from billing.signals import balance_changed
from billing.usd import micro_to_decimal_str as dollars
from marketplace.events import publish_team_event


@receiver(balance_changed, dispatch_uid="marketplace.push_balance_changed")
def push_balance_changed(sender, team_id: int, **kwargs) -> None:
    """Consoles of the team show the new balance without a reload. Amounts are dollar decimal
    strings, as everywhere in the API; ``…_display`` is the console's rounded text."""
    balance = team_balance(team_id)
    publish_team_event(
        team_id,
        "balance.changed",
        {
            "available": dollars(balance.available),
            "held": dollars(balance.held),
            "earnings": dollars(team_earnings_balance(team_id)),
            "available_display": format_usd(balance.available),
            "held_display": format_usd(balance.held),
        },
    )
