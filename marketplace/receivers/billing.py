"""Subscribers to the billing room's domain events (signals): push them to consoles, etc."""

from __future__ import annotations

from django.dispatch import receiver

from billing.money import format_usd
from billing.selectors import teams_balances
from billing.signals import balance_changed
from billing.usd import micro_to_decimal_str as dollars
from marketplace.events import publish_team_events, teams_listened


@receiver(balance_changed, dispatch_uid="marketplace.push_balance_changed")
def push_balance_changed(sender, team_ids: list[int], **kwargs) -> None:
    """Consoles of the teams show their new balances without a reload. Amounts are dollar
    decimal strings, as everywhere in the API; ``…_display`` is the console's rounded text.
    Only teams with a console open: most rents change two teams' balances with nobody watching
    either, and reading balances nobody is shown was a query and its ORM on every rent."""
    listened = teams_listened(team_ids)
    if not listened:
        return
    events = []
    for team_id, (balance, earnings) in teams_balances(listened).items():
        data = {
            "available": dollars(balance.available),
            "held": dollars(balance.held),
            "earnings": dollars(earnings),
            "available_display": format_usd(balance.available),
            "held_display": format_usd(balance.held),
        }
        events.append((team_id, data))
    publish_team_events("balance.changed", events)
