"""The machinery below every app: database bulk writes, group commit, the one-hop ASGI handler,
the event publisher and the per-process socket fan-out.

Why a package of its own: these are infrastructure, not billing or marketplace, and any app
may need them (scheduler's bulk writes as much as billing's). So ``core`` imports no app
(tests/hosts/test_module_boundaries.py checks it); what writes an app's own rows or names its
own groups stays in that app and calls down into here.
"""
