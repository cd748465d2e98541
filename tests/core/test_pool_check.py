"""A pooled connection is handed out without a round trip while it is alive, and one that
PostgreSQL ended is dropped, not handed out (core/postgresql).

These tests take connections from the process's real pool (``transactional_db``: each
``connection.close()`` gives this thread's connection back to it) and look at the server's
side of them from a separate connection."""

from __future__ import annotations

import psycopg
import pytest
from django.conf import settings
from django.db import connection

pytestmark = pytest.mark.skipif(
    settings.DATABASES["default"]["ENGINE"] != "core.postgresql",
    reason="the quiet check is PostgreSQL's pooled backend",
)


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def observer() -> psycopg.Connection:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=True)


def last_statement(pid: int) -> str:
    with observer() as other:
        return other.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()[
            0
        ]


@pytest.fixture
def pool_of_one(transactional_db):
    """This process's pool made afresh with one connection, so the one given back is the one
    taken next; the pool as configured afterwards."""
    options = connection.settings_dict["OPTIONS"]
    configured = options["pool"]
    connection.close()
    connection.close_pool()
    options["pool"] = {**configured, "min_size": 1, "max_size": 1}
    yield
    connection.close()
    connection.close_pool()
    options["pool"] = configured


def test_a_live_connection_is_handed_out_without_a_query(pool_of_one):
    pid = backend_pid()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 'the last thing this connection ran'")
    connection.close()
    connection.ensure_connection()  # out of the pool again
    assert connection.connection.info.backend_pid == pid
    # Django's check would have sent an empty query; nothing was sent.
    assert last_statement(pid) == "SELECT 'the last thing this connection ran'"


def test_a_connection_the_server_ended_is_dropped_not_handed_out(pool_of_one):
    pid = backend_pid()
    connection.close()
    with observer() as other:
        # Waits until the backend has exited: its socket has the server's last words.
        assert other.execute("SELECT pg_terminate_backend(%s, 10000)", [pid]).fetchone()[0]
    assert backend_pid() != pid  # the next query works, on another connection


@pytest.mark.django_db(transaction=True)
def test_the_api_key_lookup_is_planned_once_per_pooled_connection(team, owner):
    """Every API request looks its key up; on a pooled connection the lookup is a prepared
    statement after a few runs (planned once, not at each request), and answers as before."""
    from marketplace.models import Membership
    from marketplace.services.accounts import api_key_authenticate, api_key_create

    owner_membership = Membership.objects.get(team=team, user=owner)
    issued = api_key_create(membership=owner_membership, name="ci")
    answers = [api_key_authenticate(issued.secret) for _ in range(8)]
    assert {a.pk for a in answers} == {issued.api_key.pk}
    assert answers[-1].team.pk == owner_membership.team_id
    assert api_key_authenticate(issued.secret + "x") is None
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any("marketplace_apikey" in statement for statement in prepared)
