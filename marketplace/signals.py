"""Signals marketplace's account services send to the parts of marketplace built on them.

Why they exist: accounts are below clusters (a cluster's team, its keys' creators), so
accounts cannot call the cluster gateway; they say what happened and the gateway's routes
listen (marketplace/clusters/routes.py).
"""

from __future__ import annotations

from django.dispatch import Signal

# Someone lost a way in: a member removed or gone, an API key revoked. Sent inside the
# transaction that made the change; receivers act on commit.
access_lost = Signal()
