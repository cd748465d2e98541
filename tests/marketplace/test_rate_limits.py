"""Budgets that stop a runaway script or a password guesser: API writes and offer searches
per key or user (429 with Retry-After), password log-ins per user name and address (locked
after 5 failures, even for the right password)."""

from __future__ import annotations

import pytest
from django.conf import settings as django_settings
from django.urls import reverse

from marketplace.models import SshKey
from tests.conftest import PASSWORD, client_for, key_client
from tests.marketplace.test_tenancy_matrix import public_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def tight_budgets(settings):
    settings.REST_FRAMEWORK = {
        **django_settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"write": "3/min", "offer_search": "2/min"},
    }


def add_key(api, name: str):
    return api.post("/api/v1/ssh-keys/", {"name": name, "public_key": public_key()}, format="json")


def test_a_key_over_its_write_budget_gets_429_and_writes_nothing(team, owner, tight_budgets):
    api = key_client(team)
    assert [add_key(api, f"k{n}").status_code for n in range(3)] == [201, 201, 201]

    refused = add_key(api, "one too many")
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "throttled"
    assert int(refused["Retry-After"]) > 0
    assert SshKey.objects.filter(team=team).count() == 3
    # Reads are not writes, and another key has a budget of its own.
    assert api.get("/api/v1/ssh-keys/").status_code == 200
    assert add_key(key_client(team), "other key").status_code == 201


def test_a_user_over_the_offer_search_budget_gets_429(client, team, owner, tight_budgets):
    console = client_for(client, owner, team)
    answers = [console.get("/api/v1/offers/").status_code for _ in range(3)]
    assert answers == [200, 200, 429]
    # A search with a JSON body spends the search budget, not the write budget.
    assert console.post("/api/v1/offers/", {}, content_type="application/json").status_code == 429


def test_the_default_budgets_are_generous():
    rates = django_settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]
    assert rates == {"write": "600/min", "offer_search": "1200/min"}


def log_in(client, password: str, address: str = "10.0.0.1"):
    return client.post(
        reverse("login"), {"username": "owner", "password": password}, REMOTE_ADDR=address
    )


def test_the_sixth_log_in_after_five_failures_is_refused_even_with_the_right_password(
    client, owner
):
    for _ in range(4):
        failed = log_in(client, "wrong password")
        assert failed.status_code == 200 and "Please enter a correct username" in failed.text
    fifth = log_in(client, "wrong password")  # the fifth failure locks, and says so
    assert fifth.status_code == 429 and "Log-in is locked" in fifth.text

    locked = log_in(client, PASSWORD)
    assert locked.status_code == 429
    assert "Too many failed log-ins for this user name from your address" in locked.text
    assert "locked for 15 minutes" in locked.text
    assert client.get(reverse("console-home")).status_code == 302  # not logged in

    # The lock is for this user name from this address: elsewhere the owner still logs in.
    assert log_in(client, PASSWORD, address="10.0.0.2").status_code == 302


def test_a_successful_log_in_clears_earlier_failures(client, owner):
    for _ in range(4):
        log_in(client, "wrong password")
    assert log_in(client, PASSWORD).status_code == 302
    client.post(reverse("logout"))
    for _ in range(4):
        log_in(client, "wrong password")
    assert log_in(client, PASSWORD).status_code == 302
