"""The last section of the CLI conformance run (tests/vast/test_cli_conformance.py): every command
of ``vastai --help`` gets a row.

The commands are read from the CLI's own ``--help`` (in its host view, ``set role host``, which
adds the provider's commands), never from a list kept here: a new CLI release's new command
fails the run until it has a row. The sections before this one check the commands that work;
this one runs each remaining command once, with arguments a user would give, and checks that it
either does what it says or prints our refusal (a readable message, never a traceback, an HTML
page or the CLI's "(no detail message supplied)").
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

from hosts.models import Machine
from tests.vast.cli import Run

NOT_OFFERED = "This marketplace does not offer"
COMMAND_LINE = re.compile(r"^ ([a-z][a-z0-9-]*(?: [a-z][a-z0-9-]*)?)\s{2,}\S")


def help_commands(cli) -> list[str]:
    """The commands ``vastai --help`` lists, provider commands included, in its order."""
    cli("set", "role", "host")
    shown = cli("--help")
    return [m.group(1) for line in shown.stdout.splitlines() if (m := COMMAND_LINE.match(line))]


def command_of(row: str, commands: list[str]) -> str | None:
    """The --help command a table row runs: the longest one its text starts with."""
    matches = [c for c in commands if row == c or row.startswith(c + " ")]
    return max(matches, key=len, default=None)


def rows_commands(rows, commands: list[str]) -> set[str]:
    """The --help commands the table's rows cover (a row may name several, split by ;)."""
    covered = set()
    for row in rows:
        for part in row.split(";"):
            found = command_of(part.strip(), commands)
            if found:
                covered.add(found)
    return covered


@dataclass
class Refusal:
    """A command we do not offer, run with these arguments (``{instance}``, ``{machine}``,
    ``{template}`` and ``{home}`` filled in). ``host``: run with the provider's key;
    ``answer``: what the user types at its prompt."""

    args: str
    host: bool = False
    answer: str = ""


# What each command not checked in the sections before is run with. Keyed by the command as
# --help names it; a command --help lists that is neither here nor in a row fails the run.
REFUSED = {
    "search benchmarks": Refusal("'gpu_name=RTX_4090'"),
    "recycle instance": Refusal("{instance}"),
    "prepay instance": Refusal("{instance} 10"),
    "take snapshot": Refusal(
        "{instance} --repo me/snap --docker_login_user me --docker_login_pass secret"
    ),
    "run benchmarks": Refusal("--template_hash {template} --gpus RTX_4090 --timeout 5 -y"),
    "cleanup machine": Refusal("{machine}", host=True),
    "set defjob": Refusal("{machine} --price_gpu 0.1 --image gpumkt/busybox:latest", host=True),
    "remove defjob": Refusal("{machine}", host=True),
    "reset api-key": Refusal(""),
    "tfa activate": Refusal("123456 --secret abc -t totp"),
    "tfa delete": Refusal("--id-to-delete 1 --code 123456", answer="y"),
    "tfa login": Refusal("--code 123456 -t totp"),
    "tfa resend-sms": Refusal("--secret abc"),
    "tfa regen-codes": Refusal("--code 123456 -t totp", answer="y"),
    "tfa send-sms": Refusal("--phone-number +15551234567"),
    "tfa send-email": Refusal(""),
    "tfa auth-new": Refusal("-t totp"),
    "tfa status": Refusal(""),
    "tfa totp-setup": Refusal(""),
    "tfa update": Refusal("1 --label phone"),
    "set user": Refusal("--file {home}/user.json"),
    "show subaccounts": Refusal(""),
    "show ipaddrs": Refusal(""),
    "show scheduled-jobs": Refusal(""),
    "delete scheduled-job": Refusal("1"),
    "show deployments": Refusal(""),
    "show deployment": Refusal("1"),
    "show deployment-versions": Refusal("1"),
    "stop deployment": Refusal("1"),
    "start deployment": Refusal("1"),
    "delete deployment": Refusal("1"),
    "show gpu-metrics": Refusal(""),
    "show gpu-trends": Refusal("RTX_4090"),
    "show gpu-locations": Refusal(""),
    "cancel copy": Refusal("{instance}:/workspace"),
    "cancel sync": Refusal("{instance}:/workspace"),
    "cloud copy": Refusal(
        "--src /workspace --dst /backup --instance {instance} --connection 1 "
        "--transfer 'Instance To Cloud'"
    ),
    "show connections": Refusal(""),
    "show instance-backups": Refusal(""),
    "show instance-backup-files": Refusal("{instance}"),
    "list volume": Refusal("{machine} -s 5", host=True),
    "list volumes": Refusal("{machine} -s 5", host=True),
    "unlist volume": Refusal("1", host=True),
}
# Our refusal of these is a message of its own, naming the command.
MESSAGES = {
    "cancel copy": "cancel copy is not offered",
    "list volume": "list volume is not offered",
    "list volumes": "list volume is not offered",
}


