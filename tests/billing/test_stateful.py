"""A Hypothesis state machine drives the ledger through random sequences of top-ups, grants,
holds, captures, extensions, releases, voids and duplicate webhooks, and after every step
checks the invariants (tests/billing/ledger_checks.py) and a plain-Python model of balances."""

from __future__ import annotations

import itertools

import pytest
from django.db import transaction
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
    run_state_machine_as_test,
)

from billing import services
from billing.errors import HoldCaptured, InsufficientCredit
from billing.models import Hold, HoldStatus, TopUp, Transfer, TransferKind
from billing.selectors import team_balance
from tests.billing.ledger_checks import assert_ledger_consistent
from tests.factories import TeamFactory

CENT = 10_000
counter = itertools.count()


def checkout_completed(topup: TopUp, cents: int, event_type: str) -> dict:
    n = next(counter)
    return {
        "id": f"evt_state_{n}",
        "type": event_type,
        "livemode": False,
        "data": {
            "object": {
                "id": f"cs_state_{topup.pk}",
                "object": "checkout.session",
                "mode": "payment",
                "payment_status": "paid",
                "amount_total": cents,
                "currency": "usd",
                "metadata": {"team_id": str(topup.team_id), "topup_id": str(topup.pk)},
            }
        },
    }


class LedgerMachine(RuleBasedStateMachine):
    holds = Bundle("holds")
    events = Bundle("events")

    def __init__(self):
        super().__init__()
        # Each example runs in a savepoint that is rolled back, so examples never meet.
        self._atomic = transaction.atomic()
        self._atomic.__enter__()
        self.renters = [TeamFactory(), TeamFactory()]
        self.provider = TeamFactory()
        self.available = {team.id: 0 for team in self.renters}
        self.model_holds: dict[int, dict] = {}
        self.credited_topups: set[int] = set()
        self.keys = itertools.count()

    def teardown(self):
        transaction.set_rollback(True)
        self._atomic.__exit__(None, None, None)

    # --- credit in ---------------------------------------------------------------------

    @rule(target=events, who=st.integers(0, 1), cents=st.integers(1, 50_000),
          async_payment=st.booleans())  # fmt: skip
    def top_up(self, who, cents, async_payment):
        team = self.renters[who]
        topup = TopUp.objects.create(team=team, amount=cents * CENT)
        kind = (
            "checkout.session.async_payment_succeeded"
            if async_payment
            else "checkout.session.completed"
        )
        payload = checkout_completed(topup, cents, kind)
        result = services.stripe_event_process(payload=payload)
        assert not result.duplicate and result.event.status == "processed"
        self.available[team.id] += cents * CENT
        self.credited_topups.add(topup.pk)
        return payload

    @rule(event=events, other_kind=st.booleans())
    def duplicate_webhook(self, event, other_kind):
        """The same event again, or the other event type for the same session: no credit."""
        payload = dict(event)
        if other_kind:
            payload = {**event, "id": f"evt_other_{next(counter)}"}
            payload["type"] = (
                "checkout.session.completed"
                if event["type"] != "checkout.session.completed"
                else "checkout.session.async_payment_succeeded"
            )
        services.stripe_event_process(payload=payload)

    @rule(who=st.integers(0, 1), amount=st.integers(1, 10**8))
    def grant(self, who, amount):
        team = self.renters[who]
        services.credit_grant(
            team_id=team.id, amount=amount, reason="state", idempotency_key=f"g{next(self.keys)}"
        )
        self.available[team.id] += amount

    # --- holds -------------------------------------------------------------------------

    @rule(target=holds, who=st.integers(0, 1), amount=st.integers(1, 2 * 10**8),
          self_rental=st.booleans())  # fmt: skip
    def hold(self, who, amount, self_rental):
        team = self.renters[who]
        provider = team if self_rental else self.provider
        try:
            hold = services.hold_create(
                team_id=team.id,
                provider_team_id=provider.id,
                amount=amount,
                reference=f"contract:{next(self.keys)}",
                idempotency_key=f"h{next(self.keys)}",
            )
        except InsufficientCredit:
            assert self.available[team.id] < amount
            return None
        assert self.available[team.id] >= amount
        self.available[team.id] -= amount
        self.model_holds[hold.pk] = {
            "team": team.id, "amount": amount, "gpu": 0, "storage": 0, "status": "open",
        }  # fmt: skip
        return hold.pk

    @rule(hold_id=holds, kind=st.sampled_from(["gpu", "storage"]), more=st.integers(0, 10**8))
    def capture(self, hold_id, kind, more):
        if hold_id is None:
            return
        model = self.model_holds[hold_id]
        owed_total = model[kind] + more
        if model["status"] != "open":
            assert (
                services.hold_capture_usage(hold_id=hold_id, kind=kind, owed_total=model[kind]) == 0
            )
            return
        captured = services.hold_capture_usage(hold_id=hold_id, kind=kind, owed_total=owed_total)
        rest = model["amount"] - model["gpu"] - model["storage"]
        assert captured == min(more, rest)
        model[kind] += captured

    @rule(hold_id=holds, kind=st.sampled_from(["gpu", "storage"]))
    def sweep_repeats_nothing(self, hold_id, kind):
        if hold_id is None:
            return
        model = self.model_holds[hold_id]
        usage = services.HoldUsage(hold_id, model["gpu"], model["storage"])
        assert services.holds_settle_usage([usage]) == 0

    @rule(hold_id=holds, amount=st.integers(1, 10**8))
    def extend(self, hold_id, amount):
        if hold_id is None or self.model_holds[hold_id]["status"] != "open":
            return
        model = self.model_holds[hold_id]
        try:
            services.hold_extend(
                hold_id=hold_id, amount=amount, idempotency_key=f"x{next(self.keys)}"
            )
        except InsufficientCredit:
            assert self.available[model["team"]] < amount
            return
        self.available[model["team"]] -= amount
        model["amount"] += amount

    @rule(hold_id=consumes(holds))
    def release(self, hold_id):
        if hold_id is None:
            return
        model = self.model_holds[hold_id]
        returned = services.hold_release(hold_id=hold_id)
        if model["status"] != "open":
            assert returned == 0
            return
        assert returned == model["amount"] - model["gpu"] - model["storage"]
        self.available[model["team"]] += returned
        model["status"] = "released"
        assert services.hold_release(hold_id=hold_id) == 0  # resolves once

    @rule(hold_id=holds)
    def void(self, hold_id):
        if hold_id is None:
            return
        model = self.model_holds[hold_id]
        try:
            returned = services.hold_void(hold_id=hold_id)
        except HoldCaptured:
            assert model["gpu"] + model["storage"] > 0 and model["status"] == "open"
            return
        if model["status"] != "open":
            assert returned == 0
            return
        assert returned == model["amount"]
        self.available[model["team"]] += returned
        model["status"] = "voided"

    # --- after every step --------------------------------------------------------------

    @invariant()
    def ledger_is_consistent(self):
        assert_ledger_consistent()

    @invariant()
    def balances_match_the_model(self):
        for team in self.renters:
            held = sum(
                m["amount"] - m["gpu"] - m["storage"]
                for m in self.model_holds.values()
                if m["team"] == team.id and m["status"] == "open"
            )
            assert team_balance(team.id) == (self.available[team.id], held)
        for hold in Hold.objects.filter(pk__in=self.model_holds):
            model = self.model_holds[hold.pk]
            assert (hold.captured_gpu, hold.captured_storage, hold.status) == (
                model["gpu"], model["storage"], model["status"],
            )  # fmt: skip
            assert hold.status == HoldStatus.OPEN or hold.remaining == 0
        # Each credited top-up has exactly one top-up transfer, however many events came.
        topup_transfers = Transfer.objects.filter(kind=TransferKind.TOPUP, team__in=self.renters)
        assert topup_transfers.count() == len(self.credited_topups)


@pytest.mark.django_db
def test_ledger_state_machine():
    run_state_machine_as_test(
        LedgerMachine,
        settings=settings(
            max_examples=30,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
