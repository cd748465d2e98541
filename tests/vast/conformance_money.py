"""A section of the CLI conformance run (tests/vast/test_cli_conformance.py): a rental's
deposit, ``update instance``, price increases, and the invoices and charges.

Kept apart from the main module for its length; the checks are what a user would look at.
"""

from __future__ import annotations

import json
import re
import shlex

from billing.models import Hold
from marketplace.models import Rental
from scheduler.models import Instance, InstanceState
from tests.vast.conformance_more import destroy

# Exits at once on `docker stop`: a new version stops the running container first.
SCRIPT = "trap 'exit 0' TERM; echo {word} $MARK; while :; do sleep 1; done"


def money_and_updates(cli, table, wait_for_state) -> None:
    run = cli(
        "launch", "instance", "-g", "RTX_4090", "-n", "1", "-i", "gpumkt/busybox:latest",
        "-d", "8", "--onstart-cmd", "sh", "--args", "-c", SCRIPT.format(word="first"),
    )  # fmt: skip
    found = re.search(r"Instance launched successfully: (\d+)", run.stdout)
    instance_id = int(found.group(1)) if found else 0
    running = wait_for_state(instance_id, InstanceState.RUNNING) == InstanceState.RUNNING
    deposit(cli, table, instance_id, running)
    update_instance(cli, table, instance_id, wait_for_state)
    price_increases(cli, table, instance_id)
    destroy(cli, instance_id, wait_for_state)
    invoices(cli, table)
    charges(cli, table, instance_id)


def deposit(cli, table, instance_id: int, running: bool) -> None:
    shown = cli("show", "deposit", str(instance_id))
    rental = Rental.objects.filter(instance_id=instance_id).first()
    hold = Hold.objects.filter(pk=rental.hold_id).first() if rental else None
    try:
        body = json.loads(shown.stdout)
    except ValueError:
        body = {}
    table.works(
        "show deposit <id>",
        "the credit the rental's hold reserves: deposit (what it still holds: later usage is "
        "charged from it, the rest comes back when the rental ends), held_total, charged and "
        "the time it covers (/api/v1/billing/holds/ shows the same hold)",
        running
        and hold is not None
        and body.get("deposit") == hold.remaining / 1e6
        and body.get("held_total") == hold.amount / 1e6
        and body.get("covers_until") == rental.ends_at.timestamp(),
        shown.output,
    )


def update_instance(cli, table, instance_id: int, wait_for_state) -> None:
    script = SCRIPT.format(word="updated")
    updated = cli(
        "update", "instance", str(instance_id), "--env", '{"MARK": "v2"}',
        "--args", shlex.join(["-c", script]),
    )  # fmt: skip
    state = wait_for_state(instance_id, InstanceState.RUNNING)
    instance = Instance.objects.filter(pk=instance_id).first()
    executed = cli("execute", str(instance_id), "echo mark=$MARK")
    table.works(
        "update instance <id> [--template_hash_id <hash>] [--image …] [--env '<json>'] "
        "[--args …] [--onstart …]",
        "a new version of the rental on the same GPUs: its container stops (kept as the "
        "previous version, /api/v1/instances/<id>/versions/) and one with the new settings "
        "starts; --env adds or changes variables (-p keys publish ports), --args and --onstart "
        "(the entrypoint) are for an --args launch, a template gives its image, env, ports "
        "and command",
        f"Instance {instance_id} updated successfully" in updated.stdout
        and state == InstanceState.RUNNING
        and instance is not None
        and instance.version == 2
        and instance.args == ["-c", script]
        and "mark=v2" in executed.stdout,
        updated.output + executed.output,
    )


def price_increases(cli, table, instance_id: int) -> None:
    pending = cli("show", "pending-price-increases")
    table.works(
        "show pending-price-increases",
        "none, ever: a rental's prices are fixed when it is rented (extensions included), so "
        "a provider's new price applies to new rentals only",
        "No pending price increases." in pending.stdout and not pending.crashed,
        pending.output,
    )
    for verb, done in (("accept", "Accepted"), ("reject", "Rejected")):
        answered = cli(verb, "price-increase", str(instance_id), "-y")
        table.works(
            f"{verb} price-increase <id> -y",
            "the CLI finds no pending increase for the instance (see show "
            "pending-price-increases) and says so; the rental's prices stay",
            f"pending price increase no longer available for instance {instance_id}"
            in answered.stdout
            and f"{done} 0 / Stale 1 / Failed 0 of 1 requested" in answered.stdout,
            answered.output,
        )


def invoices(cli, table) -> None:
    searched = cli("search", "invoices", "amount_cents>0 service=grant")
    everything = cli("search", "invoices")
    try:
        rows, all_rows = json.loads(searched.stdout), json.loads(everything.stdout)
    except ValueError:
        rows, all_rows = [], []
    table.works(
        "search invoices '<query>'",
        "the credit added to the team (top-ups, grants, credit sent between teams), each in "
        "vast's invoice fields (id, when, amount_cents, is_credit, service, balance_before/"
        "after…), filtered by the query (other fields are refused, naming them)",
        bool(rows)
        and all(row["service"] == "grant" and row["amount_cents"] > 0 for row in rows)
        and len(all_rows) >= len(rows),
        searched.output + everything.output,
    )


def charges(cli, table, instance_id: int) -> None:
    raw = cli("show", "invoices-v1", "-c", raw=True)
    shown = cli("show", "invoices-v1", "-c", "--no-color")
    paid = cli("show", "invoices-v1", "-i", raw=True)
    listed = cli("show", "invoices-v1", "-i", "--no-color")
    try:
        rows, credits = json.loads(raw.stdout)["results"], json.loads(paid.stdout)["results"]
    except (ValueError, KeyError, TypeError):
        rows, credits = [], []
    table.works(
        "show invoices-v1 -c|-i [-ct instance|volume] [-it stripe|transfers] [-s <date>] "
        "[-e <date>] [-l <n>] [--latest-first]",
        "-c: the team's usage charges, one row per rental (instance) or volume per day; -i: "
        "the credit added (as search invoices lists it); a page at a time, the last 7 days "
        "by default",
        any(row["type"] == "instance" and row["source"] == str(instance_id) for row in rows)
        and "Showing" in shown.stdout
        and str(instance_id) in shown.stdout
        and any(row["type"] == "credit" and row["source"] == "grant" for row in credits)
        and "Credit" in listed.stdout,
        raw.output + shown.output + paid.output + listed.output,
    )