def every_other_command(cli, table, instance_id: int, machine: Machine, provider_key: str):
    """Runs each --help command no row covers yet, and fails the run for one it cannot place."""
    commands = help_commands(cli)
    (cli.home / "user.json").write_text(json.dumps({"fullname": "A Renter"}))
    local_commands(cli, table, machine, provider_key)
    quiet_refusals(cli, table, machine, provider_key)
    made = cli("create", "template", "--name", "bench", "--image", "gpumkt/busybox:latest")
    template = re.search(r"'hash_id': '(\w+)'", made.stdout)
    values = {
        "instance": str(instance_id),
        "machine": str(machine.pk),
        "template": template.group(1) if template else "none",
        "home": str(cli.home),
    }
    shown = {"instance": "<instance id>", "machine": "<machine id>", "template": "<hash>"}
    for command in commands:
        if command in rows_commands(table.rows, commands):
            continue
        refusal = REFUSED.get(command)
        if refusal is None:
            continue  # named below
        args = shlex.split(refusal.args.format(**values))
        run = cli(
            *command.split(),
            *args,
            key=provider_key if refusal.host else None,
            answer=refusal.answer,
        )
        # The table is the same from run to run: ids and the temporary folder vary.
        text = refusal.args.format(**shown, home="<folder>")
        scrubbed = Run(run.args, run.returncode, *(scrub(o, values) for o in run_outputs(run)))
        table.refused(f"{command} {text}".strip(), scrubbed, MESSAGES.get(command, NOT_OFFERED))
    missing = [c for c in commands if c not in rows_commands(table.rows, commands)]
    if missing:
        table.failures.append(f"commands of vastai --help without a row: {missing}")


def run_outputs(run: Run) -> tuple[str, str]:
    return run.stdout, run.stderr


def scrub(text: str, values: dict[str, str]) -> str:
    """The output without what varies from run to run: the server's port, the instance's and
    template's ids (Table.refused writes ids in paths as <id>)."""
    text = re.sub(r"http://[\w.]+:\d+", "http://host:port", text)
    instance = values["instance"]
    for before, after in ((" ", ":/"), ("instance ", " "), ("/backup ", " ")):
        text = text.replace(f"{before}{instance}{after}", f"{before}<instance id>{after}")
    text = re.sub(r"Template id=\d+", "Template id=<id>", text)
    return text.replace(values["template"], "<hash>")


def local_commands(cli, table, machine: Machine, provider_key: str) -> None:
    """Commands the CLI answers itself, and list machines (list machine for each id)."""
    shown = cli("help")
    table.works(
        "help",
        "prints the CLI's list of commands (the CLI's own; no request)",
        "search offers" in shown.output and not shown.crashed,
        shown.output,
    )
    role = cli("set", "role", "client")
    cli("set", "role", "host")
    table.works(
        "set role host|client",
        "chooses which commands --help shows (the CLI's own setting; no request); this table "
        "lists the host view's, which adds the provider's commands",
        "CLI role set to 'client'" in role.stdout,
        role.output,
    )
    saved = cli("set", "api-key", "a-saved-key")
    key_file = cli.home / ".config" / "vastai" / "vast_api_key"
    table.works(
        "set api-key <key>",
        "saves the key for later commands without --api-key (the CLI's own file; no request)",
        key_file.exists() and key_file.read_text().strip() == "a-saved-key",
        saved.output,
    )
    update = cli("update", "--check")
    table.works(
        "update [--check]",
        "the CLI updates itself from vast.ai's release manifest, never from --url (the test "
        "runs --check, which needs no marketplace)",
        not update.crashed and "manifest" in update.output.lower(),
        update.output,
    )
    listed = cli("list", "machines", str(machine.pk), "-g", "0.8", key=provider_key)
    machine.refresh_from_db()
    table.works(
        "list machines <id> <id> … -g <price> [list machine's options]",
        "list machine for each id, as list machine does",
        f"offers created/updated for machine {machine.pk}" in listed.stdout
        and machine.listed
        and machine.price_per_gpu_hour == 800_000,
        listed.output,
    )
    dumped = cli("dump-logs", str(machine.pk), "--output-dir", str(cli.home), key=provider_key)
    bundles = list(cli.home.glob(f"vast_selftest_{machine.pk}_*.tar.gz"))
    table.works(
        "dump-logs <machine id> --output-dir <folder>",
        "writes the CLI's self-test diagnostics of the machine into a tar.gz for support, on "
        "the user's own computer (nothing is sent)",
        len(bundles) == 1 and not dumped.crashed,
        dumped.output,
    )


def quiet_refusals(cli, table, machine: Machine, provider_key: str) -> None:
    """Commands we do not offer whose CLI prints only the answer's status, or its own words."""
    defrag = cli("defrag", "machines", str(machine.pk), key=provider_key)
    table.refused_without_message(
        "defrag machines <machine id>",
        "answers 404 (our message); the CLI prints only: Error: 404 Client Error: Not Found "
        "for url: …/api/v0/machines/defrag_offers/",
        "Error: 404 Client Error: Not Found" in defrag.output,
        defrag.output,
    )
    sub = cli(
        "create", "subaccount", "--email", "sub@example.com", "--username", "sub",
        "--password", "long-password-1", "--type", "client",
    )  # fmt: skip
    table.refused_without_message(
        "create subaccount --email … --username … --password … --type client",
        "answers 404 (our message); the CLI prints only: Failed with error: 404 Client Error: "
        "Not Found for url: …/api/v0/users/ (a team member is invited with invite member)",
        "404 Client Error: Not Found" in sub.output,
        sub.output,
    )
    tested = cli(
        "self-test", "machine", str(machine.pk), "--ignore-requirements", "--no-support-bundle",
        key=provider_key,
    )  # fmt: skip
    table.refused_without_message(
        "self-test machine <machine id> [--ignore-requirements]",
        "the CLI checks the machine's figures, then rents it with vast.ai's self-test image, "
        "which this marketplace does not run; the CLI prints that the test failed (its "
        "preflight's or the create-instance answer's status)",
        "Test failed" in tested.output or "Preflight diagnostics for machine" in tested.output,
        tested.output,
    )
