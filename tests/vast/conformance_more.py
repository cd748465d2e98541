"""Sections of the CLI conformance run (tests/vast/test_cli_conformance.py): volumes, ssh-url
and scp-url, teams and transfer credit. Each runs the real CLI and records what its user would
check in the run's table."""

from __future__ import annotations

import json
import re

from billing.selectors import team_balance
from marketplace.models import Invitation, Membership, Role, Team, Volume, VolumeState
from scheduler.models import Instance, InstanceState, PortAllocation
from tests.factories import TeamFactory, UserFactory, add_member


def wait_volume_ready(volume_id: int, timeout: float = 90) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = Volume.objects.filter(pk=volume_id).values_list("state", flat=True).first()
        if state == VolumeState.READY:
            return True
        if state in (None, VolumeState.FAILED):
            return False
        time.sleep(0.3)
    return False


def volumes(cli, table, machine, offer: str, wait_for_state) -> None:
    """search/create/show/delete/clone volume(s), create instance --link-volume and
    --create-volume."""
    found = cli("search", "volumes", f"machine_id={machine.pk}", raw=True)
    rows = json.loads(found.stdout) if found.returncode == 0 and found.stdout.strip() else []
    table.works(
        "search volumes '<query>'",
        "a volume offer is a listed machine's free disk not yet promised to volumes: its id is "
        "the machine's, disk_space the GB a volume there may take, storage_cost its $/GB/month",
        [row["id"] for row in rows] == [machine.pk] and rows[0]["disk_space"] >= 2,
        found.output,
    )
    made = cli("create", "volume", str(machine.pk), "-s", "1", "-n", "data")
    matched = re.search(r"'volume_id': (\d+)", made.stdout)
    volume = Volume.objects.filter(pk=int(matched.group(1))).first() if matched else None
    table.works(
        "create volume <volume offer> -s <GB> -n <name>",
        "makes a volume of that size on the machine (its size enforced on the host), held for "
        "30 days or the machine's end date (extend with /api/v1/)",
        volume is not None and volume.size_gb == 1 and wait_volume_ready(volume.pk),
        made.output,
    )
    volume_id = volume.pk if volume else 0
    shown = cli("show", "volumes")
    table.works(
        "show volumes",
        "lists the team's volumes: id, name, size, status, machine and the instances mounting them",
        any(str(volume_id) in row and "data" in row for row in shown.stdout.splitlines()),
        shown.output,
    )
    linked = cli(
        "create", "instance", offer, "--image", "gpumkt/busybox:latest",
        "--link-volume", str(volume_id), "--mount-path", "/data",
        "--onstart-cmd", "sh", "--args", "-c", "exec sleep 600",
    )  # fmt: skip
    first = instance_of(linked)
    running = first and wait_for_state(first, InstanceState.RUNNING) == InstanceState.RUNNING
    wrote = cli("execute", str(first), "echo kept > /data/f; cat /data/f") if running else None
    table.works(
        "create instance <offer> … --link-volume <volume id> --mount-path <path>",
        "the instance mounts the team's volume (on the same machine) at the path",
        bool(running and wrote and "kept" in wrote.stdout),
        linked.output + (wrote.output if wrote else ""),
    )
    destroy(cli, first, wait_for_state)
    created = cli(
        "create", "instance", offer, "--image", "gpumkt/busybox:latest",
        "--create-volume", str(machine.pk), "--volume-size", "1", "--mount-path", "/scratch",
        "--volume-label", "scratch", "--onstart-cmd", "sh", "--args", "-c", "exec sleep 600",
    )  # fmt: skip
    second = instance_of(created)
    scratch = Volume.objects.filter(name="scratch", mounts__instance_id=second).first()
    table.works(
        "create instance <offer> … --create-volume <volume offer> --volume-size <GB> "
        "--mount-path <path>",
        "makes a volume on the instance's machine (the volume offer must be that machine) and "
        "mounts it; a rental that fails deletes the volume it made",
        bool(second)
        and scratch is not None
        and wait_for_state(second, InstanceState.RUNNING) == InstanceState.RUNNING,
        created.output,
    )
    destroy(cli, second, wait_for_state)
    clone(cli, table, volume_id, machine, offer, wait_for_state)
    deleted = cli("delete", "volume", str(volume_id))
    gone = Volume.objects.filter(pk=volume_id).values_list("state", flat=True).first()
    table.works(
        "delete volume <id>",
        "settles the volume at once and removes it from its host (refused while an instance "
        "mounts it)",
        "Deleted." in deleted.stdout and gone in (VolumeState.REMOVING, VolumeState.DELETED),
        deleted.output,
    )
    if scratch is not None:
        cli("delete", "volume", str(scratch.pk))


