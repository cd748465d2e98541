"""The vast.ai-compatible endpoints: vast's paths and shapes over the services /api/v1/ uses.

Every view authenticates and authorizes as /api/v1/ does (team API keys, roles, read-only
keys, renter/provider audiences), reaches objects through the tenancy gateway (another team's
id answers 404), and answers errors in ``errors.vast_exception_handler``'s shape.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.money import MICRO_PER_DOLLAR
from billing.selectors import team_balance
from marketplace import offer_query
from marketplace.api.fields import clamped_whole, dollars
from marketplace.api.offers import MAX_PAGE, search_offers
from marketplace.api.parsers import json_body
from marketplace.api.permissions import api_team
from marketplace.api.rent_requests import RentSerializer
from marketplace.models import ApiKey, Offer, SshKey
from marketplace.models.rentals import all_free_offers
from marketplace.rentals.actions import (
    instance_label,
    rental_destroy_request,
    rental_exec,
    rental_restart,
    rental_start,
    rental_stop_request,
)
from marketplace.rentals.bids import rental_bid_change, winning_bid
from marketplace.rentals.renting import MIN_RENTAL_HOURS, RentalRequest, rental_create
from marketplace.selectors import instance_connection, instance_logs
from marketplace.services.ssh_keys import (
    instance_ssh_key_attach,
    instance_ssh_key_detach,
    ssh_key_add,
)
from marketplace.tenancy import team_objects
from marketplace.vast import bulk, shapes
from marketplace.vast.errors import Refused, vast_exception_handler
from marketplace.vast.schema import VastSchema
from marketplace.vast.template_rent import rent_body_from_template
from marketplace.vast.volume_mounts import rent_with_volume, with_linked_volume
from scheduler.models import Instance, InstanceState
from scheduler.services import with_live_holdings

ANY_JSON = {"type": "object", "additionalProperties": True}


class VastView(APIView):
    """An endpoint of the vast.ai API: our auth and roles, vast's error shape."""

    schema = VastSchema()

    def get_exception_handler(self):
        return vast_exception_handler

    @property
    def team(self):
        return api_team(self.request)

    def body(self) -> dict[str, Any]:
        if not isinstance(self.request.data, dict):
            raise Refused("The request body is a JSON object.")
        return self.request.data


class RenterView(VastView):
    audience = "renter"

    def instance(self, pk: int) -> Instance:
        """The team's instance, or vast's 404 (another team's id included)."""
        found = (
            team_objects(self.team, Instance.objects.select_related("rental", "machine"))
            .prefetch_related(all_free_offers("machine__offers"))
            .exclude(state=InstanceState.DESTROYED)
            .filter(pk=pk)
            .first()
        )
        if found is None:
            raise NotFound(f"Instance {pk} is not one of your team's instances.")
        return found


# --- account ---------------------------------------------------------------------------------


class CurrentUser(VastView):
    """``vastai show user``: the team the key acts for, and its credit in dollars."""

    @extend_schema(summary="vast.ai: show user", responses={200: ANY_JSON})
    def get(self, request):
        team = self.team
        balance = team_balance(team.pk)
        creator = request.auth.created_by if isinstance(request.auth, ApiKey) else request.user
        available = balance.available / MICRO_PER_DOLLAR
        return Response(
            {
                "id": team.pk,
                "username": team.name,
                "fullname": team.name,
                "email": getattr(creator, "email", "") or "",
                "email_verified": None,
                "balance": available,
                "credit": available,
                "held": balance.held / MICRO_PER_DOLLAR,
                "can_pay": available > 0,
                "has_billing": False,
                "has_payout": False,
                "billing_creditonly": True,
            }
        )


# --- offers ----------------------------------------------------------------------------------


