"""A team event reaching 1,000 browser sockets split over 2 web processes.

Two web processes are started from the production recipe's unit (deploy/, uvicorn), on a
scratch PostgreSQL database and a private Redis. Client processes open the console's
``/ws/events/`` socket as one signed-in member of one team, half on each web process; then
the bench sends the team's group an event (``group_send``, as a committed change does) and
every client records when it arrived (CLOCK_MONOTONIC is one clock for all processes).
The clients share the machine's cores with the web processes, so each reads its sockets as
cheaply as it can (uvloop, websockets' sans-I/O protocol on the transport, the time taken
as the bytes come in): what they cost is not the server's.

Budget (DESIGN.md): p99 ≤ 50 ms from send to arrival, none dropped.

    .venv/bin/python bench/websocket_fanout.py [--sockets 1000] [--events 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

from websockets.client import ClientProtocol
from websockets.extensions.permessage_deflate import enable_client_permessage_deflate
from websockets.frames import Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_common import (  # noqa: E402
    budget_row,
    private_redis,
    scratch_database,
    web_bench_environment,
    web_processes,
)

REDIS = web_bench_environment("fanout")

BUDGET_P99_MS = 50
CLIENT_PROCESSES = 4


def client(urls: list[str], cookie: str, events: int, ready, go, out) -> None:
    """Open ``urls``' sockets, report ready, then record each event's arrival per socket."""
    import uvloop

    async def run() -> None:
        loop = asyncio.get_running_loop()
        sockets: list[BrowserSocket] = []
        for start in range(0, len(urls), 50):
            batch = [BrowserSocket(url, cookie, events) for url in urls[start : start + 50]]
            await asyncio.gather(*(socket.open(loop) for socket in batch))
            sockets += batch
        ready.release()
        await loop.run_in_executor(None, go.wait)
        await asyncio.wait([socket.all_arrived for socket in sockets], timeout=events * 2 + 10)
        for socket in sockets:
            socket.close()
        out.put([socket.arrivals for socket in sockets])

    uvloop.run(run())


class BrowserSocket(asyncio.Protocol):
    """One console socket as a browser opens it (cookie, origin, offering permessage-deflate),
    read with websockets' sans-I/O protocol straight from the transport: the client processes
    share the 2 cores with the web processes, so they do no more per frame than parse it."""

    def __init__(self, url: str, cookie: str, events: int) -> None:
        self.uri = parse_uri(url)
        self.protocol = ClientProtocol(
            self.uri,
            # The page's own origin, as a browser on the console sends it (the web processes
            # refuse any other: marketplace/socket_origin.py).
            origin=f"http://{self.uri.host}:{self.uri.port}",
            extensions=enable_client_permessage_deflate(None),
            max_size=None,
        )
        request = self.protocol.connect()
        request.headers["Cookie"] = f"sessionid={cookie}"
        self.protocol.send_request(request)
        self.events = events
        self.arrivals: dict[int, float] = {}
        self.transport: asyncio.Transport | None = None

    async def open(self, loop: asyncio.AbstractEventLoop) -> None:
        self.opened = loop.create_future()
        self.all_arrived = loop.create_future()
        await loop.create_connection(lambda: self, self.uri.host, self.uri.port)
        await self.opened

    def connection_made(self, transport) -> None:
        self.transport = transport
        self._flush()

    def data_received(self, data: bytes) -> None:
        at = time.monotonic()  # before parsing: the client's own work is not counted
        self.protocol.receive_data(data)
        for event in self.protocol.events_received():
            if isinstance(event, Response):
                if event.status_code != 101 and not self.opened.done():
                    self.opened.set_exception(RuntimeError(f"refused: {event.status_code}"))
                elif not self.opened.done():
                    self.opened.set_result(None)
            elif event.opcode is Opcode.TEXT:
                message = json.loads(event.data)
                if message.get("event") != "instance.state" or "n" not in message.get("data", {}):
                    continue  # what the console sends on its own (e.g. the balance)
                self.arrivals[message["data"]["n"]] = at
                if len(self.arrivals) == self.events and not self.all_arrived.done():
                    self.all_arrived.set_result(None)
        self._flush()  # pongs, close frames

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            if data and self.transport is not None and not self.transport.is_closing():
                self.transport.write(data)

    def connection_lost(self, exc) -> None:
        if not self.opened.done():
            self.opened.set_exception(ConnectionError("closed during the handshake"))
        if not self.all_arrived.done():
            self.all_arrived.set_result(None)  # what did not arrive counts as dropped

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.protocol.send_close()
            self._flush()
            self.transport.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sockets", type=int, default=1000)
    parser.add_argument("--events", type=int, default=20)
    with private_redis(REDIS), scratch_database():
        run(parser.parse_args())


def run(args) -> None:
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from deploy.demo_accounts import _user, session_cookie
    from marketplace.events import team_group

    user = _user("fanout")
    team_id = user.memberships.get(team__personal=True).team_id
    cookie = session_cookie(user)
    with web_processes(REDIS) as cluster:
        urls = [
            f"ws://127.0.0.1:{cluster.web_ports[n % 2]}/ws/events/" for n in range(args.sockets)
        ]
        ready, go = multiprocessing.Semaphore(0), multiprocessing.Event()
        out = multiprocessing.Queue()
        clients = [
            multiprocessing.Process(
                target=client, args=(urls[n::CLIENT_PROCESSES], cookie, args.events, ready, go, out)
            )
            for n in range(CLIENT_PROCESSES)
        ]
        opened = time.monotonic()
        for process in clients:
            process.start()
        for _ in clients:
            # A client that could not open its sockets (refused, a web process down) ends
            # without signalling: fail then, instead of waiting for it forever.
            while not ready.acquire(timeout=1):
                dead = [p for p in clients if p.exitcode not in (None, 0)]
                if dead:
                    sys.exit(f"{len(dead)} client process(es) failed opening their sockets")
        print(
            f"{args.sockets} sockets open over 2 web processes in {time.monotonic() - opened:.1f} s"
        )
        go.set()
        time.sleep(1)  # every socket has joined the team's group
        layer = get_channel_layer()
        sent = []
        for number in range(args.events):
            sent.append(time.monotonic())
            async_to_sync(layer.group_send)(
                team_group(team_id),
                {"type": "team.event", "event": "instance.state", "data": {"n": number}},
            )
            time.sleep(0.5)
        arrivals = [socket for _ in clients for socket in out.get(timeout=120)]
        for process in clients:
            process.join(timeout=30)
    latencies = []
    dropped = 0
    for socket in arrivals:
        dropped += args.events - len(socket)
        latencies += [(at - sent[n]) * 1000 for n, at in socket.items()]
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    load = os.getloadavg()[0]
    print(
        f"{args.sockets} sockets, {args.events} events: p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
        f"max {latencies[-1]:.1f} ms; dropped {dropped} (load average {load:.2f})"
    )
    ratio = p99 / BUDGET_P99_MS
    budget_row(
        "websocket_fanout.py", budget=f"{args.sockets:,} sockets: p99 ≤ {BUDGET_P99_MS} ms, none dropped",
        figure=f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, {dropped} dropped", ratio=ratio,
        within=ratio <= 1 and not dropped,
    )  # fmt: skip
    print(f"budget p99 ≤ {BUDGET_P99_MS} ms, none dropped: {ratio:.2f}× the budget")
    if ratio > 1 or dropped:
        sys.exit(1)


if __name__ == "__main__":
    main()