def clone(cli, table, volume_id: int, machine, offer: str, wait_for_state) -> None:
    """``clone volume``: a new volume with the files the volume holds (written by the
    --link-volume row), mounted by a new instance."""
    cloned = cli("clone", "volume", str(volume_id), str(machine.pk), "-s", "2")
    matched = re.search(r"'volume_id': (\d+)", cloned.stdout)
    copy = Volume.objects.filter(pk=int(matched.group(1))).first() if matched else None
    ready = copy is not None and wait_volume_ready(copy.pk)
    read = None
    if ready:
        linked = cli(
            "create", "instance", offer, "--image", "gpumkt/busybox:latest",
            "--link-volume", str(copy.pk), "--mount-path", "/data",
            "--onstart-cmd", "sh", "--args", "-c", "exec sleep 600",
        )  # fmt: skip
        reader = instance_of(linked)
        if reader and wait_for_state(reader, InstanceState.RUNNING) == InstanceState.RUNNING:
            read = cli("execute", str(reader), "cat /data/f")
        destroy(cli, reader, wait_for_state)
    table.works(
        "clone volume <id> <volume offer> [-s <GB>]",
        "a new volume of the team with a copy of the volume's files, on the same machine (the "
        "volume offer is that machine), at least the volume's size; an instance mounting it "
        "reads the files",
        bool(
            ready
            and copy.size_gb == 2
            and copy.cloned_from_id == volume_id
            and read
            and "kept" in read.stdout
        ),
        cloned.output + (read.output if read else ""),
    )
    if copy is not None:
        cli("delete", "volume", str(copy.pk))


def instance_of(run) -> int:
    found = re.search(r"'new_contract': (\d+)", run.stdout)
    return int(found.group(1)) if found else 0


def destroy(cli, instance_id: int, wait_for_state) -> None:
    if instance_id:
        cli("destroy", "instance", str(instance_id), "-y")
        wait_for_state(instance_id, InstanceState.DESTROYED)


def ssh_urls(cli, table, instance: Instance, machine) -> None:
    """``ssh-url`` and ``scp-url`` of a running SSH-mode instance."""
    allocation = PortAllocation.objects.filter(instance=instance, container_port=22).first()
    port = allocation.host_port if allocation else 0
    ssh = cli("ssh-url", str(instance.pk))
    table.works(
        "ssh-url <id>",
        "prints ssh://root@<machine address>:<the instance's published port 22>",
        f"ssh://root@{machine.address}:{port}" in ssh.stdout,
        ssh.output,
    )
    scp = cli("scp-url", str(instance.pk))
    table.works(
        "scp-url <id>",
        "prints scp://root@<machine address>:<the instance's published port 22>",
        f"scp://root@{machine.address}:{port}" in scp.stdout,
        scp.output,
    )


