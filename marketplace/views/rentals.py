"""Renter console: offers, renting, instances (live), logs, exec, SSH keys."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import OuterRef, Subquery
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing.money import format_amount, format_usd
from hosts.runtime import CommandFailed, HostUnreachable
from marketplace import offer_query, selectors
from marketplace.deployments.conditions import listed_gpu_models
from marketplace.forms.rentals import (
    BidForm,
    ExecForm,
    ExtendForm,
    NewVersionForm,
    RentForm,
    SshKeyForm,
    SshKeyRemoveForm,
)
from marketplace.models import Offer, Role, SshKey, Volume, VolumeState
from marketplace.rentals.actions import (
    rental_continue,
    rental_destroy_request,
    rental_exec,
    rental_pause,
    rental_restart,
    rental_start,
    rental_stop_request,
)
from marketplace.rentals.bids import rental_bid_change
from marketplace.rentals.clocks import ENDED_STATES
from marketplace.rentals.extending import rental_extend
from marketplace.rentals.metering import rental_owed
from marketplace.rentals.renting import rental_create
from marketplace.rentals.versions import (
    rental_commit,
    rental_new_version,
    rental_rollback,
    rental_version_delete,
)
from marketplace.selectors import instance_connection
from marketplace.services.pricing import quote_at
from marketplace.services.ssh_keys import ssh_key_add
from marketplace.tenancy import team_object_or_404, team_objects
from marketplace.views.console import error_text, require_role
from marketplace.views.offer_figures import offer_figures
from marketplace.views.templates import template_for_rent
from scheduler import services as scheduler
from scheduler.models import Instance, InstanceEvent, InstanceState, LaunchMode

SORTS = [
    ("score-", "Best value"),
    ("dph_total", "Price, low to high"),
    ("dph_total-", "Price, high to low"),
    ("reliability-", "Reliability"),
    ("num_gpus-", "Most GPUs"),
    ("gpu_ram-", "Most GPU memory"),
]


def _query_text(request: HttpRequest) -> str:
    """The search box text, plus the filter form's fields as terms."""
    parts = [request.GET.get("q", "").strip()]
    form_terms = {
        "gpu_name": "gpu_name={}",
        "gpus": "num_gpus={}",
        "min_gpus": "num_gpus>={}",
        "max_price": "dph_total<={}",
        "min_reliability": "reliability>={}",
        "geolocation": "geolocation={}",
    }
    for name, template in form_terms.items():
        value = request.GET.get(name, "").strip()
        if value:
            parts.append(template.format(value.replace(" ", "_")))
    sort = request.GET.get("sort", "")
    if sort and "-o " not in parts[0]:
        parts.append(f"-o {sort}")
    return " ".join(p for p in parts if p)


# The console's GPU-count choices: the bundle sizes most machines offer.
GPU_COUNTS = [1, 2, 4, 8]
OFFERS_PER_PAGE = 64
# Far past any market; keeps the database OFFSET in range (a larger page shows this one).
MAX_OFFER_PAGE = 100_000


def _page_number(request: HttpRequest) -> int:
    try:
        return min(max(int(request.GET.get("page", 1)), 1), MAX_OFFER_PAGE)
    except ValueError:
        return 1


def _page_link(request: HttpRequest, page: int) -> str:
    params = request.GET.copy()
    params["page"] = str(page)
    return "?" + params.urlencode()


@login_required
def offers(request: HttpRequest) -> HttpResponse:
    text = _query_text(request)
    page = _page_number(request)
    start = (page - 1) * OFFERS_PER_PAGE
    error = None
    found: list[Offer] = []
    try:
        query = offer_query.parse(text)
        # One row past the page says whether there is a next page, without a count(*).
        found = list(
            offer_query.apply(Offer.objects.all(), query)[start : start + OFFERS_PER_PAGE + 1]
        )
    except offer_query.QueryError as exc:
        error = str(exc)
    has_next = len(found) > OFFERS_PER_PAGE
    found = found[:OFFERS_PER_PAGE]
    context = {
        "offers": found,
        "page": page,
        "first_shown": start + 1,
        "last_shown": start + len(found),
        "first_link": _page_link(request, 1),
        "previous_link": _page_link(request, page - 1) if page > 1 else None,
        "next_link": _page_link(request, page + 1) if has_next else None,
        "query_text": request.GET.get("q", ""),
        "error": error,
        "sorts": SORTS,
        # Listed models and their families ("A100" beside "A100-SXM4-80GB"), as the
        # query language matches them.
        "gpu_names": listed_gpu_models(),
        "regions": Offer.objects.filter(rentable=True)
        .exclude(geolocation="")
        .order_by("geolocation")
        .values_list("geolocation", flat=True)
        .distinct(),
        "params": request.GET,
        "fields": offer_query.FIELDS,
        "gpu_counts": GPU_COUNTS,
        "launch_modes": LaunchMode.choices,
        "can_rent": request.membership.allows(Role.MEMBER),
        "volumes": team_objects(
            request.team, Volume.objects.filter(state=VolumeState.READY)
        ).select_related("machine"),
        "has_ssh_keys": team_objects(request.team, SshKey.objects.all()).exists(),
        "from_template": template_for_rent(request),
    }
    # A bad query is the renter's error: 400, with the position, token and reason shown.
    return render(request, "marketplace/offers.html", context, status=400 if error else 200)


