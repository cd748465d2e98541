"""Autoscaling: a cluster with ``min_replicas``, ``max_replicas`` and a target of requests
per second per replica runs ceil(rate / target) replicas, within its bounds (the way Knative
and dstack scale on request rate).

The rate is what the gateway let through (``traffic``): the mean of the last
``CLUSTER_SCALE_UP_WINDOW`` seconds to grow, the highest second of the last
``CLUSTER_SCALE_DOWN_WINDOW`` to shrink, so a burst grows a cluster at once and a lull must
last before it shrinks (no flapping). Scaling is ``cluster_scale``: the same holds and
releases as a team's own scale.
"""

from __future__ import annotations

import math

from django.conf import settings

from marketplace.clusters import traffic
from marketplace.clusters.services import cluster_scale
from marketplace.models import Cluster
from marketplace.models.clusters import ClusterState


def wanted_replicas(cluster: Cluster) -> int:
    up_window = settings.CLUSTER_SCALE_UP_WINDOW
    down_window = settings.CLUSTER_SCALE_DOWN_WINDOW
    counts = traffic.per_second(cluster.pk, max(up_window, down_window))
    recent_mean = sum(counts[-up_window:]) / up_window
    busiest = max(counts[-down_window:], default=0)
    target = cluster.target_rps_per_replica
    grow_to = math.ceil(recent_mean / target)
    keep = math.ceil(busiest / target)
    wanted = cluster.replicas
    if grow_to > cluster.replicas:
        wanted = grow_to
    elif keep < cluster.replicas:
        wanted = keep
    return min(max(wanted, cluster.min_replicas), cluster.max_replicas)


def clusters_autoscale() -> int:
    """One look at every running autoscaled cluster; returns how many were scaled."""
    scaled = 0
    clusters = Cluster.objects.filter(
        state=ClusterState.RUNNING, min_replicas__isnull=False, max_replicas__isnull=False
    ).select_related("deployment")
    for cluster in clusters:
        wanted = wanted_replicas(cluster)
        if wanted != cluster.replicas:
            cluster_scale(cluster=cluster, replicas=wanted)
            scaled += 1
    return scaled
