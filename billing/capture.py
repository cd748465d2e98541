"""What a hold captures for what its rental owes: the rule that moves money, defined once.

Every path that captures usage applies ``capture_due``: a rental's own capture
(``holds.hold_capture_usage``, one kind at a time) and the metering sweep on SQLite
(``metering._settle_batch``). The metering sweep on PostgreSQL computes the same in SQL
(``pg_settle._PLAN``, for a batch of holds at once); a change to one is a change to the other.
``tests/billing/test_metering.py`` (``test_the_sql_sweep_captures_what_the_python_rule_says``)
holds the two to the micro-dollar on generated rentals.
"""

from __future__ import annotations

from fractions import Fraction
from typing import NamedTuple

from billing.money import percent_of


class Capture(NamedTuple):
    """What one capture takes from a hold (micro-dollars): GPU time, storage, and the platform's
    fee within their sum."""

    gpu: int
    storage: int
    fee: int

    @property
    def amount(self) -> int:
        return self.gpu + self.storage


def capture_due(
    *,
    amount: int,
    captured_gpu: int,
    captured_storage: int,
    released: int,
    owed_gpu: int,
    owed_storage: int,
    percent: Fraction,
) -> Capture:
    """What an open hold of ``amount`` (of which ``captured_gpu``, ``captured_storage`` and
    ``released`` are spent) captures now, when its rental owes ``owed_gpu`` and ``owed_storage``
    so far; ``percent`` is the platform's fee.

    The rule:

    * What is owed is cumulative per kind: rate × the clock's cumulative seconds, rounded once
      (half up), plus what was banked at earlier prices (``marketplace.rentals.metering.
      rental_owed``). GPU time runs while the instance holds its GPUs on a machine in service;
      storage while the contract exists, stopped or not; neither runs past the rental's end.
    * Of each kind only the difference from what was already captured is captured, and never
      less than nothing (an owed total at or below what was captured captures 0): a repeated
      run captures nothing and rounding never accumulates.
    * Never more than the hold still holds (``amount - captured - released``): GPU time first,
      storage from what is left.
    * The fee is ``percent_of`` the hold's cumulative captures after, minus before: its
      rounding never accumulates either.
    """
    remaining = amount - captured_gpu - captured_storage - released
    gpu = max(0, min(owed_gpu - captured_gpu, remaining))
    storage = max(0, min(owed_storage - captured_storage, remaining - gpu))
    before = captured_gpu + captured_storage
    fee = percent_of(before + gpu + storage, percent) - percent_of(before, percent)
    return Capture(gpu, storage, fee)
