"""Events leave through one publisher per process (core/events.py; the groups and messages are
marketplace/events.py's), in the order they were handed over; a forked child (a Celery pool
process) publishes through its own. The publisher sends only to groups someone is in, as the
channel layer tells in one look (core/channel_layer.py)."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from core.channel_layer import RedisChannelLayer
from marketplace.events import (
    publish_access_lost,
    publish_team_event,
    publish_team_events,
    team_group,
    teams_listened,
    user_group,
)

pytestmark = pytest.mark.django_db(transaction=True)

# Group names only: no team or user rows are needed to listen on them.
TEAM_ID, USER_ID = 910_001, 910_002


def listening_channel() -> str:
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(team_group(TEAM_ID), channel)
    async_to_sync(layer.group_add)(user_group(USER_ID), channel)
    return channel


def received(channel: str, count: int) -> list[dict]:
    layer = get_channel_layer()

    async def take() -> list[dict]:
        return [await asyncio.wait_for(layer.receive(channel), 10) for _ in range(count)]

    return async_to_sync(take)()


def test_events_arrive_in_the_order_they_were_published_and_a_rollback_sends_none():
    channel = listening_channel()
    for n in range(30):
        publish_team_event(TEAM_ID, "probe", {"n": n})
    with pytest.raises(RuntimeError), transaction.atomic():
        publish_team_event(TEAM_ID, "probe", {"n": "rolled back"})
        raise RuntimeError
    publish_team_event(TEAM_ID, "probe", {"n": 30})

    assert [message["data"]["n"] for message in received(channel, 31)] == list(range(31))


def test_a_forked_process_publishes_through_its_own_publisher():
    channel = listening_channel()
    publish_team_event(TEAM_ID, "probe", {"n": "parent"})
    # Sent before the fork: the parent's publisher runs (and its send cannot arrive after the
    # child's, which it would under load if the test forked at once).
    [parents] = received(channel, 1)
    assert parents["data"] == {"n": "parent"}
    child = os.fork()
    if child == 0:  # the child: its parent's publisher thread does not exist here
        try:
            publish_access_lost(USER_ID, TEAM_ID)  # returns once sent
        finally:
            os._exit(0)
    deadline = time.monotonic() + 20
    while (done := os.waitpid(child, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    if done == (0, 0):
        os.kill(child, 9)
        os.waitpid(child, 0)
        pytest.fail("the forked child never got its event out")

    [childs] = received(channel, 1)
    assert childs == {"type": "access.lost", "team_id": TEAM_ID}


def test_only_groups_with_a_live_member_are_sent_to_and_theirs_arrive():
    layer = get_channel_layer()
    listened, expired, empty = (team_group(TEAM_ID + n) for n in (10, 11, 12))
    channel, gone = async_to_sync(layer.new_channel)(), async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(listened, channel)
    async_to_sync(layer.group_add)(expired, gone)

    async def age_out() -> None:  # joined longer ago than the layer keeps a member
        too_old = time.time() - layer.group_expiry - 60
        await layer.connection(layer.consistent_hash(expired)).zadd(
            layer._group_key(expired), {gone: too_old}
        )

    async_to_sync(age_out)()

    assert async_to_sync(layer.groups_listened)([listened, expired, empty]) == {listened}
    # The same look from a thread outside any event loop, and the teams it names.
    assert layer.groups_listened_now([listened, expired, empty]) == {listened}
    assert teams_listened([TEAM_ID + 12, TEAM_ID + 11, TEAM_ID + 10]) == [TEAM_ID + 10]
    publish_team_events(
        "probe", [(TEAM_ID + 12, {"n": 0}), (TEAM_ID + 11, {"n": 1}), (TEAM_ID + 10, {"n": 2})]
    )
    [message] = received(channel, 1)
    assert message["data"] == {"n": 2}


def test_where_redis_does_not_answer_every_group_counts_as_listened():
    """The look before an event costs a query: not knowing, the event is made (and the
    publisher, which cannot reach Redis either, logs that it could not send it)."""
    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    layer = RedisChannelLayer(hosts=[f"redis://127.0.0.1:{port}/0"])
    groups = {team_group(TEAM_ID + 20), team_group(TEAM_ID + 21)}
    assert layer.groups_listened_now(groups) == groups
