"""The serverless commands of the real ``vastai`` CLI, as a section of the conformance table
(tests/vast/test_cli_conformance.py) and a test of its own (test_serverless_cli.py): an
endpoint and its workergroup make a cluster whose workers run on a simulated host; the CLI
lists them, prints their logs, rolls them, and deletes it all."""

from __future__ import annotations

import json
import time

from marketplace.models import Cluster, ServerlessEndpoint, Template
from marketplace.models.deployments import ReplicaState
from marketplace.services.templates import template_create

# A GPU no other machine of the tests has: the workers go to the section's own machine.
WORKER_GPU = "NVIDIA A40"


def running_workers(endpoint_id: int, wanted: int, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    running = 0
    while time.monotonic() < deadline:
        cluster = Cluster.objects.filter(workergroup__endpoint_id=endpoint_id).first()
        if cluster is not None:
            running = cluster.deployment.replicas.filter(state=ReplicaState.RUNNING).count()
            if running >= wanted:
                return running
        time.sleep(0.5)
    return running


def serverless(cli, table, team) -> None:
    template = template_create(
        team=team,
        user=None,
        fields={
            "name": "worker",
            "image": "gpumkt/busybox:latest",
            "entrypoint": "sh",
            "args": ["-c", "echo worker-ready; exec sleep 600"],
        },
    )
    made = cli("create", "endpoint", "--endpoint_name", "llm", "--max_workers", "3")
    endpoint = ServerlessEndpoint.objects.filter(team=team, name="llm").first()
    table.works(
        "create endpoint",
        "makes the endpoint: --max_workers bounds its cluster's replicas (at least 2)",
        endpoint is not None and endpoint.max_workers == 3 and "'success': True" in made.stdout,
        made.output,
    )
    endpoint_id = str(endpoint.pk if endpoint else 0)
    shown = cli("show", "endpoints", raw=True)
    rows = json.loads(shown.stdout) if shown.returncode == 0 and shown.stdout.strip() else []
    table.works(
        "show endpoints",
        "lists the team's endpoints with their name, state and max_workers",
        [(r["id"], r["endpoint_name"], r["max_workers"]) for r in rows]
        == [(int(endpoint_id), "llm", 3)],
        shown.output,
    )
    group = cli(
        "create", "workergroup", "--endpoint_id", endpoint_id, "--template_hash",
        template.hash_id, "--search_params", "gpu_name=A40 num_gpus=1",
    )  # fmt: skip
    running = running_workers(int(endpoint_id), 2)
    table.works(
        "create workergroup",
        "makes the endpoint's cluster from the template; --search_params place its workers "
        "(gpu_name, num_gpus, dph_per_gpu, reliability, geolocation); two start",
        "'success': True" in group.stdout and running == 2,
        group.output + f" running={running}",
    )
    groups = cli("show", "workergroups", raw=True)
    group_rows = json.loads(groups.stdout) if groups.returncode == 0 and groups.stdout else []
    group_id = str(group_rows[0]["id"]) if len(group_rows) == 1 else "0"
    table.works(
        "show workergroups",
        "lists the team's workergroups with their endpoint and template",
        len(group_rows) == 1 and group_rows[0]["template_hash"] == template.hash_id,
        groups.output,
    )
    workers = cli("get", "endpt-workers", endpoint_id)
    lines = [line for line in workers.stdout.splitlines() if line.startswith("id=")]
    table.works(
        "get endpt-workers <id>",
        "one line per worker: its instance id, status and GPU",
        len(lines) == 2 and all("status=running gpu_name=A40" in line for line in lines),
        workers.output,
    )
    logs = cli("get", "endpt-logs", endpoint_id, "--tail", "20")
    table.works(
        "get endpt-logs <id>",
        "prints each worker's last lines, headed by its instance id",
        logs.stdout.count("worker-ready") == 2 and "== worker" in logs.stdout,
        logs.output,
    )
    group_logs = cli("get", "wrkgrp-logs", group_id)
    table.works(
        "get wrkgrp-logs <id>",
        "the same for the workergroup's workers",
        group_logs.stdout.count("worker-ready") == 2,
        group_logs.output,
    )
    Template.objects.filter(pk=template.pk).update(args=["-c", "echo worker-v2; exec sleep 600"])
    rolled = cli("update", "workers", group_id)
    table.works(
        "update workers <id>",
        "rolls the template's current settings onto the workers, one at a time",
        f"Update started for workergroup {group_id} (2 workers)" in rolled.stdout,
        rolled.output,
    )
    moved = cli("update", "workergroup", group_id, "--search_params", "gpu_name=A40")
    table.works(
        "update workergroup <id>",
        "new --search_params (or --template_hash) reach the cluster",
        "'success': True" in moved.stdout,
        moved.output,
    )
    cold = cli("update", "endpoint", endpoint_id, "--cold_workers", "1")
    changed = cli("update", "endpoint", endpoint_id, "--max_workers", "4")
    cluster = Cluster.objects.filter(workergroup__endpoint_id=int(endpoint_id)).first()
    table.works(
        "update endpoint <id>",
        "--max_workers, --target_util, --endpoint_name and --endpoint_state active|stopped "
        "reach the cluster; cold workers are refused naming the flag",
        "Failed with error 400: --cold_workers is not supported" in cold.output
        and "'success': True" in changed.stdout
        and cluster is not None
        and cluster.max_replicas == 4,
        cold.output + changed.output,
    )
    dropped = cli("delete", "workergroup", group_id)
    table.works(
        "delete workergroup <id>",
        "deletes the workergroup and its cluster: its workers stop and their rentals settle",
        "'success': True" in dropped.stdout
        and not Cluster.objects.filter(pk=cluster.pk if cluster else 0).exists(),
        dropped.output,
    )
    gone = cli("delete", "endpoint", endpoint_id)
    table.works(
        "delete endpoint <id>",
        "deletes the endpoint (and its cluster, if a workergroup made one)",
        "'success': True" in gone.stdout
        and not ServerlessEndpoint.objects.filter(pk=int(endpoint_id)).exists(),
        gone.output,
    )
