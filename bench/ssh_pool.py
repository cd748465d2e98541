"""A command on a pooled SSH connection vs on a fresh connection, on a simulated host; and the
same command while the machine's whole stream budget is taken by long streams (log follows,
pulls), which must not starve it.

Budget (DESIGN.md): pooled ≤ 50 ms and ≥ 5× faster than a fresh connection.

    .venv/bin/python bench/ssh_pool.py
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("DATABASE_URL", "postgres://gpumkt:gpumkt@127.0.0.1:5432/gpumkt_bench_ssh")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.settings")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6391/15")

from bench_common import budget_row, scratch_database, simulated_machine  # noqa: E402

RUNS = 50


def main() -> None:
    with scratch_database(), simulated_machine(gpus=1) as machine:
        from hosts import ssh

        argv = ["docker", "info", "--format", "{{.ServerVersion}}"]
        ssh.pool.run(machine, argv)  # the pool's one connect
        pooled = []
        for _ in range(RUNS):
            started = time.perf_counter()
            ssh.pool.run(machine, ["true"])
            pooled.append((time.perf_counter() - started) * 1000)
        fresh = []
        for _ in range(RUNS // 5):
            started = time.perf_counter()
            connection = ssh.Connection(
                address=machine.address, port=machine.port, user=machine.ssh_user,
                team_id=machine.team_id, key_type=machine.host_key_type,
                key_base64=machine.host_key,
            )  # fmt: skip
            connection.run(["true"])
            connection.close()
            fresh.append((time.perf_counter() - started) * 1000)
        busy = _beside_streams(ssh, machine)
    p, f = statistics.median(pooled), statistics.median(fresh)
    print(f"SSH command (`true`), median of {RUNS} pooled / {RUNS // 5} fresh connections:")
    print(f"  pooled {p:6.2f} ms   budget ≤ 50 ms   ratio {p / 50:.2f}")
    print(
        f"  fresh  {f:6.2f} ms   pooled is {f / p:.1f}× faster   budget ≥ 5×   ratio {(f / p) / 5:.2f}"
    )
    b = statistics.median(busy)
    print(
        f"  pooled beside {ssh.MAX_STREAMS_PER_HOST} open streams {b:6.2f} ms   budget ≤ 50 ms   ratio {b / 50:.2f}"
    )
    within = max(p, b) <= 50 and f / p >= 5
    budget_row(
        "ssh_pool.py", budget="pooled command ≤ 50 ms (also beside open streams), ≥ 5× faster than fresh",
        figure=f"{p:.1f} ms; beside streams {b:.1f} ms; {f / p:.0f}× faster",
        floor=f"fresh connection {f:.1f} ms", ratio=max(p, b) / 50, within=within,
    )  # fmt: skip
    print("  within budget" if within else "  OVER BUDGET")
    if not within:
        sys.exit(1)


def _beside_streams(ssh, machine) -> list[float]:
    """`true` timings while every stream session of the machine is held open."""
    opened = threading.Barrier(ssh.MAX_STREAMS_PER_HOST + 1)
    stop = threading.Event()

    def follow() -> None:
        lines = ssh.pool.stream(machine, ["sh", "-c", "echo open; exec sleep 60"], timeout=90)
        next(lines)
        opened.wait()
        stop.wait()
        lines.close()

    followers = [threading.Thread(target=follow) for _ in range(ssh.MAX_STREAMS_PER_HOST)]
    for follower in followers:
        follower.start()
    opened.wait()
    timings = []
    for _ in range(RUNS):
        started = time.perf_counter()
        ssh.pool.run(machine, ["true"])
        timings.append((time.perf_counter() - started) * 1000)
    stop.set()
    for follower in followers:
        follower.join()
    return timings


if __name__ == "__main__":
    main()
