"""Start simulated hosts (real sshd + real Docker, stand-in nvidia-smi) and keep them running.

    manage.py simhosts --count 3 [--authorize PUBKEY_FILE]

Writes ``<dir>/hosts.json`` describing each host (address, port, host key fingerprint, GPUs)
once every host is up, and stops every sshd it started on Ctrl-C. The file of an earlier run
is removed first and the new one appears whole (written aside, then renamed), so whoever
waits for it (``scripts/run.sh``, then ``demo_data``) never reads a stale or half-written one.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

# A small fleet with different shapes, so search and placement have something to choose from.
FLEET = [
    ("sim-rtx4090", "NVIDIA GeForce RTX 4090", 24564, 4),
    ("sim-a100", "NVIDIA A100-SXM4-80GB", 81920, 8),
    ("sim-rtx3090", "NVIDIA GeForce RTX 3090", 24576, 2),
]


class Command(BaseCommand):
    help = "Start simulated GPU hosts on loopback addresses (needs root, sshd and dockerd)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--count", type=int, default=3)
        parser.add_argument("--dir", default=str(settings.VAR_DIR / "simhosts"))
        parser.add_argument("--base-port", type=int, default=2201)
        parser.add_argument("--authorize", action="append", default=[], metavar="PUBKEY_FILE")
        parser.add_argument("--detach", action="store_true", help="Start and return.")
        parser.add_argument(
            "--disk-enforced",
            type=int,
            default=1,
            metavar="N",
            help="The first N hosts use a second Docker Engine (btrfs) that caps a rental's "
            "disk; skipped with a warning where it cannot start (needs root, btrfs-progs).",
        )

    def handle(
        self,
        *args,
        count: int,
        dir: str,
        base_port: int,
        authorize,
        detach,
        disk_enforced,
        **options,
    ):
        # Development tooling, imported only when the command runs (see hosts.devtools).
        from hosts.devtools.sim_docker import (
            DOCKER_SOCKET,
            SSH_IMAGE,
            ensure_dockerd,
            ensure_gpu_bench_image,
            ensure_image,
            ensure_quota_dockerd,
            ensure_ssh_image,
        )
        from hosts.devtools.simulation import SimHostSpec, create_host, default_gpus

        root = Path(dir)
        listing = root / "hosts.json"
        listing.unlink(missing_ok=True)
        ensure_dockerd(log_path=settings.VAR_DIR / "dockerd.log")
        ensure_image()
        ensure_ssh_image()  # so SSH launch mode has an image with sshd to try
        ensure_gpu_bench_image()  # the stand-in GPU benchmark verification runs
        quota_engine = None
        if disk_enforced > 0:
            try:
                quota_engine = ensure_quota_dockerd(log_path=settings.VAR_DIR / "dockerd-quota.log")
                ensure_image(docker_host=quota_engine)
                ensure_image(SSH_IMAGE, docker_host=quota_engine)
                ensure_gpu_bench_image(docker_host=quota_engine)
            except (RuntimeError, OSError, subprocess.CalledProcessError) as error:
                self.stderr.write(f"no enforced-disk host: {error}")
                quota_engine = None
        keys = [Path(path).read_text().strip() for path in authorize]
        hosts = []
        for i in range(count):
            name, gpu_name, memory, gpus = FLEET[i % len(FLEET)]
            spec = SimHostSpec(
                name=name if i < len(FLEET) else f"{name}-{i}",
                address=f"127.0.0.{10 + i}",
                port=base_port + i,
                gpus=default_gpus(gpus, name=gpu_name, memory_mib=memory),
                port_range=(20000 + 1000 * i, 20999 + 1000 * i),  # below the ephemeral range
                docker_host=quota_engine if quota_engine and i < disk_enforced else DOCKER_SOCKET,
            )
            hosts.append(create_host(root / spec.name, spec, keys))
        staged = listing.with_suffix(".json.tmp")
        staged.write_text(json.dumps([h.to_dict() for h in hosts], indent=2))
        staged.replace(listing)
        for host in hosts:
            self.stdout.write(
                f"  {host.spec.name:<14} root@{host.address} -p {host.port}  "
                f"{len(host.spec.gpus)}× {host.spec.gpus[0].name}  {host.host_key_fingerprint}"
            )
        if detach:
            return
        stopping = False

        def stop(*_):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        while not stopping:
            time.sleep(0.5)
        for host in hosts:
            host.stop()
