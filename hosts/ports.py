"""Host ports for published container ports, from each machine's configured range.

A port a rental gave back rests before another rental gets it (``PORT_REST``): whatever
still points at it (the cluster gateway's route until its next push, and its memory of the
address having refused connections; a renter's SSH or a client retrying the old address)
must not reach the next tenant's container, or find the new replica counted as down. A
range with nothing else free still hands out its resting ports, the longest rested first:
resting delays reuse, it never refuses a rental.
"""

from __future__ import annotations

from datetime import datetime, timedelta

# Longer than the gateway remembers an address that refused (10 s, scheduler/gateway.py) and
# than a route push and its retries take; long enough that a client of the old address gives
# up before the port serves someone else.
PORT_REST = timedelta(minutes=10)


def pick_free_ports(
    start: int, end: int, used: set[int], count: int, resting: dict[int, datetime] | None = None
) -> list[int]:
    """``count`` ports in ``start..end`` not in ``used`` (fewer if the range is full): the
    lowest of those not ``resting`` (port → when it was given back), then resting ones, the
    longest rested first."""
    if count <= 0:
        return []
    resting = resting or {}
    picked = []
    for port in range(start, end + 1):
        if port not in used and port not in resting:
            picked.append(port)
            if len(picked) == count:
                return picked
    rested = sorted((at, port) for port, at in resting.items() if port not in used)
    picked += [port for at, port in rested if start <= port <= end][: count - len(picked)]
    return picked
