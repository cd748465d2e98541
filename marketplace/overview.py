"""The Overview: where a team stands, read in one place.

What a renter looks for first (credit, what runs now and what it costs an hour, this month's
spend) and what a provider looks for (machines by status, GPUs rented, this month's earnings),
with the team's deployments and clusters and whether they serve. Read-only: every figure comes
from the selectors the detail pages use, so the Overview never disagrees with them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import date

from django.utils import timezone

from billing import selectors as billing
from billing.models import Entry
from hosts.models import Gpu, Machine, MachineStatus
from hosts.selectors import rented_gpu_ids
from marketplace.deployments.reconciler import replica_counts, wanted_live
from marketplace.models import Deployment, Team
from marketplace.models.deployments import DeploymentState, ReplicaState
from marketplace.services.pricing import quote_at
from marketplace.tenancy import team_objects
from scheduler.models import Instance
from scheduler.services.expiry import LIVE_STATES

SPEND_DAYS = 30  # the spend chart's window


@dataclass(frozen=True)
class Running:
    instances: int
    gpus: int
    per_hour: int  # micro-dollars an hour for their GPUs and disks, at their rentals' prices


@dataclass(frozen=True)
class Service:
    """A deployment or cluster as the Overview lists it."""

    deployment: Deployment
    is_cluster: bool
    desired: int
    running: int
    queued: int

    @property
    def health(self) -> str:
        """ "serving" (all wanted replicas run), "degraded" (some), "down" (none), or the
        deployment's state when it is not active."""
        if self.deployment.state != DeploymentState.ACTIVE:
            return self.deployment.state
        if self.running >= self.desired:
            return "serving"
        return "degraded" if self.running else "down"


@dataclass(frozen=True)
class Hosting:
    machines_by_status: list[tuple[str, int]]  # (label, count), most first
    gpus: int
    gpus_rented: int
    earned_this_month: int  # net, micro-dollars


@dataclass(frozen=True)
class Overview:
    balance: billing.Balance
    running: Running
    spent_this_month: int
    spend_by_day: list[tuple[date, int]]
    services: list[Service]
    hosting: Hosting | None  # None: the team lists no machines


def team_overview(team: Team) -> Overview:
    entries = team_objects(team, Entry.objects.all())
    today = timezone.localdate()
    month_start = today.replace(day=1)
    spend = billing.spend_by_day(entries, since=min(month_start, _days_ago(today, SPEND_DAYS)))
    return Overview(
        balance=billing.team_balance(team.pk),
        running=_running(team),
        spent_this_month=sum(amount for day, amount in spend if day >= month_start),
        spend_by_day=[(day, amount) for day, amount in spend if day > _days_ago(today, SPEND_DAYS)],
        services=_services(team),
        hosting=_hosting(team, entries, month_start),
    )


def _days_ago(today: date, days: int) -> date:
    return date.fromordinal(today.toordinal() - days)


def _running(team: Team) -> Running:
    live = team_objects(team, Instance.objects.filter(state__in=LIVE_STATES)).select_related(
        "rental"
    )
    gpus = per_hour = 0
    for instance in live:
        rental = instance.rental
        gpus += rental.gpu_count
        per_hour += quote_at(
            price_per_gpu_hour=rental.price_per_gpu_hour,
            storage_price_per_gb_month=rental.storage_price_per_gb_month,
            gpu_count=rental.gpu_count,
            disk_gb=rental.disk_gb,
            hours=1,
        ).total
    return Running(instances=len(live), gpus=gpus, per_hour=per_hour)


def _services(team: Team) -> list[Service]:
    deployments = team_objects(team, Deployment.objects.select_related("cluster")).exclude(
        state=DeploymentState.STOPPED
    )
    services = []
    for deployment in deployments.order_by("-created_at")[:20]:
        counts = replica_counts(deployment)
        services.append(
            Service(
                deployment=deployment,
                is_cluster=hasattr(deployment, "cluster"),
                desired=wanted_live(deployment),
                running=counts[ReplicaState.RUNNING] + counts[ReplicaState.PLACED],
                queued=counts[ReplicaState.QUEUED],
            )
        )
    return services


def _hosting(team: Team, entries, month_start: date) -> Hosting | None:
    machines = list(team_objects(team, Machine.objects.all()).only("pk", "status"))
    if not machines:
        return None
    labels = dict(MachineStatus.choices)
    by_status = Counter(labels.get(machine.status, machine.status) for machine in machines)
    ids = [machine.pk for machine in machines]
    earned = billing.earnings_by_machine(entries, since=month_start)
    return Hosting(
        machines_by_status=by_status.most_common(),
        gpus=Gpu.objects.filter(machine_id__in=ids, present=True).count(),
        gpus_rented=len(rented_gpu_ids(ids)),
        earned_this_month=sum(row.net for row in earned),
    )