@login_required
@require_POST
def rent(request: HttpRequest, machine_id: int) -> HttpResponse:
    require_role(request, Role.MEMBER)
    form = RentForm(request.POST, machine_id=machine_id)
    try:
        rented = rental_create(team=request.team, request=form.rental_request())
    except Exception as error:  # domain errors (402/409) and validation alike become a message
        if not hasattr(error, "http_status") and not isinstance(error, ValidationError):
            raise
        messages.error(request, f"Could not rent: {error_text(error)}")
        return redirect(request.META.get("HTTP_REFERER") or "offers")
    messages.success(request, "Rented. The container is launching; this page updates by itself.")
    return redirect("instance-detail", pk=rented.rental.instance_id)


# The instance list's views: what runs or can run again, what has ended, or both.
INSTANCE_LISTS = {"current": "Current", "ended": "Ended", "all": "All"}
# Ended rentals shown at most (the newest): the API lists them all, page by page.
ENDED_SHOWN = 200


def _ending(field: str):
    """The first event that ended the instance: its ``field`` (when, or why)."""
    return Subquery(
        InstanceEvent.objects.filter(instance=OuterRef("pk"), to_state__in=ENDED_STATES)
        .order_by("created_at", "pk")
        .values(field)[:1]
    )


def _team_instances(request: HttpRequest, shown: str = "current") -> list[Instance]:
    instances = team_objects(request.team, Instance.objects.select_related("rental", "machine"))
    if shown == "current":
        return list(instances.exclude(state__in=ENDED_STATES))
    if shown == "ended":
        instances = instances.filter(state__in=ENDED_STATES)
    ended = list(
        instances.annotate(ended_at=_ending("created_at"), end_reason=_ending("reason"))[
            :ENDED_SHOWN
        ]
    )
    now = timezone.now()
    for instance in ended:
        if instance.state in ENDED_STATES:
            rental = instance.rental
            instance.final_cost = rental_owed(rental, now).total
            instance.ran_for = timedelta(seconds=rental.gpu_seconds_at(now))
    return ended


@login_required
def instances(request: HttpRequest) -> HttpResponse:
    shown = request.GET.get("show", "current")
    if shown not in INSTANCE_LISTS:
        shown = "current"
    context = {
        "instances": _team_instances(request, shown),
        "shown": shown,
        "lists": INSTANCE_LISTS,
    }
    template = (
        "marketplace/_instance_rows.html"
        if request.headers.get("HX-Request")
        else "marketplace/instances.html"
    )
    return render(request, template, context)


def _ending_facts(instance: Instance, rental, now) -> dict[str, object]:
    """When and why an ended rental ended, how long its GPUs ran, and what it cost in all."""
    ending = instance.events.filter(to_state__in=ENDED_STATES).order_by("created_at", "pk").first()
    return {
        "ended_at": ending.created_at if ending else instance.state_changed_at,
        "end_reason": ending.reason if ending else instance.status_message,
        "ran_for": timedelta(seconds=rental.gpu_seconds_at(now)),
    }


def _instance_context(request: HttpRequest, instance: Instance) -> dict[str, object]:
    rental = instance.rental
    now = timezone.now()
    owed = rental_owed(rental, now)
    # The rental's own prices (its bid, or the machine's when it was rented), not today's.
    held = quote_at(
        price_per_gpu_hour=rental.price_per_gpu_hour,
        storage_price_per_gb_month=rental.storage_price_per_gb_month,
        gpu_count=rental.gpu_count,
        disk_gb=rental.disk_gb,
        hours=1,
    )
    versions = _versions_with_diff(instance)
    ended = instance.state in ENDED_STATES
    return {
        **(_ending_facts(instance, rental, now) if ended else {}),
        "instance": instance,
        "rental": rental,
        "connection": instance_connection(instance),
        "gpus": scheduler.instance_gpu_uuids(instance),
        "events": instance.events.all()[:50],
        "spent": format_amount(owed.total),
        "per_hour": format_usd(held.gpu),
        "storage_per_hour": format_usd(held.storage),
        "remaining": rental.ends_at - now if rental.ends_at > now else None,
        "bid_dollars": rental.price_per_gpu_hour / 1_000_000,
        "can_act": request.membership.allows(Role.MEMBER),
        "ended": ended,
        "versions": versions,
        "version_ports": next((v["spec"].get("ports", []) for v in versions if v["current"]), []),
        "versionable": instance.state in (InstanceState.RUNNING, InstanceState.EXITED),
    }


