"""The gateway's auth answer as production serves it (ASGI): remembered answers given in
front of Django, looked at again in the second half of their time while still answering, so a
key in steady use never waits for the database and a revoked one is refused within seconds."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.testing import HttpCommunicator
from django.db import connection, connections
from django.test import Client

from marketplace.clusters import auth, key_looks
from marketplace.clusters.services import ClusterSpec, cluster_create
from marketplace.models import ApiKey
from marketplace.services.accounts import api_key_create, api_key_revoke

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def ask(application, cluster_id: int, secret: str) -> int:
    headers = [(b"authorization", f"Bearer {secret}".encode()), (b"host", b"localhost")]
    communicator = HttpCommunicator(
        application, "GET", f"/gateway/auth/{cluster_id}/", headers=headers
    )
    return (await communicator.get_response(timeout=10))["status"]


def make(team):
    cluster = cluster_create(
        team=team,
        spec=ClusterSpec(name="svc", image="busybox", gpu_names=["None"], service_port=80),
    )
    membership = team.memberships.get()
    issued = api_key_create(membership=membership, name="svc", access="read")
    return cluster.pk, issued.secret, membership


async def test_a_revoked_key_is_refused_within_seconds_through_the_fast_path(funded_team, settings):
    from marketplace.asgi import application

    settings.GATEWAY_AUTH_CACHE_SECONDS = 1.0
    auth.forget()
    cluster_id, secret, membership = await sync_to_async(make)(funded_team)
    other_id, _, _ = await sync_to_async(make)(funded_team)

    assert await ask(application, cluster_id, secret) == 200  # first look: the database
    assert await ask(application, cluster_id, secret) == 200  # remembered: in front of it
    assert await ask(application, other_id + 1000, secret) == 401  # no such cluster

    key = await sync_to_async(ApiKey.objects.get)(prefix=secret.split("_")[1])
    await sync_to_async(api_key_revoke)(membership=membership, api_key=key)
    answers = []
    for _ in range(30):  # steady use, 10 a second
        answers.append(await ask(application, cluster_id, secret))
        await asyncio.sleep(0.1)
    # Still answered from memory at first, then refused once a look came back: within the
    # remembered time (1 s) and the look's own.
    assert answers[0] == 200 and answers[-1] == 401
    assert answers.index(401) <= 15 and set(answers[answers.index(401) :]) == {401}
    # The database connections the looks used go with the test.
    key_looks.close()
    await sync_to_async(connections.close_all)()


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def looks_backends() -> list[int]:
    """The database sessions of the looks' own connection (``key_looks``)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            [key_looks.APPLICATION_NAME],
        )
        found = [row[0] for row in cursor.fetchall()]
    connection.close()  # this helper thread's own connection
    return found


def terminate(pid: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    connection.close()  # this helper thread's own connection


async def ask_with_session(application, cluster_id: int, cookie: str) -> int:
    headers = [(b"cookie", f"sessionid={cookie}".encode()), (b"host", b"localhost")]
    communicator = HttpCommunicator(
        application, "GET", f"/gateway/auth/{cluster_id}/", headers=headers
    )
    return (await communicator.get_response(timeout=10))["status"]


def session_of(membership) -> str:
    client = Client()
    client.force_login(membership.user)
    return client.cookies["sessionid"].value


async def test_a_key_look_survives_its_kept_connection_dying(funded_team, settings):
    """A first look at a key runs on the event loop, on a database connection the process
    keeps for looks; the database ending it (a restart, an idle timeout) costs the next look a
    new connection, not an error for the caller."""
    from marketplace.asgi import application

    auth.forget()
    cluster_id, secret, _ = await sync_to_async(make)(funded_team)
    assert await ask(application, cluster_id, secret) == 200
    kept = await sync_to_async(looks_backends, thread_sensitive=False)()
    assert len(kept) == 1  # the look's own connection, not the request's thread's
    await sync_to_async(terminate, thread_sensitive=False)(kept[0])
    auth.forget()  # so the next answer is a first look again

    assert await ask(application, cluster_id, secret) == 200
    again = await sync_to_async(looks_backends, thread_sensitive=False)()
    assert len(again) == 1 and again != kept
    assert await ask(application, cluster_id + 1000, secret) == 401
    key_looks.close()
    await sync_to_async(connections.close_all)()


async def test_a_session_look_survives_its_kept_connection_dying(funded_team, settings):
    """A console session is looked at in the one thread the looks share, which keeps its
    connection between looks: the database ending it costs the next look a new one."""
    from marketplace.asgi import application

    auth.forget()
    cluster_id, _, membership = await sync_to_async(make)(funded_team)
    cookie = await sync_to_async(session_of)(membership)
    assert await ask_with_session(application, cluster_id, cookie) == 200
    kept = await sync_to_async(backend_pid)()  # the looks' thread: the same connection
    await sync_to_async(terminate, thread_sensitive=False)(kept)
    auth.forget()

    assert await ask_with_session(application, cluster_id, cookie) == 200
    assert await sync_to_async(backend_pid)() != kept
    assert await ask_with_session(application, cluster_id + 1000, cookie) == 401
    assert await ask_with_session(application, cluster_id, cookie + "x") == 401
    await sync_to_async(connections.close_all)()
