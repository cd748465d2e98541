"""An invoice as its page and PDF show it: one row per rental, saying what was rented (the GPU
model and count, the machine's name), its GPU-hours at its rate, and what it cost, in cents;
the rows add up to the total shown under them.

Billing's invoice (``billing.selectors.invoice_for_month``, which the API serves) has a line
per rental per usage kind, each with the number of charges behind it. A metering sweep's
charge covers GPU time and storage at once, so it counts on both lines: the page's charges
column once added to 11 under a total of 8. The page lists amounts only, one row per rental.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal

from billing.models import UsageKind
from billing.selectors import Invoice
from billing.usd import MICRO_PER_CENT, to_cents
from marketplace.models import Team
from marketplace.money_names import RentalName, rental_names


@dataclass
class InvoiceRow:
    reference: str
    rental: RentalName | None
    first_at: datetime
    last_at: datetime
    parts: dict[str, int] = field(default_factory=dict)  # usage kind ("" other) → amount

    @property
    def amount(self) -> int:
        return sum(self.parts.values())

    @property
    def gpu(self) -> int:
        return self.parts.get(UsageKind.GPU, 0)

    @property
    def storage(self) -> int:
        return self.parts.get(UsageKind.STORAGE, 0)

    @property
    def gpu_hours(self) -> str:
        """GPU-hours charged: the GPU time charged at the rental's rate per GPU-hour."""
        if not self.rental or not self.rental.price_per_gpu_hour or not self.gpu:
            return ""
        hours = Decimal(self.gpu) / Decimal(self.rental.price_per_gpu_hour)
        return str(hours.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


@dataclass(frozen=True)
class InvoicePage:
    invoice: Invoice
    rows: list[InvoiceRow]

    @property
    def rounding(self) -> int:
        """What rounding each row to the cent left between the rows and the total (in
        micro-dollars, whole cents): shown as its own row, so the column adds up."""
        rows = sum(to_cents(row.amount) for row in self.rows)
        return (to_cents(self.invoice.total) - rows) * MICRO_PER_CENT


def invoice_page(team: Team, invoice: Invoice) -> InvoicePage:
    rows: dict[str, InvoiceRow] = {}
    names = rental_names(team, (line.reference for line in invoice.lines))
    for line in invoice.lines:
        row = rows.get(line.reference)
        if row is None:
            row = rows[line.reference] = InvoiceRow(
                line.reference, names.get(line.reference), line.first_at, line.last_at
            )
        row.parts[line.usage_kind] = row.parts.get(line.usage_kind, 0) + line.amount
        row.first_at = min(row.first_at, line.first_at)
        row.last_at = max(row.last_at, line.last_at)
    return InvoicePage(invoice, sorted(rows.values(), key=lambda row: row.first_at))
