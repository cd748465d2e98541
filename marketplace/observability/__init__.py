"""Seeing inside the running marketplace (issue 17).

- ``probes``: ``/healthz`` (alive) and ``/readyz`` (database, Redis, broker).
- ``metrics``: ``/metrics`` for a web process, for a bearer token or staff only.
- ``gauges``: the domain read at scrape time; ``ledger_check``: the cached ledger gauge (the check itself is
  ``billing.selectors.ledger_problems``).
- ``task_metrics``: Celery task counts and durations, and the per-node worker exporter.
- ``logs``: structured logs (structlog) and the ids that follow a rental across processes.
- ``views``: the staff-only operator page.
"""
