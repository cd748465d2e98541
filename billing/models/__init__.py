"""The money: a double-entry ledger in integer micro-dollars, two-phase holds, Stripe top-ups.

Every movement is a ``Transfer`` whose ``Entry`` rows sum to zero; each entry changes one
``Account``'s balance and records the balance after it. Transfers and entries are append-only
(the database refuses UPDATE and DELETE on PostgreSQL) and idempotent by a unique key.

Accounts: each team's *available* and *held* credit, *earnings* (as a provider) and
*payout_pending* (earnings a provider asked to be paid, waiting for the operator), and the
platform's *revenue*, *stripe_clearing* (money in from card payments), *grants* (credit given
by operators) and *payouts* (earnings paid out). The two sources of credit, clearing and
grants, run negative; every other account is kept at or above zero by a CHECK constraint, so

    -(stripe_clearing + grants)
        = Σ available + Σ held + Σ earnings + Σ payout_pending + revenue + payouts.

A ``Hold`` reserves credit for a rental (available → held). Captures move part of it to the
provider's earnings and the platform fee to revenue; release returns the rest and closes it;
void returns all of an uncaptured hold. The database checks captured + released ≤ amount.

billing imports no other app: teams are string foreign keys, rentals are references
("rental:42") that callers pass in.

One module per concept: ``ledger`` (accounts, transfers, entries), ``holds``, ``topups``
(Stripe) and ``payouts`` (grants, payouts, payout requests).
"""

from __future__ import annotations

from billing.models.holds import Hold, HoldStatus
from billing.models.ledger import (
    SOURCE_ACCOUNT_KINDS,
    TEAM_ACCOUNT_KINDS,
    Account,
    AccountKind,
    AppendOrderIndex,
    ChargeUsage,
    Entry,
    ImmutableModel,
    ImmutableQuerySet,
    Transfer,
    TransferKind,
    UsageKind,
)
from billing.models.payouts import (
    CreditGrant,
    Payout,
    PayoutDestination,
    PayoutRequest,
    PayoutStatus,
)
from billing.models.topups import StripeEvent, StripeEventStatus, TopUp, TopUpStatus

__all__ = [
    "Account",
    "AccountKind",
    "AppendOrderIndex",
    "ChargeUsage",
    "CreditGrant",
    "Entry",
    "Hold",
    "HoldStatus",
    "ImmutableModel",
    "ImmutableQuerySet",
    "Payout",
    "PayoutDestination",
    "PayoutRequest",
    "PayoutStatus",
    "SOURCE_ACCOUNT_KINDS",
    "StripeEvent",
    "StripeEventStatus",
    "TEAM_ACCOUNT_KINDS",
    "TopUp",
    "TopUpStatus",
    "Transfer",
    "TransferKind",
    "UsageKind",
]
