"""The Redis channel layer, able to tell in one round trip which groups anyone listens to.

channels_redis's ``group_send`` spends two round trips to Redis on a group before it knows
whether any socket is in it (clear the expired members, read the rest), and most groups an
event goes to have none: a team whose console nobody has open, an instance page nobody
watches. A rent sends two such events (the renter's team, the provider's), so under load these
empty sends took a tenth of a web process's CPU (py-spy under bench/rent_throughput.py,
2026-12-07). ``groups_listened`` asks for all of a batch's groups at once, and the publisher
(core/events.py) sends only to those: through ``group_send``, unchanged.

``groups_listened_now`` asks the same from a thread outside any event loop, before an event
whose data costs a query is made at all (a team's balances after a rent).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import redis
from channels_redis.core import RedisChannelLayer as ChannelsRedisLayer

logger = logging.getLogger(__name__)


class RedisChannelLayer(ChannelsRedisLayer):  # type: ignore[misc]  # an untyped library
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plain_clients: dict[int, redis.Redis | None] = {}  # by host: groups_listened_now's
        self._plain_lock = threading.Lock()

    async def groups_listened(self, groups: Iterable[str]) -> set[str]:
        """Those of ``groups`` with a member that has not expired: one pipelined round trip
        per Redis host. A socket that joins after this look misses the event, as it would
        after ``group_send``'s own look; its page reloads state when it connects."""
        listened: set[str] = set()
        for host, names in self._by_host(groups).items():
            pipe = self.connection(host).pipeline(transaction=False)
            self._count_members(pipe, names)
            counts = await pipe.execute()
            listened.update(name for name, count in zip(names, counts, strict=True) if count)
        return listened

    def groups_listened_now(self, groups: Iterable[str]) -> set[str]:
        """``groups_listened`` from a thread outside any event loop, through a plain Redis
        client per host that the process keeps. Where it cannot tell (a host given other than
        by address, Redis not answering) every group counts as listened: the caller then
        makes its event, and the publisher looks again."""
        listened: set[str] = set()
        for host, names in self._by_host(groups).items():
            client = self._plain_client(host)
            if client is None:
                listened.update(names)
                continue
            pipe = client.pipeline(transaction=False)
            self._count_members(pipe, names)
            try:
                counts: list[int] = pipe.execute()  # type: ignore[no-untyped-call]
            except redis.RedisError:
                logger.warning("could not tell which groups are listened to (Redis)")
                listened.update(names)
                continue
            listened.update(name for name, count in zip(names, counts, strict=True) if count)
        return listened

    def _by_host(self, groups: Iterable[str]) -> dict[int, list[str]]:
        by_host: dict[int, list[str]] = defaultdict(list)
        for group in groups:
            by_host[self.consistent_hash(group)].append(group)
        return by_host

    def _count_members(self, pipe: Any, names: list[str]) -> None:
        """As group_send reads members: those added since the expiry's cut-off."""
        oldest_alive = int(time.time()) - self.group_expiry
        for name in names:
            pipe.zcount(self._group_key(name), f"({oldest_alive}", "+inf")

    def _plain_client(self, host: int) -> redis.Redis | None:
        """A plain client of the host, made at the first look (None for a host given other than
        by address: sentinels)."""
        with self._plain_lock:
            if host not in self._plain_clients:
                config = dict(self.hosts[host])
                address = config.pop("address", None)
                self._plain_clients[host] = (
                    None if address is None else redis.Redis.from_url(address, **config)
                )
            return self._plain_clients[host]
