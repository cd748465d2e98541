"""Subscribers to the billing room's domain events (signals): push them to consoles, etc."""

from __future__ import annotations
