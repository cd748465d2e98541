"""Translation between vast.ai's shapes and ours, with no decisions of its own.

vast.ai's CLI parses the search query on the client and posts it as JSON with its own units
(RAM in MB, duration in seconds), and reads rows with its own field names and units back. This
module turns those bodies into what ``offer_query`` and ``RentalRequest`` take, and our rows
into the fields the CLI's tables print. Anything vast.ai has that we cannot honour is refused
(``Refused``) naming the option, never dropped.
"""

from __future__ import annotations

import math
import re
from typing import Any

from billing.money import MICRO_PER_DOLLAR
from marketplace.models import Offer
from marketplace.vast.errors import Refused
from scheduler.models import Instance, InstanceState, LaunchMode

# --- offers ----------------------------------------------------------------------------------

# vast.ai's CLI multiplies these before sending (offers_mult in vastai/api/query.py); ours are
# GB and days.
VAST_UNITS = {"cpu_ram": 1000.0, "gpu_ram": 1000.0, "gpu_total_ram": 1000.0, "duration": 86400.0}
# The CLI's default filters, which every search sends. What they ask for holds for every offer
# here (no offer is "external", and search shows free units only), so they are no filter.
ALWAYS_TRUE = {("external", False), ("rented", False)}
# Fields of the CLI's search body that are not filters.
SEARCH_OPTIONS = {"order", "type", "limit", "allocated_storage", "disable_bundling"}
ON_DEMAND = "on-demand"


def offer_filters(body: dict[str, Any]) -> dict[str, Any]:
    """The CLI's ``POST /bundles/`` body → ``offer_query.parse_json``'s body."""
    if not isinstance(body, dict):
        raise Refused('The search body is a JSON object, like {"num_gpus": {"gte": 1}}.')
    offer_type = body.get("type", ON_DEMAND)
    if offer_type != ON_DEMAND:
        raise Refused(
            f"Only on-demand offers exist here; '{offer_type}' (interruptible or reserved) "
            "rentals are not offered yet. Search with --type on-demand.",
            field="type",
        )
    filters: dict[str, Any] = {}
    for name, condition in body.items():
        if name in SEARCH_OPTIONS:
            continue
        if _always_true(name, condition):
            continue
        if name == "driver_version":
            raise Refused(
                "driver_version cannot be searched through the vast.ai CLI here (it sends the "
                "version as a number); search our API with driver_version=535.86.05 instead.",
                field="driver_version",
            )
        filters[name] = _in_our_units(name, condition)
    order = body.get("order")
    if order:
        filters["order"] = order
    if "limit" in body:
        filters["limit"] = body["limit"]
    return filters


def _always_true(name: str, condition: Any) -> bool:
    return (
        isinstance(condition, dict)
        and set(condition) == {"eq"}
        and (name, condition["eq"]) in ALWAYS_TRUE
    )


def _in_our_units(name: str, condition: Any) -> Any:
    divisor = VAST_UNITS.get(name)
    if divisor is None or not isinstance(condition, dict):
        return condition
    return {op: _divided(value, divisor, name) for op, value in condition.items()}


def _divided(value: Any, divisor: float, name: str) -> Any:
    if isinstance(value, list):
        return [_divided(item, divisor, name) for item in value]
    try:
        number = float(value)
    except (TypeError, ValueError):
        return value  # offer_query says what is wrong with it, naming the field
    if not math.isfinite(number):
        return value
    return round(number / divisor, 6)


def offer_row(offer: Offer) -> dict[str, Any]:
    """An offer as the CLI's ``search offers`` table reads it (vast.ai's units)."""
    return {
        "id": offer.machine_id,
        "ask_contract_id": offer.machine_id,
        "machine_id": offer.machine_id,
        "host_id": offer.provider_team_id,
        "gpu_name": offer.gpu_name,
        "num_gpus": offer.num_gpus,
        "min_gpus": offer.min_gpus,
        "total_gpus": offer.total_gpus,
        "gpu_ram": round(offer.gpu_ram * 1000, 1),
        "gpu_total_ram": round(offer.gpu_ram * offer.num_gpus * 1000, 1),
        "cpu_cores_effective": round(offer.cpu_cores_per_unit * offer.num_gpus, 2),
        "cpu_ram": round(offer.cpu_ram_per_unit * offer.num_gpus * 1000, 1),
        "disk_space": round(offer.disk_per_unit * offer.num_gpus, 1),
        "dph_total": offer.dph_total / MICRO_PER_DOLLAR,
        "dph_base": offer.dph_total / MICRO_PER_DOLLAR,
        "storage_cost": offer.storage_cost / MICRO_PER_DOLLAR,
        "reliability": float(offer.reliability),
        "reliability2": float(offer.reliability),
        "duration": seconds_until(offer.end_date),
        "end_date": offer.end_date.timestamp() if offer.end_date else None,
        "geolocation": offer.geolocation,
        "driver_version": offer.driver_version,
        "cuda_max_good": float(offer.cuda_max_good),
        "verified": offer.verified,
        "verification": "verified" if offer.verified else "unverified",
        "rentable": offer.rentable,
        "rented": False,
        "external": False,
        "score": float(offer.score),
    }