def _shown(value: object) -> str:
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in sorted(value.items())) or "(none)"
    if isinstance(value, list):
        return " ".join(shlex.quote(str(v)) for v in value) or "(none)"
    return str(value) or "(none)"


def _versions_with_diff(instance: Instance) -> list[dict]:
    """Newest first, each with what changed from the version before: (field, was, now)."""
    rows = selectors.rental_versions(instance)
    for before, row in zip([None, *rows], rows, strict=False):
        row["diff"] = (
            [
                (name, _shown(before["spec"].get(name)), _shown(row["spec"][name]))
                for name in row["changed"]
            ]
            if before
            else []
        )
    return rows[::-1]


def _new_version(request: HttpRequest, instance: Instance) -> None:
    changes = NewVersionForm(request.POST).changes()
    moved = rental_new_version(instance=instance, changes=changes, by=request.user.get_username())
    messages.success(
        request,
        f"Version {moved.version} is launching; the one before it is stopped and kept "
        "(it runs again if the new one cannot start).",
    )


def _rollback(request: HttpRequest, instance: Instance) -> None:
    number = _version_number(request)
    moved = rental_rollback(instance=instance, number=number, by=request.user.get_username())
    messages.success(request, f"Rolled back: version {moved.version} runs version {number}'s spec.")


def _delete_version(request: HttpRequest, instance: Instance) -> None:
    number = _version_number(request)
    rental_version_delete(instance=instance, number=number)
    messages.success(request, f"Version {number} and its container are deleted.")


def _commit(request: HttpRequest, instance: Instance) -> None:
    image = rental_commit(
        instance=instance,
        repository=request.POST.get("repository", ""),
        tag=request.POST.get("tag", "") or "latest",
        by=request.user.get_username(),
    )
    messages.success(
        request,
        f"Committed as {image.reference}: rent it on this machine (your team only).",
    )


def _version_number(request: HttpRequest) -> int:
    try:
        return int(request.POST.get("version", ""))
    except ValueError:
        raise ValidationError({"version": "A version number."}) from None


@login_required
def instance_detail(request: HttpRequest, pk: int) -> HttpResponse:
    instance = team_object_or_404(
        request.team, Instance.objects.select_related("rental", "machine"), pk=pk
    )
    context = _instance_context(request, instance)
    if request.headers.get("HX-Request"):
        return render(request, "marketplace/_instance_status.html", context)
    return render(request, "marketplace/instance_detail.html", context)


def _stop(request: HttpRequest, instance: Instance) -> None:
    rental_stop_request(instance=instance)
    messages.info(
        request,
        "Stopping: GPU time is no longer charged; the GPUs are free once the host has "
        "stopped the container. Storage is still charged.",
    )


def _start(request: HttpRequest, instance: Instance) -> None:
    started = rental_start(instance=instance)
    if started.state == InstanceState.LAUNCHING:
        messages.success(request, "Launching again; this page updates by itself.")
    else:
        messages.success(request, "Started.")


def _extend(request: HttpRequest, instance: Instance) -> None:
    hours = ExtendForm(request.POST).hours_value()
    rental_extend(rental=instance.rental, hours=hours)
    messages.success(request, f"Extended by {hours:g} hours.")


def _bid(request: HttpRequest, instance: Instance) -> None:
    bid = BidForm(request.POST).bid_value()
    rental = rental_bid_change(rental=instance.rental, bid=bid)
    where = "waiting to win its GPUs back" if rental.interrupted_at else "running"
    messages.success(request, f"Bid changed to {format_usd(bid)}/GPU-hour from now on ({where}).")


def _destroy(request: HttpRequest, instance: Instance) -> HttpResponse:
    rental_destroy_request(instance=instance)
    messages.info(
        request,
        "Destroying: the rental is settled now, and the container and its data are "
        "removed as soon as the host confirms.",
    )
    return redirect("instances")  # its page would only say it is gone