def teams(cli, table, team, tmp_path) -> None:
    """The team commands and transfer credit."""
    owner = Membership.objects.get(team=team, role=Role.OWNER).user
    before = team_balance(team.pk).available
    made = cli("create", "team", "--team-name", "Lab", "--transfer-credit", "1")
    lab = Team.objects.filter(name="Lab", memberships__user=owner).first()
    table.works(
        "create team --team-name <name> [--transfer-credit <dollars>]",
        "a new team whose owner is the key's creator, sent that much of the key's team's "
        "credit; the key keeps acting for its own team (as on vast.ai)",
        "'success': True" in made.stdout
        and lab is not None
        and team_balance(lab.pk).available == 1_000_000
        and team_balance(team.pk).available == before - 1_000_000,
        made.output,
    )
    shown = cli("show", "members")
    table.works(
        "show members",
        "the team's members: user id, username, email and role",
        owner.username in shown.stdout and "'role': 'owner'" in shown.stdout,
        shown.output,
    )
    invited = cli("invite", "member", "--email", "ann@example.com", "--role", "admin")
    table.works(
        "invite member --email <email> --role <owner|admin|member|viewer>",
        "an invitation with that role; its link is in the answer's invite_url (the CLI prints "
        "only that it was made) and on the console's team page",
        "successfully invited" in invited.stdout
        and Invitation.objects.filter(team=team, email="ann@example.com", role=Role.ADMIN).exists(),
        invited.output,
    )
    bob = UserFactory(username="bob")
    add_member(team, bob, Role.MEMBER)
    removed = cli("remove", "member", str(bob.pk))
    table.works(
        "remove member <user id>",
        "the member leaves the team (admins remove others; an owner only by an owner)",
        "'success': True" in removed.stdout
        and not Membership.objects.filter(team=team, user=bob).exists(),
        removed.output,
    )
    roles = cli("show", "team-roles")
    role = cli("show", "team-role", "admin")
    table.works(
        "show team-roles; show team-role <name>",
        "the four fixed roles (owner, admin, member, viewer), each with what it may do",
        all(f"'{name}'" in roles.stdout for name in ("owner", "admin", "member", "viewer"))
        and '"name": "admin"' in role.stdout,
        roles.output + role.output,
    )
    permissions = tmp_path / "role.json"
    permissions.write_text('{"api": {"instance_read": {}}}')
    for command in (
        ["create", "team-role", "--name", "ops", "--permissions", str(permissions)],
        ["update", "team-role", "2", "--name", "ops", "--permissions", str(permissions)],
        ["remove", "team-role", "member"],
    ):
        run = cli(*command)
        table.refused(" ".join(command[:2]) + " …", run, "Roles here are fixed")
    destroyed = cli("destroy", "team")
    table.refused("destroy team", destroyed, "destroy team is not offered")
    if lab is None:
        return
    before = team_balance(team.pk).available, team_balance(lab.pk).available
    sent = cli("transfer", "credit", "--recipient", str(lab.pk), "--amount", "0.5", "--skip")
    after = team_balance(team.pk).available, team_balance(lab.pk).available
    table.works(
        "transfer credit --recipient <team id> --amount <dollars> --skip",
        "moves available credit to another team of the key's creator, through the ledger, "
        "once (a resent request moves nothing more); admins only",
        f"Sent 0.5 to {lab.pk}" in sent.stdout
        and after == (before[0] - 500_000, before[1] + 500_000),
        sent.output,
    )
    strangers = TeamFactory(name="Strangers")
    refusals = [
        cli("transfer", "credit", "--recipient", str(strangers.pk), "--amount", "1", "--skip"),
        cli("transfer", "credit", "--recipient", str(lab.pk), "--amount", "-1", "--skip"),
        cli("transfer", "credit", "--recipient", str(lab.pk), "--amount", "5000", "--skip"),
    ]
    table.works(
        "(transfer credit that cannot be made)",
        "another team's id, a negative amount and more than the team has are refused "
        "(404, 400, 402), and nothing moves",
        all("Failed with error" in run.output and not run.crashed for run in refusals)
        and (team_balance(team.pk).available, team_balance(lab.pk).available) == after
        and team_balance(strangers.pk).available == 0,
        "\n".join(run.output for run in refusals),
    )


def launch(cli, table, wait_for_state) -> None:
    """``launch instance``: search and rent in one command."""
    run = cli(
        "launch", "instance", "-g", "RTX_4090", "-n", "1", "-i", "gpumkt/busybox:latest",
        "-d", "8", "--label", "launched", "--onstart-cmd", "sh", "--args", "-c", "exec sleep 600",
    )  # fmt: skip
    found = re.search(r"Instance launched successfully: (\d+)", run.stdout)
    instance = Instance.objects.filter(pk=int(found.group(1))).first() if found else None
    table.works(
        "launch instance -g <gpu> -n <count> -i <image> [create instance's options]",
        "rents the best offer the search finds (the GPU model and count, region and disk asked "
        "for) with the settings, as search offers then create instance would",
        instance is not None
        and instance.label == "launched"
        and instance.image == "gpumkt/busybox:latest"
        and instance.gpu_count == 1
        and wait_for_state(instance.pk, InstanceState.RUNNING) == InstanceState.RUNNING,
        run.output,
    )
    destroy(cli, instance.pk if instance else 0, wait_for_state)


