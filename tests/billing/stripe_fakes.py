"""What Stripe sends and answers, in its real formats: signed webhook payloads, and a local
HTTP endpoint that the official SDK talks to (it records each request)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl

WEBHOOK_SECRET = "whsec_test_secret_for_billing_tests"


def stripe_signature(
    payload: bytes, secret: str = WEBHOOK_SECRET, timestamp: int | None = None
) -> str:
    """The ``Stripe-Signature`` header as Stripe computes it: HMAC-SHA256 of "t.payload"."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    signed = f"{timestamp}.".encode() + payload
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def session_event(
    *,
    event_id: str,
    topup,
    event_type: str = "checkout.session.completed",
    payment_status: str = "paid",
    cents: int | None = None,
    session_id: str | None = None,
    currency: str = "usd",
) -> dict:
    return {
        "id": event_id,
        "object": "event",
        "api_version": "2025-08-27.basil",
        "created": int(time.time()),
        "livemode": False,
        "type": event_type,
        "data": {
            "object": {
                "id": session_id or topup.checkout_session_id or f"cs_test_{topup.pk}",
                "object": "checkout.session",
                "mode": "payment",
                "payment_status": payment_status,
                "status": "complete",
                "amount_total": topup.amount // 10_000 if cents is None else cents,
                "currency": currency,
                "client_reference_id": f"topup-{topup.pk}",
                "metadata": {"team_id": str(topup.team_id), "topup_id": str(topup.pk)},
            }
        },
    }


def post_event(client, event: dict | bytes, *, signature: str | None = None, **kwargs):
    body = event if isinstance(event, bytes) else json.dumps(event).encode()
    return client.post(
        "/billing/stripe/webhook/",
        data=body,
        content_type="application/json",
        HTTP_STRIPE_SIGNATURE=signature if signature is not None else stripe_signature(body),
        **kwargs,
    )


class FakeStripeApi:
    """A threaded HTTP server on 127.0.0.1 that answers Checkout Session creation, and
    Connect transfers (``/v1/transfers``)."""

    def __init__(self, *, status: int = 200):
        self.requests: list[dict] = []
        self.status = status
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length).decode()
                outer.requests.append(
                    {
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "form": dict(parse_qsl(body, keep_blank_values=True)),
                    }
                )
                n = len(outer.requests)
                form = outer.requests[-1]["form"]
                if outer.status == 200 and self.path.startswith("/v1/transfers"):
                    answer = {  # a Connect transfer, as Stripe answers one
                        "id": f"tr_test_local_{n}",
                        "object": "transfer",
                        "amount": int(form.get("amount", 0)),
                        "currency": form.get("currency"),
                        "destination": form.get("destination"),
                        "reversed": False,
                    }
                elif outer.status == 200:
                    answer = {
                        "id": f"cs_test_local_{n}",
                        "object": "checkout.session",
                        "url": f"https://checkout.stripe.com/c/pay/cs_test_local_{n}",
                        "mode": "payment",
                        "payment_status": "unpaid",
                        "status": "open",
                    }
                else:
                    answer = {"error": {"type": "api_error", "message": "Stripe is down"}}
                data = json.dumps(answer).encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Request-Id", f"req_{n}")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
