"""Compatibility names for callers not yet moved to the billing modules (see README layout).

The writes to the money now live in ``billing.ledger``, ``pg_bulk``, ``credits``, ``holds``,
``metering`` and ``topups``. Only ``marketplace/api/billing.py`` and
``marketplace/views/billing.py`` still import them from here; this module goes once those
imports move.
"""

from __future__ import annotations

from billing.credits import credit_grant
from billing.topups import topup_checkout_start, topup_validate_amount

__all__ = ["credit_grant", "topup_checkout_start", "topup_validate_amount"]