def update_ssh_key(cli, table, team, tmp_path) -> None:
    """``update ssh-key``: the team key's new public key."""
    from marketplace.models import SshKey
    from marketplace.services.ssh_keys import ssh_key_add
    from tests.marketplace.test_launch_modes import make_key

    make_key(tmp_path / "id_old")
    make_key(tmp_path / "id_new")
    old = (tmp_path / "id_old.pub").read_text().strip()
    new = (tmp_path / "id_new.pub").read_text().strip()
    key = ssh_key_add(team=team, name="rotating", public_key=old)
    run = cli("update", "ssh-key", str(key.pk), new)
    key = SshKey.objects.filter(pk=key.pk).first()
    table.works(
        "update ssh-key <id> <public key>",
        "the team's key gets the new public key under its name (instances launched from now "
        "get it)",
        key is not None and key.public_key == " ".join(new.split()[:3]) and key.name == "rotating",
        run.output,
    )
    if key is not None:
        cli("delete", "ssh-key", str(key.pk))


def copies(cli, table, instance: Instance, other_offer: str, tmp_path, wait_for_state) -> None:
    """``copy`` from the renter's machine into a running SSH-mode instance and back (the
    CLI's own rsync over the instance's SSH, with a key put in by ``attach ssh``), and from
    that instance into another of the team's instances."""
    from tests.marketplace.test_launch_modes import make_key

    make_key(tmp_path / "id_copy")
    cli("attach", "ssh", str(instance.pk), str(tmp_path / "id_copy.pub"))
    up, down = tmp_path / "up", tmp_path / "down"
    odd = "a;b $(touch owned) `id` *.txt"  # a name, never a command
    (up / "sub").mkdir(parents=True)
    (up / "sub" / odd).write_text("from the laptop\n")
    key = str(tmp_path / "id_copy")
    sent = cli("copy", f"local:{up}/", f"C.{instance.pk}:/workspace/in/", "-i", key)
    there = cli("execute", str(instance.pk), "cat '/workspace/in/sub/" + odd + "'")
    table.works(
        "copy local:<path> C.<id>:<path> [-i <key>]",
        "the CLI runs its rsync over the SSH-mode instance's sshd (user vastai_kaalia, module "
        "C.<id>: the platform adds both in the container, for the keys that log in as root); "
        "the files arrive, names with shell characters as names",
        "from the laptop" in there.stdout,
        sent.output + there.output,
    )
    got = cli("copy", f"C.{instance.pk}:/workspace/in/", f"local:{down}", "-i", key)
    back = down / "sub" / odd
    table.works(
        "copy C.<id>:<path> local:<path> [-i <key>]",
        "the instance's files come back to the renter's machine by the same rsync",
        back.exists() and back.read_text() == "from the laptop\n",
        got.output,
    )
    made = cli(
        "create", "instance", other_offer, "--image", "gpumkt/busybox:latest",
        "--onstart-cmd", "sh", "--args", "-c", "exec sleep 600",
    )  # fmt: skip
    other = instance_of(made)
    running = other and wait_for_state(other, InstanceState.RUNNING) == InstanceState.RUNNING
    direct = (
        cli("copy", f"C.{instance.pk}:/workspace/in/", f"C.{other}:/data/") if running else None
    )
    read = cli("execute", str(other), "cat '/data/sub/" + odd + "'") if running else None
    table.works(
        "copy C.<id>:<path> C.<other id>:<path>",
        "between two of the team's running instances (any launch mode, one machine or two): "
        "the platform relays the files from one container into the other and answers once "
        "they are there (tests/vast/test_copy.py: another team's instance id answers 404, and "
        "nothing is copied)",
        bool(direct and "Remote to Remote copy initiated" in direct.stdout and read
             and "from the laptop" in read.stdout),
        made.output + (direct.output if direct else "") + (read.output if read else ""),
    )  # fmt: skip
    destroy(cli, other, wait_for_state)
