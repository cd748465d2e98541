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
from hosts.countries import COUNTRY_NAMES
from marketplace.models import Offer
from marketplace.models.rentals import machine_offer
from marketplace.vast.errors import Refused
from scheduler.models import Instance, InstanceState, LaunchMode

# --- offers ----------------------------------------------------------------------------------

# vast.ai's CLI multiplies these before sending (offers_mult in vastai/api/query.py); ours are
# GB and days.
VAST_UNITS = {"cpu_ram": 1000.0, "gpu_ram": 1000.0, "gpu_total_ram": 1000.0, "duration": 86400.0}
# The CLI's default filters, which every search sends. What they ask for holds for every offer
# here (no offer is "external"), so it is no filter. (``rented`` is a field: a bundle whose
# GPUs are partly rented; ``rented=false``, the default, keeps them out.)
ALWAYS_TRUE = {("external", False)}
# Fields of the CLI's search body that are not filters.
SEARCH_OPTIONS = {"order", "type", "limit", "allocated_storage", "disable_bundling"}
ON_DEMAND = "on-demand"
BID = "bid"  # interruptible rentals


def offer_filters(body: dict[str, Any]) -> dict[str, Any]:
    """The CLI's ``POST /bundles/`` body → ``offer_query.parse_json``'s body."""
    if not isinstance(body, dict):
        raise Refused('The search body is a JSON object, like {"num_gpus": {"gte": 1}}.')
    offer_type = body.get("type") or ON_DEMAND
    if offer_type not in (ON_DEMAND, BID):
        raise Refused(
            f"Offers here are on-demand or interruptible (bid); '{offer_type}' rentals are "
            "not offered. Search with --type on-demand or --type bid.",
            field="type",
        )
    filters: dict[str, Any] = {}
    if offer_type == BID:
        filters["min_bid"] = {"gte": 0}  # machines that take bids
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
        "id": offer.pk,
        "ask_contract_id": offer.pk,
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
        "dph_per_gpu": offer.price_per_gpu_hour / MICRO_PER_DOLLAR,
        "storage_cost": offer.storage_cost / MICRO_PER_DOLLAR,
        "reliability": float(offer.reliability),
        "reliability2": float(offer.reliability),
        "duration": seconds_until(offer.end_date),
        "end_date": offer.end_date.timestamp() if offer.end_date else None,
        "geolocation": vast_geolocation(offer.geolocation),
        "driver_version": offer.driver_version,
        "cuda_max_good": float(offer.cuda_max_good),
        "verified": offer.verified,
        "verification": "verified" if offer.verified else "unverified",
        "rentable": offer.rentable,
        "rented": offer.rented,
        "cpu_cores": offer.cpu_cores,
        "datacenter": offer.datacenter,
        "static_ip": offer.static_ip,
        "direct_port_count": offer.direct_port_count,
        "external": False,
        "score": float(offer.score),
        # The lowest bid for the offer's GPUs, per hour, as --bid_price takes it.
        "min_bid": None
        if offer.min_bid is None
        else offer.min_bid * offer.num_gpus / MICRO_PER_DOLLAR,
        "is_bid": offer.min_bid is not None,
        # Measured (hosts.benchmark), in vast.ai's units: TFLOPS, ×100, GB/s, Mbit/s, MB/s.
        "total_flops": float(offer.total_flops),
        "compute_cap": offer.compute_cap,
        "gpu_mem_bw": float(offer.gpu_mem_bw),
        "dlperf": float(offer.dlperf),
        "dlperf_per_dphtotal": float(offer.dlperf_per_dphtotal),
        "inet_up": float(offer.inet_up),
        "inet_down": float(offer.inet_down),
        "disk_bw": float(offer.disk_bw),
    }


