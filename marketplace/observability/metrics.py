"""``/metrics``: this web process's metrics in Prometheus's text format.

What it holds:

- requests by route (the URL pattern's name, never the raw path) and status, with latency
  histograms: django-prometheus's middleware (first and last in ``MIDDLEWARE``);
- Celery tasks this process ran (eagerly; workers serve their own, see task_metrics.py);
- the domain, read at scrape time (gauges.py): machines by status, GPUs rented and free,
  instances by state, queued replicas, held credit, the ledger check, Celery queue lengths;
- prometheus_client's process and Python figures.

Each web process is its own scrape target. Under a server that forks several workers of one
app (``uvicorn --workers N``), set ``PROMETHEUS_MULTIPROC_DIR`` as for the Celery workers and
this view adds up every process's samples from there.

Not public: the numbers (credit held, fleet size) are the business's. A scraper sends
``Authorization: Bearer <METRICS_TOKEN>``; a signed-in staff user may look in a browser;
anyone else gets the site's ordinary 404, as if there were no such page.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterable, Iterator

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from marketplace.observability.gauges import DomainCollector


def scraper_allowed(request: HttpRequest) -> bool:
    token = settings.METRICS_TOKEN
    scheme, _, offered = request.headers.get("Authorization", "").partition(" ")
    if token and scheme.lower() == "bearer" and offered:
        return hmac.compare_digest(offered.strip().encode(), token.encode())
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated and user.is_staff)


class Scrape:
    """What one scrape reads: the process's registry and the domain, read now."""

    def __init__(self, sources: Iterable):
        self.sources = list(sources)

    def collect(self) -> Iterator[Metric]:
        for source in self.sources:
            yield from source.collect()


def process_registry():
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    return REGISTRY


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not scraper_allowed(request):
        raise Http404
    body = generate_latest(Scrape([process_registry(), DomainCollector()]))
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
