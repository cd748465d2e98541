"""A deployment's conditions against the offers read model: which machines may run a replica,
the placement snapshot over them, and, when none fits, why in words."""

from __future__ import annotations

import hashlib
import json
import re

from django.db.models import Max, Min, Q, QuerySet

from billing.usd import format_usd
from hosts.models import MachineStatus
from marketplace.models import Deployment, Offer
from marketplace.models.deployments import PlacementPolicy
from marketplace.models.rentals import machine_offer
from marketplace.services.offers import short_gpu_name
from scheduler.models import Instance
from scheduler.placement import BINPACK, SPREAD, PlacementRequest, gpu_family_matches


def gpu_model(name: str) -> str:
    """A GPU model as offers name it, for comparing: "nvidia geforce rtx_4090" → "RTX 4090"."""
    return short_gpu_name(name.replace("_", " ").strip()).upper()


def _models_filter(deployment: Deployment) -> Q:
    """Any of the named models or their families (``gpu_family_matches``)."""
    q = Q()
    for name in deployment.gpu_names:
        model = gpu_model(name)
        q |= Q(gpu_name__iexact=model)
        q |= Q(gpu_name__istartswith=f"{model}-") | Q(gpu_name__istartswith=f"{model} ")
    return q


def _listed_offers() -> QuerySet[Offer]:
    """Each listed, online machine's offer of all its free GPUs, rentable now or not (a full
    machine still counts when explaining why nothing fits)."""
    return Offer.objects.filter(
        all_free=True, machine__listed=True, machine__status=MachineStatus.ONLINE
    )


def _room_filter(deployment: Deployment) -> Q:
    """Offers with room for one replica: whole GPUs free, or a card with room for its slice
    (the best card's free compute and memory, each a maximum over cards: the planner checks
    one card has both)."""
    size = deployment.gpu_slice
    if size is None:
        gpus = deployment.gpus_per_replica
        return Q(num_gpus__gte=gpus, min_gpus__lte=gpus)
    return Q(
        sharing=True,
        slice_core_percent__gte=size.core_percent,
        slice_memory_mb__gte=size.memory_mb,
        min_slice_core_percent__lte=size.core_percent,
    )


def matching_offers(deployment: Deployment) -> QuerySet[Offer]:
    """Machines' offers of all their free GPUs with room for one replica that meet every
    condition. A price cap is per GPU-hour, so it holds for any bundle of the machine."""
    offers = Offer.objects.filter(
        _models_filter(deployment),
        _room_filter(deployment),
        all_free=True,
        rentable=True,
        reliability__gte=deployment.min_reliability,
        disk_per_unit__gte=_disk_per_unit(deployment),
    )
    if deployment.max_price_per_gpu_hour is not None:
        offers = offers.filter(price_per_gpu_hour__lte=deployment.max_price_per_gpu_hour)
    if deployment.regions:
        offers = offers.filter(geolocation__in=deployment.regions)
    return offers


def placement_request(deployment: Deployment, *, avoid: set[int]) -> PlacementRequest:
    """A replica's request to the placement engine: its size, every condition (a snapshot of
    the whole fleet is shared by many deployments' passes) and the policy; ``avoid`` is where
    the deployment's replicas already are (spread places elsewhere while it can)."""
    return PlacementRequest(
        gpu_count=deployment.gpus_per_replica,
        gpu_names=frozenset(gpu_model(name) for name in deployment.gpu_names) or None,
        max_price_per_gpu_hour=deployment.max_price_per_gpu_hour,
        min_reliability=deployment.min_reliability,
        regions=frozenset(deployment.regions) or None,
        policy=BINPACK if deployment.policy == PlacementPolicy.BINPACK else SPREAD,
        avoid_machine_ids=frozenset(avoid)
        if deployment.policy == PlacementPolicy.SPREAD
        else frozenset(),
        min_disk_per_gpu_gb=_disk_per_unit(deployment),
        gpu_slice=deployment.gpu_slice,
        card_policy=deployment.card_policy,
    )


def _disk_per_unit(deployment: Deployment) -> float:
    """The disk a replica needs of one unit's share: a slice gets its fraction of one unit,
    which renting checks on the card; here a unit must at least hold the disk whole."""
    if deployment.gpu_slice is not None:
        return float(deployment.disk_gb)
    return deployment.disk_gb / deployment.gpus_per_replica


def instance_meets_conditions(deployment: Deployment, instance: Instance) -> bool:
    """Whether a placed replica still meets its deployment's conditions (after a change): the
    rental's terms and machine. A replica that does not is replaced at once.

    Reliability is a condition of placing only: it moves with every heartbeat, and a dip must
    not restart running replicas."""
    rental = instance.rental
    machine = instance.machine
    model = _machine_model(machine)
    size = deployment.gpu_slice
    same_size = (
        instance.gpu_count == deployment.gpus_per_replica and not instance.is_slice
        if size is None
        else (instance.slice_core_percent, instance.slice_memory_mb)
        == (size.core_percent, size.memory_mb)
    )
    return (
        same_size
        and (
            not deployment.gpu_names
            or any(gpu_family_matches(gpu_model(n), model) for n in deployment.gpu_names)
        )
        and (
            deployment.max_price_per_gpu_hour is None
            or rental.price_per_gpu_hour <= deployment.max_price_per_gpu_hour
        )
        and (not deployment.regions or machine.location in deployment.regions)
    )


def _machine_model(machine) -> str:
    """The machine's GPU model: its offer's, when the offer was read with it (the
    reconciler's reads join it), else its first present GPU's."""
    offer = machine_offer(machine)
    if offer is not None and offer.gpu_name:
        return gpu_model(offer.gpu_name)
    first_gpu = machine.gpus.filter(present=True).order_by("index").first()
    return gpu_model(first_gpu.name) if first_gpu else ""


