"""What a cluster holds: rate × GPUs per replica × replicas × hours (plus each replica's
disk), at the prices of the machines it would be placed on now."""

from __future__ import annotations

from dataclasses import dataclass

from marketplace.deployments.conditions import matching_offers
from marketplace.models import Deployment
from marketplace.services.pricing import quote_at


@dataclass(frozen=True)
class ClusterQuote:
    price_per_gpu_hour: (
        int | None
    )  # micro-dollars: the highest of the machines picked; None: no machine
    hold: int  # micro-dollars for every replica, the whole duration
    placeable: int  # how many replicas fit on the machines listed now


def cluster_quote(
    *, gpu_names: list[str], gpus_per_replica: int, replicas: int, disk_gb: int, hours: float
) -> ClusterQuote:
    """The cheapest way to place ``replicas`` now: each replica on the cheapest machine with
    room left (the placement may spread them over dearer ones; each replica's own hold is
    then its machine's rate)."""
    probe = Deployment(gpu_names=gpu_names, gpus_per_replica=gpus_per_replica, disk_gb=disk_gb)
    offers = matching_offers(probe).order_by("price_per_gpu_hour", "pk")
    hold, placed, highest = 0, 0, None
    for offer in offers.values("price_per_gpu_hour", "storage_cost", "num_gpus"):
        fits = offer["num_gpus"] // gpus_per_replica
        take = min(fits, replicas - placed)
        if take <= 0:
            continue
        one = quote_at(
            price_per_gpu_hour=offer["price_per_gpu_hour"],
            storage_price_per_gb_month=offer["storage_cost"],
            gpu_count=gpus_per_replica,
            disk_gb=disk_gb,
            hours=hours,
        )
        hold += one.total * take
        placed += take
        highest = offer["price_per_gpu_hour"]
        if placed == replicas:
            break
    return ClusterQuote(price_per_gpu_hour=highest, hold=hold, placeable=placed)