def vast_geolocation(code: str) -> str:
    """A region (a country code) as vast.ai writes ``geolocation``: "Germany, DE", the place
    before the code its search filters by (``geolocation in [DE]``); empty when unset."""
    name = COUNTRY_NAMES.get(code)
    return f"{name}, {code}" if name else code


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
    "image_login": ("--login", "private registry logins go through /api/v1/instances/"),
    "user": ("--user", "containers run as the image's user"),
    "python_utf8": ("--python-utf8", "images run unchanged"),
    "lang_utf8": ("--lang-utf8", "images run unchanged"),
    "use_jupyter_lab": ("--jupyter-lab", "Jupyter mode starts the image's own Jupyter"),
    "jupyter_dir": ("--jupyter-dir", "Jupyter mode starts the image's own Jupyter"),
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
    mode = RUNTYPE_MODES.get(runtype) if isinstance(runtype, str) else None
    if mode is None:
        raise Refused(f"Unknown launch type '{str(runtype)[:40]}'.", field="runtype")
    env, ports = split_env(body.get("env") or {})
    fields: dict[str, Any] = {
        "image": body.get("image") or "",
        "disk_gb": disk_gb(body.get("disk", 10)),
        "launch_mode": mode,
        "env": env,
        "ports": ports,
    }
    if body.get("label"):
        if not isinstance(body["label"], str):
            raise Refused("label is text.", field="label")
        fields["label"] = body["label"]
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
        elif isinstance(value, str):
            variables[key] = value
        elif isinstance(value, int | float) and not isinstance(value, bool):
            variables[key] = str(value)  # a script's {"N": 4}: the text a shell would see
        else:
            raise Refused(
                f"env {key[:40]}'s value is text, not {type(value).__name__}.", field="env"
            )
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
    offer = machine_offer(machine)
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
        "is_bid": rental.interruptible,
        "min_bid": rental.price_per_gpu_hour * rental.gpu_count / MICRO_PER_DOLLAR
        if rental.interruptible
        else None,
        "storage_cost": rental.storage_price_per_gb_month / MICRO_PER_DOLLAR,
        "image_uuid": instance.image,
        "image_args": list(instance.args or []),
        "image_runtype": runtype_of(instance.launch_mode),
        "onstart": instance.entrypoint,
        "extra_env": [[key, value] for key, value in (instance.env or {}).items()],
        "label": instance.label or None,
        "geolocation": vast_geolocation(machine.location),
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


# --- hosting ---------------------------------------------------------------------------------


def machine_row(machine) -> dict[str, Any]:
    """A machine as ``show machines`` reads it."""
    offer = machine_offer(machine)
    free = offer.num_gpus if offer else 0
    total = machine.gpu_count
    return {
        "id": machine.pk,
        "hostname": machine.name,
        "num_gpus": total,
        "gpu_name": offer.gpu_name if offer else "",
        "disk_space": machine.disk_free_gb,
        "driver_version": machine.driver_version or "",
        "reliability2": float(machine.reliability),
        "verification": "verified" if machine.verified else "unverified",
        "public_ipaddr": machine.address,
        "geolocation": vast_geolocation(machine.location),
        "num_reports": 0,
        "status": machine.status,
        "listed": machine.listed,
        "listed_gpu_cost": machine.price_per_gpu_hour / MICRO_PER_DOLLAR,
        "listed_storage_cost": machine.storage_price_per_gb_month / MICRO_PER_DOLLAR,
        "min_chunk": machine.min_gpus,
        "end_date": machine.end_date.timestamp() if machine.end_date else None,
        "min_bid_price": None
        if machine.min_bid_price_per_gpu_hour is None
        else machine.min_bid_price_per_gpu_hour / MICRO_PER_DOLLAR,
        "credit_discount_max": None,
        "listed_inet_up_cost": None,
        "listed_inet_down_cost": None,
        "gpu_occupancy": f"{total - free}/{total}" if machine.listed else "unlisted",
    }


# ``list machine`` options we have no room for, by the CLI's flag.
UNSUPPORTED_LISTING_OPTIONS = {
    "price_inetu": ("-u/--price_inetu", "bandwidth is not charged here"),
    "price_inetd": ("-d/--price_inetd", "bandwidth is not charged here"),
    "credit_discount_max": ("-r/--discount_rate", "there are no prepay discounts here"),
    "duration": ("-l/--duration", "give an end date (-e) instead"),
    "vol_size": ("-v/--vol_size", "volume offers are not made through v0"),
    "vol_price": ("-z/--vol_price", "volume offers are not made through v0"),
}


def listing_terms(body: dict[str, Any], machine) -> dict[str, Any]:
    """``list machine``'s body → ``machine_set_terms``' arguments; what it leaves out stays as
    the machine has it."""
    from billing.errors import InvalidAmount
    from billing.money import parse_usd

    for key, (flag, why) in UNSUPPORTED_LISTING_OPTIONS.items():
        if body.get(key) is not None:
            raise Refused(f"{flag} is not supported: {why}.", field=flag.split("/")[-1])

    def dollars(key: str, flag: str, current: int) -> int:
        value = body.get(key)
        if value is None:
            return current
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise Refused(f"{flag}: a price in dollars, like 0.45.", field=flag)
        try:
            return parse_usd(f"{value:.6f}", field=flag)
        except InvalidAmount as error:
            raise Refused(f"{flag}: {error}", field=flag) from None

    min_gpus = body.get("min_chunk")
    if min_gpus is None:
        min_gpus = machine.min_gpus
    if isinstance(min_gpus, bool) or not isinstance(min_gpus, int):
        raise Refused("-m/--min_chunk: a whole number of GPUs.", field="min_chunk")
    return {
        "price_per_gpu_hour": dollars("price_gpu", "--price_gpu", machine.price_per_gpu_hour),
        "storage_price_per_gb_month": dollars(
            "price_disk", "--price_disk", machine.storage_price_per_gb_month
        ),
        "min_gpus": min_gpus,
        "end_date": epoch_moment(body.get("end_date"), "--end_date", machine.end_date),
        "location": machine.location,
        "min_bid_price_per_gpu_hour": dollars(
            "price_min_bid", "--price_min_bid", machine.min_bid_price_per_gpu_hour
        ),
    }