def seconds_until(moment) -> float | None:
    from django.utils import timezone

    if moment is None:
        return None
    return max((moment - timezone.now()).total_seconds(), 0.0)


# --- renting ---------------------------------------------------------------------------------

# How long a rental made through the CLI holds credit for. vast.ai bills until destroyed; here
# a rental has an end and a hold, so the CLI's rentals last a day (or until the machine's end
# date, if sooner) and are extended through /api/v1/instances/<id>/extend/.
CLI_RENTAL_HOURS = 24.0
# vast.ai's runtypes: "args" runs the image's entrypoint; the ssh and jupyter ones start the
# image's sshd or Jupyter (ours need them in the image).
RUNTYPE_MODES = {
    "args": LaunchMode.ENTRYPOINT,
    "ssh": LaunchMode.SSH,
    "ssh_proxy": LaunchMode.SSH,
    "ssh_direc ssh_proxy": LaunchMode.SSH,
    "jupyter_proxy ssh_proxy": LaunchMode.JUPYTER,
    "jupyter_direc ssh_direc ssh_proxy": LaunchMode.JUPYTER,
}
# Options of ``create instance`` this marketplace has no room for, by the CLI's flag: set, they
# are refused rather than dropped.
UNSUPPORTED_CREATE_OPTIONS = {
    "price": ("--bid_price", "interruptible (bid) rentals are not offered yet"),
    "label": ("--label", "instances have no label here yet"),
    "image_login": ("--login", "private registry logins go through /api/v1/instances/"),
    "template_hash_id": ("--template_hash", "there are no templates here"),
    "user": ("--user", "containers run as the image's user"),
    "python_utf8": ("--python-utf8", "images run unchanged"),
    "lang_utf8": ("--lang-utf8", "images run unchanged"),
    "use_jupyter_lab": ("--jupyter-lab", "Jupyter mode starts the image's own Jupyter"),
    "jupyter_dir": ("--jupyter-dir", "Jupyter mode starts the image's own Jupyter"),
    "volume_info": ("--create-volume/--link-volume", "volumes are not offered through v0"),
    "extra": ("--extra", "it has no meaning here"),
}
PORT = re.compile(r"^(?:(\d{1,5}):)?(\d{1,5})(?:/(tcp|udp))?$")


def rental_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The CLI's ``PUT /asks/<id>/`` body → RentSerializer's fields (less machine, GPUs and
    hours, which come from the offer)."""
    if not isinstance(body, dict):
        raise Refused('The request body is a JSON object, like {"image": "ubuntu"}.')
    for key, (flag, why) in UNSUPPORTED_CREATE_OPTIONS.items():
        if body.get(key) not in (None, False, "", {}, []):
            raise Refused(f"{flag} is not supported: {why}.", field=flag.lstrip("-"))
    runtype = body.get("runtype") or "ssh"
    mode = RUNTYPE_MODES.get(runtype)
    if mode is None:
        raise Refused(f"Unknown launch type '{runtype}'.", field="runtype")
    env, ports = split_env(body.get("env") or {})
    fields: dict[str, Any] = {
        "image": body.get("image") or "",
        "disk_gb": disk_gb(body.get("disk", 10)),
        "launch_mode": mode,
        "env": env,
        "ports": ports,
    }
    onstart = body.get("onstart") or ""
    if mode == LaunchMode.ENTRYPOINT:
        # vast.ai's args launch: --onstart-cmd (or --entrypoint) replaces the image's
        # entrypoint and --args are its arguments, each one argv element as given.
        fields["entrypoint"] = onstart
        args = body.get("args") or []
        if not isinstance(args, list):
            raise Refused("args is a list of arguments.", field="args")
        fields["args"] = args
    elif onstart:
        raise Refused(
            "--onstart-cmd runs here only as the entrypoint of an --args launch; SSH and "
            "Jupyter launches start the image's own sshd or Jupyter and run no onstart script.",
            field="onstart-cmd",
        )
    return fields


def disk_gb(value: Any) -> Any:
    """vast.ai's disk is a float of GB; ours is whole GB (rounded up, so never less)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return value  # the serializer names the field and the reason
    if not math.isfinite(number) or number <= 0:
        return value
    return math.ceil(number)