class Bundles(VastView):
    """``vastai search offers``: the CLI's parsed query, searched with our query language."""

    read_only_methods = frozenset({"POST"})  # a search with a JSON body
    throttle_scope = "offer_search"

    @extend_schema(
        summary="vast.ai: search offers",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def post(self, request):
        filters = shapes.offer_filters(self.body())
        limit = filters.pop("limit", 64)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
            raise Refused(f"--limit is between 1 and {MAX_PAGE}.", field="limit")
        try:
            found = search_offers(offer_query.parse_json(filters), limit, 0)
        except offer_query.QueryError as error:
            raise serializers.ValidationError({"query": str(error)}) from error
        return Response({"offers": [shapes.offer_row(offer) for offer in found]})


# --- instances -------------------------------------------------------------------------------


class Ask(RenterView):
    """``vastai create instance <offer id>``: rent the offer, a bundle: exactly its GPUs (409
    when they are no longer free)."""

    @extend_schema(
        summary="vast.ai: create instance",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def put(self, request, offer_id: int):
        def rent(body):
            return rental_create(team=self.team, request=rent_order(self.team, body, offer_id))

        rented = rent_with_volume(self, offer_id, rent)
        return Response({"success": True, "new_contract": rented.rental.instance_id})


class AskBulk(RenterView):
    """``vastai create instances <offer id>…``: one instance on each offer, same settings."""

    @extend_schema(
        summary="vast.ai: create instances",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def post(self, request):
        body = self.body()
        offer_ids = bulk.id_list(body, "ids")
        settings = {key: value for key, value in body.items() if key != "ids"}
        orders, rented_ids, failed = [], [], {}
        for offer_id in offer_ids:
            try:
                orders.append(rent_order(self.team, settings, offer_id))
                rented_ids.append(offer_id)
            except NotFound as error:
                failed[str(offer_id)] = str(error.detail)
        answer = bulk.rent_many(self.team, orders, rented_ids)
        if failed:  # offers that are not there: named beside what was rented
            answer.data.setdefault("failed", {}).update(failed)
            if not answer.data["success"]:
                answer.data["msg"] += " " + "; ".join(
                    f"offer {key}: {why}" for key, why in failed.items()
                )
        return answer


def rent_order(team, body: dict[str, Any], offer_id: int) -> RentalRequest:
    """The CLI's create body for one offer → what ``rental_create`` takes (400 naming the
    field for bad settings, 404 for an offer that is not there)."""
    if body.get("template_hash_id"):
        body = rent_body_from_template(team, body)
    body = with_linked_volume(body)  # --link-volume (a new one was made and linked already)
    fields = shapes.rental_fields(body)
    if body.get("volumes"):
        fields["volumes"] = body["volumes"]
    offer = Offer.objects.filter(pk=offer_id).first()  # a bundle: exactly its GPUs
    if offer is None:
        raise NotFound(f"There is no offer {offer_id}; search offers for current ids.")
    gpus = max(offer.num_gpus, offer.min_gpus, 1)
    if body.get("price") is not None:  # --bid_price: an interruptible rental
        fields["bid_price"] = dollars(shapes.bid_per_gpu(body["price"], gpus, "--bid_price"))
    params = RentSerializer(
        data={
            **fields,
            "machine_id": offer.machine_id,
            "num_gpus": gpus,
            "duration_hours": rental_hours(offer),
        }
    )
    params.is_valid(raise_exception=True)
    return params.rental_request()


def rental_hours(offer: Offer) -> float:
    """A day, or until the machine's end date when that comes sooner."""
    hours = shapes.CLI_RENTAL_HOURS
    if offer.end_date is not None:
        left = (offer.end_date - timezone.now()).total_seconds() / 3600
        hours = min(hours, max(round(left - 0.01, 2), MIN_RENTAL_HOURS))
    return hours


class InstanceDetail(RenterView):
    """``show instance`` (GET), ``stop/start/label instance`` (PUT), ``destroy instance``."""

    @extend_schema(summary="vast.ai: show instance", responses={200: ANY_JSON})
    def get(self, request, pk: int):
        instance = self.instance(pk)
        return Response({"instances": shapes.instance_row(instance, instance_connection(instance))})

    @extend_schema(
        summary="vast.ai: start, stop or label an instance",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def put(self, request, pk: int):
        instance = self.instance(pk)
        body = self.body()
        if "label" in body:
            label = body["label"]
            if not isinstance(label, str):
                raise Refused("label is text.", field="label")
            instance_label(instance=instance, label=label)
            return Response({"success": True})
        state = body.get("state")
        if state == "stopped":
            rental_stop_request(instance=instance)
        elif state == "running":
            rental_start(instance=instance)
        else:
            raise Refused('state is "running" (start) or "stopped" (stop).', field="state")
        return Response({"success": True})

    @extend_schema(summary="vast.ai: destroy instance", responses={200: ANY_JSON})
    def delete(self, request, pk: int):
        rental_destroy_request(instance=self.instance(pk))
        return Response({"success": True})


class InstanceReboot(RenterView):
    """``vastai reboot instance <id>``: the container restarts in place (same GPUs, ports and
    files; its command runs again)."""

    @extend_schema(
        summary="vast.ai: reboot instance",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def put(self, request, pk: int):
        rental_restart(instance=self.instance(pk))
        return Response({"success": True})


class InstanceBid(RenterView):
    """``vastai change bid <id> [--price P]``: P is dollars per hour for the whole instance
    (as vast.ai's docs say). Without it, "a winning bid price is used" (the CLI's help): the
    lowest bid that wins its GPUs now, or the rental's own bid when that is higher; a bid is
    never lowered by leaving out --price."""

    @extend_schema(
        summary="vast.ai: change bid",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def put(self, request, pk: int):
        instance = self.instance(pk)
        price = self.body().get("price")
        if price is None:
            bid = max(winning_bid(rental=instance.rental), instance.rental.price_per_gpu_hour)
        else:
            bid = shapes.bid_per_gpu(price, instance.rental.gpu_count, "--price")
        rental_bid_change(rental=instance.rental, bid=bid)
        return Response({"success": True})


class InstanceLogs(RenterView):
    """``vastai logs <id>``. vast.ai answers with a URL to poll; the log text comes in ``msg``
    here, which the CLI prints as it is."""

    read_only_methods = frozenset({"PUT"})  # reads the log; PUT is only the CLI's verb

    @extend_schema(
        summary="vast.ai: logs", request={"application/json": ANY_JSON}, responses={200: ANY_JSON}
    )
    def put(self, request, pk: int):
        instance = self.instance(pk)
        try:
            tail = clamped_whole(self.body().get("tail") or 1000, 1, 5000)
        except ValueError:
            raise Refused("--tail is a whole number of lines.", field="tail") from None
        if self.body().get("filter") or self.body().get("daemon_logs"):
            raise Refused("--filter and --daemon-logs are not supported.", field="filter")
        text, note = instance_logs(instance, tail=tail)
        return Response({"success": True, "msg": text or note})


class InstanceCommand(RenterView):
    """``vastai execute <id> '<cmd>'``: runs in the renter's own container (``sh -c``, at most
    30 s). The CLI prints this answer as it comes (it has no result URL to poll)."""

    @extend_schema(
        summary="vast.ai: execute",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def put(self, request, pk: int):
        instance = self.instance(pk)
        command = self.body().get("command")
        if not isinstance(command, str) or not command.strip():
            raise Refused("Give a command to run.", field="command")
        result = rental_exec(instance=instance, command=command)
        return Response({"output": result.stdout + result.stderr, "exit_code": result.exit_code})


# --- SSH keys --------------------------------------------------------------------------------


def ssh_key_row(key: SshKey) -> dict[str, Any]:
    return {
        "id": key.pk,
        "name": key.name,
        "key": key.public_key,
        "public_key": key.public_key,
        "fingerprint": key.fingerprint,
        "created_at": key.created_at.timestamp(),
    }


class SshKeys(VastView):
    """``create ssh-key`` (POST) and ``show ssh-keys`` (GET): the team's keys."""

    audience = "renter"

    @extend_schema(summary="vast.ai: show ssh-keys", responses={200: ANY_JSON})
    def get(self, request):
        keys = team_objects(self.team, SshKey.objects.order_by("pk"))
        return Response([ssh_key_row(key) for key in keys])

    @extend_schema(
        summary="vast.ai: create ssh-key",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def post(self, request):
        public_key = self.body().get("ssh_key")
        if not isinstance(public_key, str):
            raise Refused("ssh_key is one OpenSSH public key line.", field="ssh_key")
        parts = public_key.split()
        name = (parts[2] if len(parts) > 2 else "added with vastai")[:80]  # the comment
        key = ssh_key_add(team=self.team, name=name, public_key=public_key)
        return Response({"success": True, **ssh_key_row(key)})


class SshKeyDetail(VastView):
    audience = "renter"

    @extend_schema(summary="vast.ai: delete ssh-key", responses={200: ANY_JSON})
    def delete(self, request, pk: int):
        key = team_objects(self.team, SshKey.objects.all()).filter(pk=pk).first()
        if key is None:
            raise NotFound(f"SSH key {pk} is not one of your team's keys.")
        key.delete()  # as /api/v1/ssh-keys/ does: a key is only read at a launch
        return Response({"success": True})


class InstanceSshKeys(RenterView):
    """``vastai attach ssh <id> '<public key>'``: the key goes into the running SSH-mode
    instance now (and onto the team, as ``create ssh-key`` would)."""

    @extend_schema(
        summary="vast.ai: attach ssh",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def post(self, request, pk: int):
        instance = self.instance(pk)
        public_key = self.body().get("ssh_key")
        if not isinstance(public_key, str):
            raise Refused("ssh_key is one OpenSSH public key line.", field="ssh_key")
        parts = public_key.split()
        name = (parts[2] if len(parts) > 2 else "attached with vastai")[:80]
        key = instance_ssh_key_attach(instance=instance, public_key=public_key, name=name)
        return Response({"success": True, "msg": f"SSH key {key.pk} attached.", "key_id": key.pk})


class InstanceSshKey(RenterView):
    """``vastai detach ssh <id> <key id>``: the team's key leaves the running instance."""

    @extend_schema(summary="vast.ai: detach ssh", responses={200: ANY_JSON})
    def delete(self, request, pk: int, key_id: int):
        instance = self.instance(pk)
        key = team_objects(self.team, SshKey.objects.all()).filter(pk=key_id).first()
        if key is None:
            raise NotFound(f"SSH key {key_id} is not one of your team's keys.")
        instance_ssh_key_detach(instance=instance, key=key)
        return Response({"success": True, "msg": f"SSH key {key.pk} detached."})


# --- money -----------------------------------------------------------------------------------


class Invoices(VastView):
    """``vastai show invoices``: the team's usage charges and credit added, between ``sdate``
    and ``edate`` (epoch seconds)."""

    @extend_schema(summary="vast.ai: show invoices", responses={200: ANY_JSON})
    def get(self, request):
        from billing.models import AccountKind, Entry, TransferKind

        start, end = epoch_param(request, "sdate", 0.0), epoch_param(request, "edate", None)
        entries = team_objects(self.team, Entry.objects.select_related("transfer")).filter(
            created_at__gte=datetime.fromtimestamp(start, UTC)
        )
        if end is not None:
            entries = entries.filter(created_at__lte=datetime.fromtimestamp(end, UTC))
        charges = entries.filter(account_kind=AccountKind.HELD, transfer__kind=TransferKind.CAPTURE)
        payments = entries.filter(
            account_kind=AccountKind.AVAILABLE,
            transfer__kind__in=[TransferKind.TOPUP, TransferKind.GRANT],
        )
        rows = [invoice_row(entry, "charge", -entry.amount) for entry in charges.order_by("pk")]
        rows += [invoice_row(entry, "payment", entry.amount) for entry in payments.order_by("pk")]
        rows.sort(key=lambda row: row["timestamp"])
        charged = sum(row["amount"] for row in rows if row["type"] == "charge")
        return Response({"invoices": rows, "current": {"charges": round(charged, 6)}})


def invoice_row(entry, kind: str, micro: int) -> dict[str, Any]:
    reference = entry.transfer.reference
    instance_id = None
    if reference.startswith("rental:"):
        instance_id = int(reference.split(":", 1)[1]) if reference[7:].isdigit() else None
    return {
        "id": entry.pk,
        "type": kind,
        "description": entry.transfer.description or reference,
        "reference": reference,
        "instance_id": instance_id,
        "quantity": 1,
        "rate": micro / MICRO_PER_DOLLAR,
        "amount": micro / MICRO_PER_DOLLAR,
        "timestamp": entry.created_at.timestamp(),
    }


def epoch_param(request, name: str, default: float | None) -> float | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        raise Refused(f"{name} is a time in seconds since 1970.", field=name) from None
    if not 0 <= value < 1e11:
        raise Refused(f"{name} is a time in seconds since 1970.", field=name)
    return value


# --- the instance list -----------------------------------------------------------------------

MAX_LIST_PAGE = 100


class InstanceList(RenterView):
    """The team's instances, a page at a time, as ``vastai show instances`` reads them
    (``instances``, ``next_token``, ``total_instances``).

    The CLI 1.9.1 asks for this list at ``/api/v1/instances/`` (vast.ai's own v1 path), where
    our /api/v1/ answers in its own shape; ``for_vastai_cli`` below lets that route hand the
    CLI's requests here. Older CLIs and scripts ask ``GET /api/v0/instances/?owner=me``.
    """

    @extend_schema(summary="vast.ai: show instances", responses={200: ANY_JSON})
    def get(self, request):
        instances = team_objects(
            self.team,
            with_live_holdings(
                # The machines' GPUs too: a row's CPU and RAM per unit divide by their count.
                Instance.objects.select_related("rental", "machine").prefetch_related(
                    all_free_offers("machine__offers"), "machine__gpus"
                )
            ),
        ).exclude(state=InstanceState.DESTROYED)
        instances = instances.filter(
            **shapes.instance_filters(json_param(request, "select_filters"))
        )
        descending = shapes.instance_order_descending(json_param(request, "order_by"))
        total = instances.count()
        limit = whole_param(request, "limit", 25, 1, MAX_LIST_PAGE)
        after = whole_param(request, "after_token", None, 0, 2**63 - 1)
        if after is not None:
            instances = (
                instances.filter(pk__lt=after) if descending else instances.filter(pk__gt=after)
            )
        page = list(instances.order_by("-pk" if descending else "pk")[: limit + 1])
        more = len(page) > limit
        page = page[:limit]
        return Response(
            {
                "instances": [shapes.instance_row(i, instance_connection(i)) for i in page],
                "next_token": str(page[-1].pk) if more else None,
                "total_instances": total,
                "label_counts": {},
            }
        )

    @extend_schema(
        summary="vast.ai: start instances / stop instances",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def put(self, request):
        body = self.body()
        state = body.get("state")
        if state not in ("running", "stopped"):
            raise Refused('state is "running" (start) or "stopped" (stop).', field="state")
        return bulk.instances_to_state(self.team, bulk.id_list(body, "ids"), state)

    @extend_schema(
        summary="vast.ai: destroy instances",
        request={"application/json": ANY_JSON},
        responses={200: ANY_JSON},
    )
    def delete(self, request):
        ids = bulk.id_list(self.body(), "instance_ids")
        return bulk.instances_to_state(self.team, ids, "destroyed")


def for_vastai_cli(v1_list_view):
    """``GET /api/v1/instances/`` for both clients: the vastai CLI's request (it sends
    ``select_filters``) goes to ``InstanceList``, every other to ``v1_list_view``. For
    marketplace/urls.py, which this module does not edit."""
    cli_view = InstanceList.as_view()

    def dispatch(request, *args, **kwargs):
        if request.method == "GET" and "select_filters" in request.GET:
            return cli_view(request, *args, **kwargs)
        return v1_list_view(request, *args, **kwargs)

    # What DRF's as_view() marks its view with, so the schema and the route checks read this
    # route as the v1 viewset it is to every client but the CLI.
    for name in ("csrf_exempt", "cls", "initkwargs", "actions"):
        if hasattr(v1_list_view, name):
            setattr(dispatch, name, getattr(v1_list_view, name))
    return dispatch


def json_param(request, name: str) -> Any:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    try:
        return json_body(raw)  # bounded in depth, as a body is (a RecursionError was a 500)
    except ValueError:
        raise Refused(f"{name} is JSON.", field=name) from None


def whole_param(request, name: str, default, low: int, high: int):
    raw = request.query_params.get(name)
    if raw in (None, "", "null"):
        return default
    try:
        value = int(str(raw).strip('"'))
    except ValueError:
        raise Refused(f"{name} is a whole number.", field=name) from None
    if not low <= value <= high:
        raise Refused(f"{name} is between {low} and {high}.", field=name)
    return value
