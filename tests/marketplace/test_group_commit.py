"""Group commit (core/group_commit.py): orders that arrive together share one batch and
one transaction; a batch that fails is undone and its orders served one by one; each order
keeps its caller's context.

The batch functions here are the tests' own, writing a team per order, so what was committed
can be counted. The first batch of each test waits on a gate while the other callers queue
behind it, which makes the second batch hold them all.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time

import pytest
from django.db import connection, transaction

from core.group_commit import GroupCommit
from marketplace.models import Team
from tests.marketplace.conftest import until

pytestmark = pytest.mark.django_db(transaction=True)

caller = contextvars.ContextVar("caller", default="nobody")


class Scenario:
    """``first`` is submitted alone and its batch held at a gate; ``others`` are submitted
    while it waits (they queue), then the gate opens."""

    def __init__(self, batch_writes, *, gather: float = 0.0, recently: float = 0.1):
        self.batches: list[list[str]] = []
        self.gate = threading.Event()
        self.outcomes: dict[str, object] = {}
        self.batch_writes = batch_writes
        self.gather = gather
        self.group = GroupCommit(self._batch, gather=lambda: self.gather, recently=recently)

    def _batch(self, orders: list[str], contexts: list[contextvars.Context]) -> list:
        self.batches.append(list(orders))
        if orders == ["first"]:
            self.gate.wait(10)
        return self.batch_writes(orders, contexts)

    def call(self, order: str) -> None:
        caller.set(order)
        try:
            self.outcomes[order] = self.group.submit(order)
        except Exception as error:
            self.outcomes[order] = error
        finally:
            connection.close()

    def run(self, first: str, others: list[str]) -> None:
        threads = [threading.Thread(target=self.call, args=(first,))]
        threads[0].start()
        until(lambda: self.batches == [[first]])
        for queued, order in enumerate(others, start=1):
            threads.append(threading.Thread(target=self.call, args=(order,)))
            threads[-1].start()
            # Each queues before the next starts: the batch's order is theirs, not the
            # scheduler's (under load a later thread can otherwise overtake an earlier one).
            until(lambda queued=queued: self.group.waiting == queued)
        self.gate.set()
        for thread in threads:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in threads)


def team_per_order(orders, contexts):
    Team.objects.bulk_create([Team(name=order) for order in orders])
    return [f"placed {order}" for order in orders]


def written() -> list[str]:
    return sorted(Team.objects.values_list("name", flat=True))


def test_orders_that_queue_behind_a_batch_go_together_in_the_next():
    scenario = Scenario(team_per_order)
    scenario.run("first", ["a", "b", "c"])
    assert scenario.batches == [["first"], ["a", "b", "c"]]
    assert scenario.outcomes == {o: f"placed {o}" for o in ("first", "a", "b", "c")}
    assert written() == ["a", "b", "c", "first"]


def test_an_order_refused_alone_gets_its_error_and_the_others_their_results():
    def refuse_b(orders, contexts):
        placed = team_per_order([o for o in orders if o != "b"], contexts)
        outcomes = iter(placed)
        return [ValueError("b is refused") if o == "b" else next(outcomes) for o in orders]

    scenario = Scenario(refuse_b)
    scenario.run("first", ["a", "b", "c"])
    assert str(scenario.outcomes["b"]) == "b is refused"
    assert scenario.outcomes["a"] == "placed a" and scenario.outcomes["c"] == "placed c"
    assert written() == ["a", "c", "first"]


def test_a_batch_that_fails_is_undone_and_its_orders_served_one_by_one():
    """One order makes the whole batch fail after it wrote (a database error, a bug): nothing
    of that batch stays, each order runs again alone, and only the bad one fails."""

    def fails_with_poison(orders, contexts):
        placed = team_per_order(orders, contexts)
        if "poison" in orders:
            raise RuntimeError("poisoned batch")
        return placed

    scenario = Scenario(fails_with_poison)
    scenario.run("first", ["a", "poison", "b"])
    assert scenario.batches[:2] == [["first"], ["a", "poison", "b"]]
    assert sorted(scenario.batches[2:]) == [["a"], ["b"], ["poison"]]
    assert isinstance(scenario.outcomes["poison"], RuntimeError)
    assert scenario.outcomes["a"] == "placed a" and scenario.outcomes["b"] == "placed b"
    assert written() == ["a", "b", "first"]  # once each: the failed batch left nothing


def test_a_follow_up_that_fails_after_the_commit_runs_nothing_twice(caplog):
    """A follow-up queued on commit (a task to a broker that is down) fails after the orders
    were written: the callers get their results, nothing is written again."""

    def follow_up_fails(orders, contexts):
        placed = team_per_order(orders, contexts)
        if len(orders) > 1:
            transaction.on_commit(lambda: (_ for _ in ()).throw(ConnectionError("broker down")))
        return placed

    scenario = Scenario(follow_up_fails)
    with caplog.at_level(logging.ERROR, logger="core.group_commit"):
        scenario.run("first", ["a", "b"])
    assert scenario.batches == [["first"], ["a", "b"]]
    assert scenario.outcomes == {o: f"placed {o}" for o in ("first", "a", "b")}
    assert written() == ["a", "b", "first"]
    assert "a follow-up of a committed batch of 2 orders failed" in caplog.text


def test_each_order_is_served_in_its_callers_context():
    def whose(orders, contexts):
        return [context.run(caller.get) for context in contexts]

    scenario = Scenario(whose)
    scenario.run("first", ["a", "b", "c"])
    assert scenario.batches[1] == ["a", "b", "c"]
    assert scenario.outcomes == {o: o for o in ("first", "a", "b", "c")}


def test_the_callers_just_served_are_gathered_into_the_next_batch():
    """Under load the callers a batch answered come back with their next orders a moment
    apart: the first back waits (up to ``gather``) for the others, so they go together."""
    scenario = Scenario(team_per_order, recently=60.0)
    scenario.run("first", ["a", "b", "c"])
    scenario.gather = 30.0
    again = [threading.Thread(target=scenario.call, args=(f"{o}2",)) for o in ("a", "b", "c")]
    for thread in again:
        thread.start()
    for thread in again:
        thread.join(timeout=20)
    assert [sorted(batch) for batch in scenario.batches[2:]] == [["a2", "b2", "c2"]]


def test_a_caller_after_a_quiet_spell_leads_at_once():
    """No batch ended recently: nothing suggests company is coming, so the order does not
    wait the 30 s ``gather`` for it."""
    scenario = Scenario(team_per_order, gather=30.0, recently=0.05)
    scenario.call("one")
    time.sleep(0.2)
    alone = threading.Thread(target=scenario.call, args=("later",))
    alone.start()
    alone.join(timeout=10)
    assert not alone.is_alive()
    assert scenario.batches == [["one"], ["later"]]
    assert written() == ["later", "one"]


def test_a_caller_inside_a_transaction_is_served_alone_within_it():
    scenario = Scenario(team_per_order)

    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        assert scenario.group.submit("inside") == "placed inside"
        assert written() == ["inside"]
        raise Undo
    assert written() == []  # undone with its caller's transaction
    assert scenario.batches == [["inside"]]


def test_switched_off_each_order_is_placed_alone_without_waiting_for_a_running_batch():
    """RENT_GROUP_COMMIT=0: orders arriving while a batch runs neither queue behind it nor
    join each other; each is placed in a transaction of its own at once."""
    scenario = Scenario(team_per_order)
    scenario.group = GroupCommit(scenario._batch, enabled=lambda: False)
    first = threading.Thread(target=scenario.call, args=("first",))
    first.start()
    until(lambda: scenario.batches == [["first"]])
    others = [threading.Thread(target=scenario.call, args=(name,)) for name in ("a", "b")]
    for thread in others:
        thread.start()
    for thread in others:
        thread.join(timeout=30)
    # Placed and committed while the first order's transaction is still open.
    assert sorted(scenario.batches[1:]) == [["a"], ["b"]]
    assert written() == ["a", "b"]
    scenario.gate.set()
    first.join(timeout=30)
    assert scenario.outcomes == {"first": "placed first", "a": "placed a", "b": "placed b"}
    assert written() == ["a", "b", "first"]