def split_env(env: Any) -> tuple[dict[str, str], list[int]]:
    """The CLI's env dict (its ``--env '-p 8080:8080 -e K=V'`` parsed into ``{"-p 8080:8080":
    "1", "K": "V"}``) → our env and the container ports to publish. The host side of a port
    mapping is the platform's choice here, as vast.ai's own mappings usually are."""
    if not isinstance(env, dict):
        raise Refused("env is an object of NAME: value.", field="env")
    variables: dict[str, str] = {}
    ports: list[int] = []
    for key, value in env.items():
        key = str(key)
        if key.startswith("-p "):
            ports.append(container_port(key[3:].strip()))
        elif key.startswith("-"):
            flag = key.split()[0]
            raise Refused(
                f"--env option '{flag}' is not supported: only -e NAME=value and -p PORT:PORT.",
                field="env",
            )
        else:
            variables[key] = value if isinstance(value, str) else str(value)
    return variables, sorted(set(ports))


def container_port(mapping: str) -> int:
    match = PORT.match(mapping)
    if not match:
        raise Refused(f"'-p {mapping}' is not a port mapping like 8080:8080.", field="env")
    if match.group(3) == "udp":
        raise Refused(f"'-p {mapping}': only TCP ports are published here.", field="env")
    return int(match.group(2))


# --- instances -------------------------------------------------------------------------------

# vast.ai's status words where ours differ; the CLI prints them as they come.
VAST_STATUS = {InstanceState.LAUNCHING: "loading"}


def instance_row(instance: Instance, connection: dict[str, Any]) -> dict[str, Any]:
    """An instance as ``show instance`` reads it (``start_date`` and ``extra_env`` are
    required by the CLI; the rest fill its table)."""
    rental = instance.rental
    machine = instance.machine
    offer = getattr(machine, "offer", None)
    ports = connection.get("ports") or []
    ssh = next((p for p in ports if p["container_port"] == 22), None)
    units = instance.gpu_count
    return {
        "id": instance.pk,
        "machine_id": instance.machine_id,
        "host_id": machine.team_id,
        "actual_status": VAST_STATUS.get(instance.state, instance.state),
        "intended_status": instance.state,
        "cur_state": instance.state,
        "status_msg": instance.status_message,
        "num_gpus": units,
        "gpu_name": offer.gpu_name if offer else "",
        "gpu_util": None,
        "cpu_cores_effective": float(machine.unit_cpus * units),
        "cpu_ram": float(machine.unit_memory_mb * units),
        "disk_space": float(instance.disk_gb),
        "ssh_host": machine.address if ssh else None,
        "ssh_port": ssh["host_port"] if ssh else None,
        "public_ipaddr": machine.address,
        "ports": {
            f"{p['container_port']}/{p['protocol']}": [
                {"HostIp": machine.address, "HostPort": str(p["host_port"])}
            ]
            for p in ports
        },
        "dph_total": rental.price_per_gpu_hour * rental.gpu_count / MICRO_PER_DOLLAR,
        "storage_cost": rental.storage_price_per_gb_month / MICRO_PER_DOLLAR,
        "image_uuid": instance.image,
        "image_args": list(instance.args or []),
        "image_runtype": runtype_of(instance.launch_mode),
        "onstart": instance.entrypoint,
        "extra_env": [[key, value] for key, value in (instance.env or {}).items()],
        "label": None,
        "geolocation": machine.location,
        "reliability2": float(machine.reliability),
        "inet_up": None,
        "inet_down": None,
        "start_date": rental.starts_at.timestamp(),
        "end_date": rental.ends_at.timestamp(),
        "uptime_mins": None,
        "jupyter_token": instance.jupyter_token or None,
        "ssh_line": connection.get("ssh"),
        "jupyter_url": connection.get("jupyter"),
    }


def runtype_of(mode: str) -> str:
    return {LaunchMode.ENTRYPOINT: "args", LaunchMode.SSH: "ssh", LaunchMode.JUPYTER: "jupyter"}[
        LaunchMode(mode)
    ]
