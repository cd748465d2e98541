"""Verified machines: ``rules`` decides from a self-test, a benchmark and reliability;
``services`` runs, records and schedules it, and takes an operator's revoke or restore."""
