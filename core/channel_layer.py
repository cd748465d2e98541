"""The Redis channel layer, able to tell in one round trip which groups anyone listens to.

channels_redis's ``group_send`` spends two round trips to Redis on a group before it knows
whether any socket is in it (clear the expired members, read the rest), and most groups an
event goes to have none: a team whose console nobody has open, an instance page nobody
watches. A rent sends two such events (the renter's team, the provider's), so under load these
empty sends took a tenth of a web process's CPU (py-spy under bench/rent_throughput.py,
2026-12-07). ``groups_listened`` asks for all of a batch's groups at once, and the publisher
(core/events.py) sends only to those: through ``group_send``, unchanged.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable

from channels_redis.core import RedisChannelLayer as ChannelsRedisLayer


class RedisChannelLayer(ChannelsRedisLayer):  # type: ignore[misc]  # an untyped library
    async def groups_listened(self, groups: Iterable[str]) -> set[str]:
        """Those of ``groups`` with a member that has not expired: one pipelined round trip
        per Redis host. A socket that joins after this look misses the event, as it would
        after ``group_send``'s own look; its page reloads state when it connects."""
        by_host: dict[int, list[str]] = defaultdict(list)
        for group in groups:
            by_host[self.consistent_hash(group)].append(group)
        oldest_alive = int(time.time()) - self.group_expiry
        listened: set[str] = set()
        for host, names in by_host.items():
            pipe = self.connection(host).pipeline(transaction=False)
            for name in names:
                # As group_send reads members: those added since the expiry's cut-off.
                pipe.zcount(self._group_key(name), f"({oldest_alive}", "+inf")
            counts = await pipe.execute()
            listened.update(name for name, count in zip(names, counts, strict=True) if count)
        return listened
