"""Autoscaling (placeholder until the gateway's request rates are read): nothing scaled."""

from __future__ import annotations


def clusters_autoscale() -> int:
    return 0
