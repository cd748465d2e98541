"""Seeing inside the running marketplace: health, readiness, metrics and structured logs
(issue 17)."""