# The instance page's buttons, by the action in their URL. A handler says what happened in a
# message; it returns where to go next, or None to stay on the instance's page.
def _pause(request: HttpRequest, instance: Instance) -> None:
    rental_pause(instance=instance)
    messages.info(request, "Paused. Its GPUs stay allocated to you and are still charged.")


def _continue(request: HttpRequest, instance: Instance) -> None:
    rental_continue(instance=instance)
    messages.success(request, "Running again.")


def _restart(request: HttpRequest, instance: Instance) -> None:
    rental_restart(instance=instance)
    messages.success(request, "Restarted: its command runs again, with the same files.")


INSTANCE_ACTIONS: dict[str, Callable[[HttpRequest, Instance], HttpResponse | None]] = {
    "new-version": _new_version,
    "rollback": _rollback,
    "delete-version": _delete_version,
    "commit": _commit,
    "pause": _pause,
    "continue": _continue,
    "restart": _restart,
    "stop": _stop,
    "start": _start,
    "extend": _extend,
    "bid": _bid,
    "destroy": _destroy,
}


@login_required
@require_POST
def instance_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    require_role(request, Role.MEMBER)
    handler = INSTANCE_ACTIONS.get(action)
    if handler is None:
        raise Http404
    instance = team_object_or_404(
        request.team, Instance.objects.select_related("rental", "machine"), pk=pk
    )
    try:
        next_page = handler(request, instance)
    except (ValidationError, CommandFailed, HostUnreachable) as error:
        messages.error(request, error_text(error))
    except Exception as error:
        if not hasattr(error, "http_status"):
            raise
        messages.error(request, error_text(error))
    else:
        if next_page is not None:
            return next_page
    return redirect("instance-detail", pk=instance.pk)


@login_required
def instance_logs(request: HttpRequest, pk: int) -> HttpResponse:
    instance = team_object_or_404(request.team, Instance.objects.select_related("machine"), pk=pk)
    text, note = selectors.instance_logs(instance, tail=500)
    return render(request, "marketplace/_logs.html", {"logs": text, "note": note})


@login_required
@require_POST
def instance_exec(request: HttpRequest, pk: int) -> HttpResponse:
    require_role(request, Role.MEMBER)
    instance = team_object_or_404(request.team, Instance.objects.select_related("machine"), pk=pk)
    form = ExecForm(request.POST)
    try:
        command = form.command_text()
    except ValidationError:
        return render(request, "marketplace/_exec.html", {"error": form.refusal()})
    try:
        result = rental_exec(instance=instance, command=command)
    except (CommandFailed, HostUnreachable, scheduler.InvalidTransition) as error:
        return render(request, "marketplace/_exec.html", {"error": str(error)})
    return render(
        request,
        "marketplace/_exec.html",
        {
            "command": command,
            "exit_code": result.exit_code,
            "output": result.stdout + result.stderr,
        },
    )


def _ssh_key_remove(request: HttpRequest) -> None:
    key_id = SshKeyRemoveForm(request.POST).key_id()
    if key_id is None:
        raise Http404  # as for another team's key: there is no such key to remove
    key = team_object_or_404(request.team, SshKey.objects.all(), pk=key_id)
    key.delete()
    messages.success(request, f"Key {key.name} removed.")


def _ssh_key_add(request: HttpRequest) -> None:
    fields = SshKeyForm(request.POST).parsed()
    key = ssh_key_add(team=request.team, name=fields["name"], public_key=fields["public_key"])
    messages.success(request, f"Key {key.name} added ({key.fingerprint}).")


@login_required
def ssh_keys(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        require_role(request, Role.MEMBER)
        try:
            if request.POST.get("delete"):
                _ssh_key_remove(request)
            else:
                _ssh_key_add(request)
        except ValidationError as error:
            messages.error(request, error_text(error))
        return redirect("ssh-keys")
    return render(
        request,
        "marketplace/ssh_keys.html",
        {"keys": team_objects(request.team, SshKey.objects.all())},
    )


urlpatterns = [
    path("offers/", offers, name="offers"),
    path("offers/<id:machine_id>/rent/", rent, name="rent"),
    path("offers/<id:machine_id>/figures/", offer_figures, name="offer-figures"),
    path("instances/", instances, name="instances"),
    path("instances/<id:pk>/", instance_detail, name="instance-detail"),
    path("instances/<id:pk>/logs/", instance_logs, name="instance-logs"),
    path("instances/<id:pk>/exec/", instance_exec, name="instance-exec"),
    path("instances/<id:pk>/<str:action>/", instance_action, name="instance-action"),
    path("ssh-keys/", ssh_keys, name="ssh-keys"),
]
