"""Reads for a provider's fleet that join the hosts room and the billing room.

Neither room may import the other, so the provider's console and API ask here: earnings per
machine per day (for a machine's chart) and the fleet summary of the machines list. Every
function takes the acting team and scopes its queries through ``marketplace.tenancy``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import date, timedelta

from django.utils import timezone

from billing.models import Entry
from billing.selectors import EarningsRow, earnings_by_day, earnings_by_machine
from hosts.models import Gpu, Machine, MachineStatus
from marketplace.models import Team
from marketplace.tenancy import team_objects

EARNINGS_DAYS = 30


def machine_reference(machine_id: int) -> str:
    """How billing names a machine on a charge (marketplace.rentals.renting sets it)."""
    return f"machine:{machine_id}"


def _earnings_entries(team: Team):
    return team_objects(team, Entry.objects.all())


def machine_earnings_by_day(
    team: Team, machine: Machine, *, days: int = EARNINGS_DAYS, today: date | None = None
) -> list[EarningsRow]:
    """Gross charges, platform fee and net per day for the last ``days`` days (oldest first,
    days without charges as zeros), from the team's own ledger."""
    today = today or timezone.localdate()
    first = today - timedelta(days=days - 1)
    entries = _earnings_entries(team).filter(
        transfer__machine_reference=machine_reference(machine.pk)
    )
    found = {row.key: row for row in earnings_by_day(entries, since=first)}
    return [
        found.get(day) or EarningsRow(day, 0, 0, 0)
        for day in (first + timedelta(days=n) for n in range(days))
    ]


@dataclass(frozen=True)
class FleetSummary:
    machines: int
    by_status: dict[str, int]  # status value → machines, every status present
    gpus: int
    gpus_by_state: dict[str, int]  # free, rented, offline, missing
    month_start: date
    earnings: EarningsRow  # this month, all machines
    earnings_by_machine: dict[int, EarningsRow]  # this month, per machine id

    @property
    def attention(self) -> int:
        return sum(
            self.by_status[status]
            for status in (
                MachineStatus.OFFLINE,
                MachineStatus.DEGRADED,
                MachineStatus.KEY_MISMATCH,
                MachineStatus.ERROR,
            )
        )

    @property
    def utilization(self) -> float:
        present = self.gpus - self.gpus_by_state["missing"]
        return self.gpus_by_state["rented"] / present if present else 0.0


def fleet_summary(
    team: Team, machines: list[Machine], grid: dict[int, list[tuple[Gpu, str]]]
) -> FleetSummary:
    """Status counts, GPU states (from ``hosts.selectors.gpu_occupancy``'s grid) and this
    month's earnings: one query for the earnings, whatever the number of machines."""
    statuses = Counter(machine.status for machine in machines)
    states = Counter(state for cells in grid.values() for _, state in cells)
    month_start = timezone.localdate().replace(day=1)
    rows = earnings_by_machine(_earnings_entries(team), since=month_start)
    by_reference = {row.key: row for row in rows}
    per_machine = {
        machine.pk: by_reference.get(machine_reference(machine.pk))
        or EarningsRow(machine_reference(machine.pk), 0, 0, 0)
        for machine in machines
    }
    return FleetSummary(
        machines=len(machines),
        by_status={status.value: statuses.get(status.value, 0) for status in MachineStatus},
        gpus=sum(len(cells) for cells in grid.values()),
        gpus_by_state={s: states.get(s, 0) for s in ("free", "rented", "offline", "missing")},
        month_start=month_start,
        earnings=EarningsRow(
            "month",
            sum(row.gross for row in rows),
            sum(row.fee for row in rows),
            sum(row.net for row in rows),
        ),
        earnings_by_machine=per_machine,
    )