def bid_per_gpu(value: Any, gpus: int, flag: str) -> int:
    """A vast.ai bid (dollars per hour for the whole instance, as ``--bid_price`` and
    ``change bid --price`` take it) → our bid per GPU-hour in micro-dollars, rounded half up."""
    from billing.errors import InvalidAmount
    from billing.money import parse_usd

    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Refused(f"{flag}: a price in dollars per hour, like 0.45.", field=flag.lstrip("-"))
    try:
        whole = parse_usd(f"{value:.6f}", field=flag)
    except InvalidAmount as error:
        raise Refused(f"{flag}: {error}", field=flag.lstrip("-")) from None
    gpus = max(gpus, 1)
    return (whole + gpus // 2) // gpus


def epoch_moment(value: Any, flag: str, current=None):
    """Seconds since 1970 (the CLI converts dates to them) → an aware datetime."""
    from datetime import UTC, datetime

    if value is None:
        return current
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Refused(f"{flag}: a date (the CLI sends seconds since 1970).", field=flag)
    if not 0 < value < 32503680000:  # before the year 3000
        raise Refused(f"{flag}: a date between 1970 and 3000.", field=flag)
    return datetime.fromtimestamp(value, UTC)


def maintenance_window(body: dict[str, Any]):
    """``schedule maint``'s start (epoch seconds) and duration (hours) → start and end."""
    from datetime import timedelta

    starts_at = epoch_moment(body.get("sdate"), "--sdate")
    if starts_at is None:
        raise Refused("--sdate: give the start (seconds since 1970).", field="sdate")
    hours = body.get("duration")
    if isinstance(hours, bool) or not isinstance(hours, int | float) or not math.isfinite(hours):
        raise Refused("--duration: the window's length in hours.", field="duration")
    if not 0 < hours <= 24 * 365:
        raise Refused("--duration: more than 0 and at most a year of hours.", field="duration")
    return starts_at, starts_at + timedelta(hours=hours)


def maintenance_row(window) -> dict[str, Any]:
    """A maintenance window as ``show maints`` prints it."""
    return {
        "id": window.pk,
        "machine_id": window.machine_id,
        "start_time": window.starts_at.timestamp(),
        "end_time": window.ends_at.timestamp(),
        "duration_hours": round((window.ends_at - window.starts_at).total_seconds() / 3600, 2),
        "maintenance_category": window.note or "not provided",
    }


def earnings_row(key: str, rows: list) -> dict[str, Any]:
    return {
        "key": key,
        "gross": sum(row.gross for row in rows) / MICRO_PER_DOLLAR,
        "fee": sum(row.fee for row in rows) / MICRO_PER_DOLLAR,
        "net": sum(row.net for row in rows) / MICRO_PER_DOLLAR,
    }


# --- the instance list -----------------------------------------------------------------------

OUR_STATUS = {vast: ours for ours, vast in VAST_STATUS.items()}


def instance_filters(select_filters: Any) -> dict[str, Any]:
    """``show instances --status running loading`` → a filter on our states. The CLI's other
    filters (labels, verification, GPU model) are refused: this list filters by state only."""
    if select_filters in (None, {}):
        return {}
    if not isinstance(select_filters, dict):
        raise Refused("select_filters is an object.", field="select_filters")
    unknown = sorted(set(select_filters) - {"actual_status"})
    if unknown:
        raise Refused(
            f"show instances filters by --status only here, not by {', '.join(unknown)}.",
            field="select_filters",
        )
    wanted = select_filters["actual_status"]
    statuses = wanted.get("in") if isinstance(wanted, dict) else None
    if not isinstance(statuses, list) or not all(isinstance(s, str) for s in statuses):
        raise Refused('--status: a list of statuses, like {"in": ["running"]}.', field="status")
    return {"state__in": [OUR_STATUS.get(s, s) for s in statuses]}


def instance_order_descending(order_by: Any) -> bool:
    """The CLI's order (``[{"col": "id", "dir": "asc"}]``): by id only, either way."""
    if order_by in (None, []):
        return False
    if not isinstance(order_by, list) or not all(isinstance(o, dict) for o in order_by):
        raise Refused('order_by is a list like [{"col": "id", "dir": "asc"}].', field="order_by")
    first = order_by[0]
    if first.get("col") != "id" or first.get("dir", "asc") not in ("asc", "desc"):
        raise Refused("show instances sorts by id only here.", field="order_by")
    return first.get("dir") == "desc"
