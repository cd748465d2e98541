"""Domain errors of the billing room.

Each carries ``http_status`` and ``error_code`` so the API renders it in the one error format
(marketplace/api/errors.py) without billing importing DRF; pages show ``str(error)``.
"""

from __future__ import annotations

from billing.usd import format_usd


class BillingError(Exception):
    http_status = 400
    error_code = "billing_error"

    def __init__(self, message: str, *, fields: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.fields = fields or {}


class InvalidAmount(BillingError, ValueError):
    """An amount that is not a whole, positive number of micro-dollars in the allowed range."""

    error_code = "invalid_amount"

    def __init__(self, message: str, *, field: str = "amount"):
        super().__init__(message, fields={field: [message]})


class InsufficientCredit(BillingError):
    http_status = 402
    error_code = "insufficient_credit"

    def __init__(self, *, needed: int, available: int):
        super().__init__(
            f"Not enough credit: this needs {format_usd(needed)} and "
            f"{format_usd(available)} is available. Top up to continue."
        )
        self.needed = needed
        self.available = available


class HoldNotFound(BillingError):
    http_status = 404
    error_code = "not_found"


class HoldClosed(BillingError):
    """The hold was already released or voided; it takes no more captures or extensions."""

    http_status = 409
    error_code = "hold_closed"


class HoldCaptured(BillingError):
    """A hold with captures cannot be voided (release it instead)."""

    http_status = 409
    error_code = "hold_captured"


class IdempotencyConflict(BillingError):
    """The idempotency key was already used for a different operation."""

    http_status = 409
    error_code = "idempotency_conflict"


class PaymentsUnavailable(BillingError):
    http_status = 503
    error_code = "payments_unavailable"


class PaymentProviderError(BillingError):
    http_status = 502
    error_code = "payment_provider_error"


class InsufficientEarnings(BillingError):
    http_status = 409
    error_code = "insufficient_earnings"


class LedgerError(BillingError):
    """A transfer that would break the ledger's rules (a bug in the caller, never user input)."""

    http_status = 500
    error_code = "ledger_error"


class PayoutConflict(BillingError):
    """A payout request that cannot be made or decided now: one is already waiting, or it
    was already decided the other way."""

    http_status = 409
    error_code = "payout_conflict"


class PayoutNotFound(BillingError):
    """No payout request of this id in the team (another team's is not found either)."""

    http_status = 404
    error_code = "not_found"
