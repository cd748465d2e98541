"""A Hypothesis state machine drives the ledger through random sequences of top-ups, grants,
holds, captures, metering sweeps (both usage kinds, cumulative totals that grow, stand still or
lag behind), extensions, releases, voids and duplicate webhooks, and after every step checks
the invariants (tests/billing/ledger_checks.py) and a plain-Python model of balances and fees.

Hundreds of examples: the checks after each step are a handful of queries, and each example
runs in a savepoint that is rolled back (no database set-up per example)."""

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

from billing.credits import credit_grant
from billing.errors import HoldCaptured, InsufficientCredit
from billing.holds import (
    hold_capture_usage,
    hold_create,
    hold_extend,
    hold_release,
    hold_void,
    platform_fee_percent,
)
from billing.metering import HoldUsage, holds_settle_usage
from billing.models import Account, AccountKind, Hold, TopUp, Transfer, TransferKind
from billing.money import percent_of
from billing.topups import stripe_event_process
from tests.billing.ledger_checks import assert_ledger_consistent
from tests.conftest import examples
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
        result = stripe_event_process(payload=payload)
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
        stripe_event_process(payload=payload)

    @rule(who=st.integers(0, 1), amount=st.integers(1, 10**8))
    def grant(self, who, amount):
        team = self.renters[who]
        credit_grant(
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
            hold = hold_create(
                team_id=team.id,
                provider_team_id=provider.id,
                amount=amount,
                reference=f"rental:{next(self.keys)}",
                idempotency_key=f"h{next(self.keys)}",
            )
        except InsufficientCredit:
            assert self.available[team.id] < amount
            return None
        assert self.available[team.id] >= amount
        self.available[team.id] -= amount
        self.model_holds[hold.pk] = {
            "team": team.id, "provider": provider.id, "amount": amount, "gpu": 0, "storage": 0,
            "status": "open",
        }  # fmt: skip
        return hold.pk

    @rule(hold_id=holds, kind=st.sampled_from(["gpu", "storage"]), more=st.integers(0, 10**8))
    def capture(self, hold_id, kind, more):
        if hold_id is None:
            return
        model = self.model_holds[hold_id]
        owed_total = model[kind] + more
        if model["status"] != "open":
            assert hold_capture_usage(hold_id=hold_id, kind=kind, owed_total=model[kind]) == 0
            return
        captured = hold_capture_usage(hold_id=hold_id, kind=kind, owed_total=owed_total)
        rest = model["amount"] - model["gpu"] - model["storage"]
        assert captured == min(more, rest)
        model[kind] += captured

    @rule(
        usage=st.lists(
            st.tuples(holds, st.integers(-(10**6), 10**8), st.integers(-(10**6), 10**7)),
            min_size=1,
            max_size=4,
        )
    )
    def sweep(self, usage):
        """The metering sweep: cumulative totals of both kinds for several holds at once (a hold
        may come twice, be closed, or owe less than was already captured)."""
        owed: dict[int, tuple[int, int]] = {}
        for hold_id, more_gpu, more_storage in usage:
            if hold_id is None:
                continue
            model = self.model_holds[hold_id]
            totals = (max(0, model["gpu"] + more_gpu), max(0, model["storage"] + more_storage))
            previous = owed.get(hold_id, (0, 0))
            owed[hold_id] = (max(totals[0], previous[0]), max(totals[1], previous[1]))
        expected, kinds = 0, {}
        for hold_id, (gpu_owed, storage_owed) in owed.items():
            model = self.model_holds[hold_id]
            if model["status"] != "open":
                continue
            rest = model["amount"] - model["gpu"] - model["storage"]
            gpu = max(0, min(gpu_owed - model["gpu"], rest))
            storage = max(0, min(storage_owed - model["storage"], rest - gpu))
            if gpu or storage:
                kinds[hold_id] = "gpu+storage" if gpu and storage else "gpu" if gpu else "storage"
            model["gpu"] += gpu
            model["storage"] += storage
            expected += gpu + storage
        items = [HoldUsage(hold_id, *totals) for hold_id, totals in owed.items()]
        assert holds_settle_usage(items) == expected
        for hold_id, kind in kinds.items():  # one capture per hold, naming what it charged
            last = Transfer.objects.filter(hold_id=hold_id, kind=TransferKind.CAPTURE).last()
            assert last.usage_kind == kind
        assert holds_settle_usage(items) == 0  # the same sweep again: nothing twice

    @rule(hold_id=holds, amount=st.integers(1, 10**8))
    def extend(self, hold_id, amount):
        if hold_id is None or self.model_holds[hold_id]["status"] != "open":
            return
        model = self.model_holds[hold_id]
        try:
            hold_extend(hold_id=hold_id, amount=amount, idempotency_key=f"x{next(self.keys)}")
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
        returned = hold_release(hold_id=hold_id)
        if model["status"] != "open":
            assert returned == 0
            return
        assert returned == model["amount"] - model["gpu"] - model["storage"]
        self.available[model["team"]] += returned
        model["status"] = "released"
        assert hold_release(hold_id=hold_id) == 0  # resolves once

    @rule(hold_id=holds)
    def void(self, hold_id):
        if hold_id is None:
            return
        model = self.model_holds[hold_id]
        try:
            returned = hold_void(hold_id=hold_id)
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
    def books_match_the_model(self):
        """The whole ledger is consistent, and balances, holds and fees are what the plain
        model says (two queries beyond the ledger checks: accounts and holds)."""
        assert_ledger_consistent()
        balances = {
            (team_id, kind): balance
            for team_id, kind, balance in Account.objects.values_list("team_id", "kind", "balance")
        }
        for team in self.renters:
            held = sum(
                m["amount"] - m["gpu"] - m["storage"]
                for m in self.model_holds.values()
                if m["team"] == team.id and m["status"] == "open"
            )
            assert balances.get((team.id, AccountKind.AVAILABLE), 0) == self.available[team.id]
            assert balances.get((team.id, AccountKind.HELD), 0) == held
        holds = Hold.objects.filter(pk__in=self.model_holds).values_list(
            "pk", "captured_gpu", "captured_storage", "status"
        )
        for pk, gpu, storage, status in holds:
            model = self.model_holds[pk]
            assert (gpu, storage, status) == (model["gpu"], model["storage"], model["status"])

        # Fees never drift: each hold's fees add up to the fee on all it captured, rounded
        # once, however the captures were cut; the provider earns the rest.
        fee_percent = platform_fee_percent()
        fees = earned = 0
        for model in self.model_holds.values():
            fee = percent_of(model["gpu"] + model["storage"], fee_percent)
            fees += fee
            if model["provider"] == self.provider.id:
                earned += model["gpu"] + model["storage"] - fee
        assert balances.get((None, AccountKind.PLATFORM_REVENUE), 0) == fees
        assert balances.get((self.provider.id, AccountKind.EARNINGS), 0) == earned

        # Each credited top-up has exactly one top-up transfer, however many events came.
        topup_transfers = Transfer.objects.filter(kind=TransferKind.TOPUP, team__in=self.renters)
        assert topup_transfers.count() == len(self.credited_topups)


@pytest.mark.django_db
def test_ledger_state_machine():
    run_state_machine_as_test(
        LedgerMachine,
        settings=settings(
            max_examples=examples(300),
            stateful_step_count=15,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
