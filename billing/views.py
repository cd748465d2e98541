"""Stripe's webhook: the only billing view outside the console (routed from
marketplace/views/billing.py). It acts for no team, so it needs no tenancy gateway; the
signature over the raw body is its authentication."""

from __future__ import annotations

import json
import logging

import stripe
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from billing import stripe_gateway, topups
from billing.models import StripeEventStatus

logger = logging.getLogger(__name__)


@csrf_exempt
@require_POST
def stripe_webhook(request: HttpRequest) -> JsonResponse:
    payload = request.body  # the raw bytes Stripe signed; never a re-serialised copy
    try:
        stripe_gateway.webhook_event_verify(payload, request.headers.get("Stripe-Signature", ""))
        event = json.loads(payload)
        if not isinstance(event, dict) or not isinstance(event.get("id"), str):
            raise ValueError("The event has no id.")
    except (ValueError, stripe.SignatureVerificationError) as error:
        logger.warning("Refused a Stripe webhook: %s", error)
        return JsonResponse({"error": f"Invalid webhook: {error}"}, status=400)
    result = topups.stripe_event_process(payload=event)
    status = result.event.status
    body = {"received": True, "status": status, "duplicate": result.duplicate}
    # A failed handler answers 500 so Stripe delivers the event again later.
    return JsonResponse(body, status=500 if status == StripeEventStatus.FAILED else 200)
