"""Many processes, one truth: two web processes behind Caddy, three Celery workers and beat,
started from the production recipe's units (deploy/), against one PostgreSQL and one Redis of
this module's own (so it may stop and restart them), on two simulated 4-GPU hosts.

One installation serves every test here (module scope, ~30 s to start); each test leaves no
instance behind. Order within the module does not matter.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from websockets.sync.client import connect

from deploy.cluster import LocalCluster, Postgres, Redis
from tests.conftest import sim_container_label

pytestmark = pytest.mark.system

QUICK_STOP = ["-c", "trap 'exit 0' TERM; echo up; while :; do sleep 1; done"]
REFUSALS = {409, 402}


class Installation:
    """A whole installation (``webs`` web processes, ``workers`` workers, beat, Caddy) on a
    PostgreSQL and a Redis of its own, with the simulated ``hosts`` listed by demo accounts.
    ``overrides`` go into its environment file (the fault matrix shortens heartbeats)."""

    def __init__(
        self,
        root: Path,
        hosts: list,
        docker_gate: Path,
        *,
        webs: int = 2,
        workers: int = 3,
        overrides: dict[str, str] | None = None,
    ):
        self.root, self.hosts, self.docker_gate = root, hosts, docker_gate
        self.postgres = Postgres().start()
        self.redis = Redis(root / "redis").start()
        try:
            self._start(root, hosts, webs=webs, workers=workers, overrides=overrides or {})
        except BaseException:
            self.stop()  # nothing this module started outlives a failed start
            raise

    def _start(
        self, root: Path, hosts: list, *, webs: int, workers: int, overrides: dict[str, str]
    ) -> None:
        self.cluster = LocalCluster(
            root / "cluster",
            database_url=self.postgres.url,
            redis_url=self.redis.url,
            webs=webs,
            workers=workers,
            worker_concurrency=2,
            overrides={
                "HOST_ALLOW_LOOPBACK": "1",
                "HOST_SELFTEST_IMAGE": "gpumkt/busybox:latest",
                "CONTAINER_EXTRA_LABELS": sim_container_label(),
                "WORK_LEASE_SECONDS": "6",
                "API_THROTTLE_WRITE": "100000/min",
                "DB_POOL_MAX": "6",
                **overrides,
            },
        )
        self.cluster.start()
        (root / "hosts.json").write_text(json.dumps([host.to_dict() for host in hosts]))
        out = self.cluster.manage(
            "shell",
            "-c",
            "from deploy.demo_accounts import populate; "
            f"populate({str(root / 'hosts.json')!r}, renters=8)",
        )
        self.accounts = json.loads(out.strip().splitlines()[-1])
        self.machines = self.accounts["machines"]
        self.renters = self.accounts["renters"]

    def stop(self) -> None:
        if hasattr(self, "cluster"):
            self.cluster.stop()
        self.redis.stop()
        self.postgres.remove()

    def wait_listed(self, count: int, timeout: float = 60) -> None:
        """Until ``count`` machines are offered (probed, listed and rentable)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, body = self.api("GET", "/offers/?q=num_gpus>=1", self.renters[0]["key"])
            if status == 200 and len({o["machine_id"] for o in body["offers"]}) == count:
                return
            time.sleep(0.5)
        raise AssertionError(f"offers: {status} {body}")

    # --- the API ------------------------------------------------------------------------------
    def api(
        self, method: str, path: str, key: str, body: dict | None = None, *, web: int | None = None
    ):
        return self.cluster.api(method, path, key, body, web=web)

    def rent(self, renter: dict, machine_id: int, gpus: int = 1, *, web: int | None = None):
        body = {
            "machine_id": machine_id, "num_gpus": gpus, "image": "gpumkt/busybox:latest",
            "duration_hours": 1, "entrypoint": "sh", "args": QUICK_STOP,
        }  # fmt: skip
        return self.api("POST", "/instances/", renter["key"], body, web=web)

    def state(self, renter: dict, instance_id: int) -> str:
        status, body = self.api("GET", f"/instances/{instance_id}/", renter["key"])
        return "destroyed" if status == 404 else body.get("state", "?")

    def wait_state(self, renter, instance_id, wanted: set[str], timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        state = "?"
        while time.monotonic() < deadline:
            state = self.state(renter, instance_id)
            if state in wanted:
                return state
            time.sleep(0.3)
        raise AssertionError(f"instance {instance_id} stayed {state}, wanted {wanted}")

    def destroy(self, renter: dict, instance_id: int) -> None:
        status, body = self.api("DELETE", f"/instances/{instance_id}/", renter["key"])
        assert status in {202, 404}, body
        self.wait_state(renter, instance_id, {"destroyed"})

    def django(self, code: str) -> dict:
        """Run ``code`` in the installation's Django; it sets ``result`` (JSON-able)."""
        wrapped = code + "\nimport json as _j; print(_j.dumps(result, default=str))"
        return json.loads(self.cluster.manage("shell", "-c", wrapped).strip().splitlines()[-1])

    def ledger_problems(self) -> str:
        return self.django(
            "from tests.billing.ledger_checks import assert_ledger_consistent\n"
            "import traceback\n"
            "try:\n    assert_ledger_consistent(); result = ''\n"
            "except AssertionError:\n    result = traceback.format_exc()\n"
        )


@pytest.fixture(scope="module")
def installation(sim_host_factory, tmp_path_factory):
    hosts = [sim_host_factory(gpus=4), sim_host_factory(gpus=4)]
    root = tmp_path_factory.mktemp("cluster")
    # Fault injection on host 0 only: while the gate file exists, every `docker` command run
    # over SSH on it waits (its bin/ is first on the session's PATH), so a launch can be
    # caught mid-way. The platform's code runs unchanged.
    gate = root / "docker-gate"
    wrapper = Path(hosts[0].to_dict()["root"]) / "bin" / "docker"
    wrapper.write_text(
        f'#!/bin/sh\nwhile [ -e {gate} ]; do sleep 0.1; done\nexec {shutil.which("docker")} "$@"\n'
    )
    wrapper.chmod(0o755)
    made = Installation(root, hosts, gate)
    try:
        made.wait_listed(2)  # both machines probed, listed and rentable
        yield made
    finally:
        wrapper.unlink(missing_ok=True)
        made.stop()


def test_eight_renters_over_two_web_processes_race_for_the_gpus(installation):
    """7 renters with credit and 1 without, through Caddy (so over both web processes), each
    asking for 2 GPUs on one machine and then on the other, all at once: 8 GPUs fit 4
    rentals. Every other answer is a clean 409 or 402, no GPU is allocated twice, the ledger
    holds, and the 4 instances run."""
    inst = installation
    barrier = threading.Barrier(len(inst.renters))
    answers: list[tuple[dict, int, dict]] = []

    def renter(number: int, who: dict) -> None:
        barrier.wait()
        for step in range(2):
            machine = inst.machines[(number + step) % 2]
            status, body = inst.rent(who, machine, gpus=2)
            answers.append((who, status, body))

    threads = [threading.Thread(target=renter, args=(n, r)) for n, r in enumerate(inst.renters)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    rented = [(who, body["id"]) for who, status, body in answers if status == 201]
    refused = [(who, status, body) for who, status, body in answers if status != 201]
    assert len(answers) == 16
    assert len(rented) == 4, answers
    for who, status, body in refused:
        assert status in REFUSALS, (status, body)
        assert body["error"]["code"] and body["error"]["message"], body
        if who["short_of_credit"] and status == 402:
            assert "credit" in body["error"]["message"].lower(), body
    assert not any(who["short_of_credit"] for who, _ in rented)
    for web in inst.cluster.webs:  # Caddy spread the race over both processes
        assert "POST /api/v1/instances/" in web.tail(5_000_000), web.name
        assert '"code": 500' not in web.tail(5_000_000), web.tail()

    checked = inst.django(
        "from scheduler.models import GpuAllocation\n"
        "from billing.models import Hold, HoldStatus\n"
        "live = list(GpuAllocation.objects.filter(released_at=None).values_list('gpu_id', flat=True))\n"
        "result = {'live': len(live), 'distinct': len(set(live)),"
        " 'holds': Hold.objects.filter(status=HoldStatus.OPEN).count()}\n"
    )
    assert checked == {"live": 8, "distinct": 8, "holds": 4}, checked
    assert inst.ledger_problems() == ""
    try:
        for who, instance_id in rented:
            inst.wait_state(who, instance_id, {"running"})
    finally:
        for who, instance_id in rented:
            inst.destroy(who, instance_id)
    assert inst.ledger_problems() == ""


def test_a_socket_on_web_a_sees_a_rental_made_through_web_b(installation):
    inst = installation
    renter = inst.renters[0]
    port_a = inst.cluster.web_ports[0]
    headers = {
        "Cookie": f"sessionid={renter['session']}",
        # As the front proxy passes it on: the browser's page is the site's HTTPS origin.
        "Origin": f"https://localhost:{inst.cluster.https_port}",
        "Host": "localhost",
    }
    url = f"ws://127.0.0.1:{port_a}/ws/events/"
    with connect(url, additional_headers=headers, open_timeout=10) as socket:
        time.sleep(0.3)  # the socket has joined its team's group once accepted
        sent = time.monotonic()
        status, body = inst.rent(renter, inst.machines[1], web=1)
        assert status == 201, body
        instance_id = body["id"]
        seen = None
        deadline = time.monotonic() + 10
        while seen is None and time.monotonic() < deadline:
            message = json.loads(socket.recv(timeout=max(0.1, deadline - time.monotonic())))
            data = message.get("data", {})
            if instance_id in {data.get("id"), *data.get("ids", [])}:
                seen = time.monotonic() - sent
        assert seen is not None, "no event for the rental reached the socket on web A"
    inst.wait_state(renter, instance_id, {"running"})
    inst.destroy(renter, instance_id)


def _worker_with_launch(inst, instance_id: int, timeout: float = 30):
    """The worker process whose log shows it started this instance's launch."""
    mark = f'"instance_id": {instance_id}'
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for worker in inst.cluster.workers:
            if worker.alive() and mark in worker.tail(5_000_000):
                return worker
        time.sleep(0.1)
    raise AssertionError(f"no worker took the launch of {instance_id}")


def test_a_launch_whose_worker_is_killed_completes_on_another_with_one_container_and_one_charge(
    installation,
):
    inst = installation
    renter = inst.renters[1]
    inst.docker_gate.touch()  # host 0's docker commands wait: the launch stalls mid-way
    try:
        status, body = inst.rent(renter, inst.machines[0])
        assert status == 201, body
        instance_id = body["id"]
        victim = _worker_with_launch(inst, instance_id)
        time.sleep(1)  # inside the launch, waiting on the host
        assert inst.state(renter, instance_id) == "launching"
        victim.kill(signal.SIGKILL)  # kill -9 of the worker and its children
        victim.popen.wait(timeout=10)
    finally:
        inst.docker_gate.unlink(missing_ok=True)
    try:
        assert inst.wait_state(renter, instance_id, {"running", "failed"}, timeout=120) == "running"
        finisher = [
            w
            for w in inst.cluster.workers
            if w is not victim and f'"instance_id": {instance_id}' in w.tail(5_000_000)
        ]
        assert finisher, "the launch was finished by no other worker"
        found = inst.django(
            f"from scheduler.models import Instance\n"
            f"from marketplace.models import Rental\n"
            f"from billing.models import Hold\n"
            f"i = Instance.objects.get(pk={instance_id})\n"
            f"r = Rental.objects.get(instance_id={instance_id})\n"
            f"result = {{'name': i.container_name,"
            f" 'rentals': Rental.objects.filter(instance_id={instance_id}).count(),"
            f" 'holds': Hold.objects.filter(reference=f'rental:{{r.pk}}').count()}}\n"
        )
        containers = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"name=^{found['name']}$"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        assert len(containers) == 1, containers
        assert found["holds"] == 1 and found["rentals"] == 1, found
        assert inst.ledger_problems() == ""
    finally:
        inst.destroy(renter, instance_id)
        # systemd's Restart=always brings the worker back; so do we.
        inst.cluster.workers.remove(victim)
        port = int(victim.name.split("@")[1].split(".")[0])
        inst.cluster.start_worker(port)


def test_redis_stopped_and_postgresql_restarted_during_metering_every_process_recovers(
    installation,
):
    inst = installation
    rented = []
    for renter, machine in zip(inst.renters[2:4], inst.machines, strict=True):
        status, body = inst.rent(renter, machine)
        assert status == 201, body
        rented.append((renter, body["id"]))
    try:
        for renter, instance_id in rented:
            inst.wait_state(renter, instance_id, {"running"})
        time.sleep(2)  # something to charge
        done = inst.cluster.celery("call", "marketplace.tasks.metering_sweep")
        assert done.returncode == 0, done.stderr
        inst.postgres.restart()  # while the sweep runs (or just after)
        inst.redis.stop()
        time.sleep(10)
        inst.redis.start()
        outage_over = time.time()

        # Every process recovers by itself: nothing died, the web processes are ready again,
        # each worker answers, and the metering sweep queued now succeeds. The bounds are what
        # the settings guarantee, with room for a loaded machine: a worker tries Redis again
        # every 2 s at most (BROKER_RETRY_MAX_SECONDS, marketplace/broker_reconnect.py), and
        # the database pools check a connection before handing it out (CONN_HEALTH_CHECKS),
        # so the first task or request after PostgreSQL's restart gets a live one. Without the
        # checks this very sweep failed on a dead connection and only beat's next one (60 s
        # later, on whichever connection it got) could pass.
        for process in inst.cluster.processes():
            assert process.alive(), f"{process.name} died: {process.tail()}"
        for port in inst.cluster.web_ports:
            deadline = time.monotonic() + 30
            while inst.cluster.direct(port, "/readyz")[0] != 200 and time.monotonic() < deadline:
                time.sleep(0.5)
            assert inst.cluster.direct(port, "/readyz")[0] == 200
        for port in inst.cluster.worker_ports:
            deadline = time.monotonic() + 30
            while not inst.cluster.worker_answers(port) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert inst.cluster.worker_answers(port), f"worker{port}"

        def sweep_outcome(task_id: str) -> str:
            for worker in inst.cluster.workers:
                for line in worker.tail(50_000_000).splitlines():
                    if f"marketplace.tasks.metering_sweep[{task_id}]" in line:
                        if "succeeded in" in line:
                            return "succeeded"
                        if "raised" in line:
                            return line
            return ""

        done = inst.cluster.celery("call", "marketplace.tasks.metering_sweep")
        assert done.returncode == 0, done.stderr
        task_id = done.stdout.strip().splitlines()[-1]
        deadline = time.monotonic() + 30
        while not (outcome := sweep_outcome(task_id)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert outcome == "succeeded", (
            f"the metering sweep after the outage: {outcome or 'not run'}"
        )
        status, body = inst.api("GET", "/offers/?q=num_gpus>=1", inst.renters[0]["key"])
        assert status == 200, body  # through Caddy, on whichever web process

        # Nothing charged twice, nothing lost: a sweep at one instant leaves every open
        # rental's hold having captured exactly what it owes at that instant.
        checked = inst.django(
            "from django.utils import timezone\n"
            "from marketplace.models import Rental\n"
            "from marketplace.rentals.metering import metering_sweep, rental_owed\n"
            "from billing.models import Hold\n"
            "now = timezone.now()\n"
            "before = {r.pk: (Hold.objects.get(pk=r.hold_id).captured_gpu, rental_owed(r, now).gpu)"
            " for r in Rental.objects.filter(settled_at=None)}\n"
            "metering_sweep(now=now)\n"
            "result = []\n"
            "for r in Rental.objects.filter(settled_at=None):\n"
            "    h = Hold.objects.get(pk=r.hold_id); owed = rental_owed(r, now)\n"
            "    result.append([r.pk, before[r.pk][0], h.captured_gpu, owed.gpu,"
            " h.captured_storage, owed.storage])\n"
        )
        assert len(checked) == 2, checked
        for pk, captured_before, captured, owed_gpu, storage, owed_storage in checked:
            assert captured_before <= owed_gpu, (pk, captured_before, owed_gpu)
            assert captured_before > 0, f"rental {pk}: the sweeps before charged nothing"
            assert (captured, storage) == (owed_gpu, owed_storage), pk
        assert inst.ledger_problems() == ""
        assert outage_over
    finally:
        for renter, instance_id in rented:
            inst.destroy(renter, instance_id)