# What a replica's container runs: a change to any of these rolls a replica set (a new replica
# runs before an old one stops) and replaces a job's replicas.
SPEC_FIELDS = ("image", "launch_mode", "entrypoint", "args", "env", "ports", "disk_gb")


def spec_hash(deployment: Deployment) -> str:
    """A fingerprint of the container spec, recorded on each replica as it is placed."""
    spec = {name: getattr(deployment, name) for name in SPEC_FIELDS}
    encoded = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(encoded.encode()).hexdigest()


def replica_runs_spec(deployment: Deployment, replica, current_hash: str) -> bool:
    """Whether a placed replica runs the deployment's current spec. Replicas placed before
    replicas recorded their spec are compared by their instance (the ports are not: an
    instance keeps only their host-side allocations)."""
    if replica.spec_hash:
        return replica.spec_hash == current_hash
    instance = replica.instance
    return (
        instance.image == deployment.image
        and instance.launch_mode == deployment.launch_mode
        and instance.entrypoint == deployment.entrypoint
        and list(instance.args) == list(deployment.args)
        and dict(instance.env) == dict(deployment.env)
        and instance.disk_gb == deployment.disk_gb
    )


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def wanted_text(deployment: Deployment) -> str:
    """ "RTX 4090 with 4 free GPUs under $1.50/GPU-hour in US" """
    models = " or ".join(gpu_model(n) for n in deployment.gpu_names) or "machine"
    size = deployment.gpu_slice
    if size is None:
        text = f"{models} with {_plural(deployment.gpus_per_replica, 'free GPU')}"
    else:
        text = f"{models} sharing a card with {size.core_percent}% and {size.memory_mb} MB free"
    if deployment.max_price_per_gpu_hour is not None:
        text += f" under {format_usd(deployment.max_price_per_gpu_hour)}/GPU-hour"
    if deployment.regions:
        text += f" in {', '.join(deployment.regions)}"
    if deployment.min_reliability > 0:
        text += f" at reliability ≥ {deployment.min_reliability:g}"
    return text


def queue_reason(deployment: Deployment) -> str:
    """Why no machine takes a replica now, narrowing the listed machines condition by
    condition and naming the first one that leaves none."""
    gpus = deployment.gpus_per_replica
    models = " or ".join(gpu_model(n) for n in deployment.gpu_names)
    head = f"no {wanted_text(deployment)}"
    offers = _listed_offers().filter(_models_filter(deployment))
    count = offers.count()
    if count == 0:
        return (
            f"{head}; no listed machine has {models}" if models else f"{head}; no machine is listed"
        )
    having = f"{_plural(count, 'machine')} {'has' if count == 1 else 'have'} {models or 'GPUs'}"
    roomy = offers.filter(_room_filter(deployment))
    if not roomy.exists():
        if deployment.gpu_slice is not None:
            sharing = offers.filter(sharing=True)
            if not sharing.exists():
                return f"{head}; {having} but none shares its cards"
            best = sharing.aggregate(core=Max("slice_core_percent"), mb=Max("slice_memory_mb"))
            return (
                f"{head}; {having} but at most {best['core'] or 0}% and "
                f"{best['mb'] or 0} MB free on one card"
            )
        most = offers.aggregate(most=Max("num_gpus"))["most"] or 0
        return f"{head}; {having} but only {most} free"
    if deployment.max_price_per_gpu_hour is not None:
        cheap = roomy.filter(price_per_gpu_hour__lte=deployment.max_price_per_gpu_hour)
        if not cheap.exists():
            lowest = roomy.aggregate(lowest=Min("price_per_gpu_hour"))["lowest"]
            return f"{head}; {having} with room, but from {format_usd(lowest)}/GPU-hour"
        roomy = cheap
    if deployment.regions:
        local = roomy.filter(geolocation__in=deployment.regions)
        if not local.exists():
            where = sorted({g or "no region" for g in roomy.values_list("geolocation", flat=True)})
            return f"{head}; {having} with room, but in {', '.join(where)}"
        roomy = local
    reliable = roomy.filter(reliability__gte=deployment.min_reliability)
    if not reliable.exists():
        best = roomy.aggregate(best=Max("reliability"))["best"]
        return f"{head}; {having} with room, but reliability at most {best:.3f}"
    if not reliable.filter(disk_per_unit__gte=_disk_per_unit(deployment)).exists():
        return (
            f"{head}; {having} with room, but none with {deployment.disk_gb} GB of disk "
            f"for {_plural(gpus, 'GPU')}"
        )
    return f"{head}; the matching machines were taken meanwhile"


def disk_that_fits(wanted_gb: int, *, gpus: int = 1) -> int:
    """A form's default disk: ``wanted_gb``, or less when no listed machine gives a replica
    of ``gpus`` GPUs that much (a default that matches nothing reads as "no machine fits"
    before the renter typed anything); at least 1 GB."""
    largest = _listed_offers().aggregate(most=Max("disk_per_unit"))["most"]
    if largest is None:
        return wanted_gb
    return max(1, min(wanted_gb, int(largest * gpus)))


def listed_gpu_models() -> list[str]:
    """The GPU models listed machines offer, and their families ("A100" beside
    "A100-SXM4-80GB"): the choices a form shows for its GPU models."""
    names = set(_listed_offers().values_list("gpu_name", flat=True).distinct())
    families = {re.split(r"[- ]", name, maxsplit=1)[0] for name in names if "-" in name}
    return sorted(names | families)
