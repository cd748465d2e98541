"""The CLI's bulk forms: ``create instances ID…`` (``POST /asks/bulk/``) and ``start/stop/
destroy instances ID…`` (``PUT``/``DELETE /instances/``).

The CLI sends up to 64 ids a request and sends the whole request again (up to five times)
when the answer is an error or lacks ``success``. So a bulk answer is idempotent where it can
be: an instance already in (or on its way to) the asked state counts as done, and a create
that rented anything answers ``success`` with what it could not rent listed beside, rather
than an error that would make the CLI rent the others again.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework.exceptions import APIException, NotFound
from rest_framework.response import Response

from marketplace.api.errors import api_exception_handler
from marketplace.models.rentals import all_free_offers
from marketplace.rentals.actions import (
    rental_destroy_request,
    rental_start,
    rental_stop_request,
)
from marketplace.rentals.renting import rentals_create
from marketplace.tenancy import team_objects
from marketplace.url_ids import MAX_ID
from marketplace.vast.errors import Refused
from scheduler.models import Instance, InstanceState

MAX_BULK = 64  # what the CLI sends in one request

# What counts as done for each bulk action: the instance is there already, or on its way.
ALREADY = {
    "stopped": {InstanceState.STOPPING, InstanceState.STOPPED},
    "running": {InstanceState.LAUNCHING, InstanceState.RUNNING},
    "destroyed": {InstanceState.DESTROYING, InstanceState.DESTROYED},
}
ACTIONS = {
    "stopped": rental_stop_request,
    "running": rental_start,
    "destroyed": rental_destroy_request,
}


def id_list(body: dict[str, Any], name: str) -> list[int]:
    """The body's list of ids (``ids`` or ``instance_ids``), each once, in order."""
    ids = body.get(name)
    if (
        not isinstance(ids, list)
        or not ids
        or not all(isinstance(i, int) and not isinstance(i, bool) and 1 <= i <= MAX_ID for i in ids)
    ):
        raise Refused(f"{name} is a list of ids, like [1234, 1235].", field=name)
    if len(ids) > MAX_BULK:
        raise Refused(f"At most {MAX_BULK} ids a request.", field=name)
    return list(dict.fromkeys(ids))


def error_message(error: Exception) -> str:
    """What our API would answer for ``error``, as one line."""
    response = api_exception_handler(error, {})
    return response.data["error"]["message"]


def team_instances(team, ids: list[int], *, with_destroyed: bool) -> list[Instance]:
    """The team's instances with these ids, in the order asked; 404 naming any id that is not
    one of them (before anything is done to the others)."""
    found = team_objects(
        team, Instance.objects.select_related("rental", "machine")
    ).prefetch_related(all_free_offers("machine__offers"))
    if not with_destroyed:
        found = found.exclude(state=InstanceState.DESTROYED)
    by_id = {instance.pk: instance for instance in found.filter(pk__in=ids)}
    missing = [str(i) for i in ids if i not in by_id]
    if missing:
        raise NotFound(
            f"Instance{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"{'are' if len(missing) > 1 else 'is'} not one of your team's instances; "
            "nothing was done."
        )
    return [by_id[i] for i in ids]


def instances_to_state(team, ids: list[int], state: str) -> Response:
    """Stop, start or destroy each instance; one that cannot be is named with the reason."""
    instances = team_instances(team, ids, with_destroyed=state == "destroyed")
    failed: dict[str, str] = {}
    for instance in instances:
        if instance.state in ALREADY[state]:
            continue
        try:
            ACTIONS[state](instance=instance)
        except Exception as error:
            if not refusal(error):
                raise  # a fault, not a refusal: the API's 500
            failed[str(instance.pk)] = error_message(error)
    return bulk_answer([i.pk for i in instances if str(i.pk) not in failed], failed)


def refusal(error: Exception) -> bool:
    """An error our API answers as a 4xx (a domain error, a validation error)."""
    return hasattr(error, "http_status") or isinstance(error, APIException | DjangoValidationError)


def bulk_answer(done: list[int], failed: dict[str, str]) -> Response:
    if failed:
        message = "; ".join(f"{key}: {why}" for key, why in failed.items())
        body = {"success": False, "msg": message, "done": done, "failed": failed}
        return Response(body, status=200 if done else 409)
    return Response({"success": True, "done": done})


def rent_many(team, orders: list, offer_ids: list[int]) -> Response:
    """Rent each order (one per offer) in one go; what could not be rented is named with why.
    Something rented answers ``success`` (so the CLI does not send it all again)."""
    outcomes = rentals_create([(team, order) for order in orders]) if orders else []
    contracts, failed = [], {}
    for offer_id, outcome in zip(offer_ids, outcomes, strict=True):
        if isinstance(outcome, Exception):
            failed[str(offer_id)] = error_message(outcome)
        else:
            contracts.append(outcome.rental.instance_id)
    if not contracts:
        message = "; ".join(f"offer {key}: {why}" for key, why in failed.items())
        return Response(
            {"success": False, "msg": f"Nothing was rented. {message}", "failed": failed},
            status=409,
        )
    body: dict[str, Any] = {"success": True, "new_contracts": contracts}
    if failed:
        body["failed"] = failed
    return Response(body)
