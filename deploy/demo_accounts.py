"""Accounts and machines for a local cluster (``make cluster-demo``, the cluster test).

Run inside the cluster's Django (``manage.py shell -c``), never by the marketplace itself:

    from deploy.demo_accounts import populate; populate("hosts.json", renters=8)

prints one JSON object: each renter's team id, API key and (for the first) a session cookie,
and the machines' ids. Unlike ``demo_data`` it runs with DEBUG off (as production settings
are) and publishes no password: renters log in with the cookie or the key it prints.
"""

from __future__ import annotations

import importlib
import json
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY

from billing.credits import credit_grant
from billing.money import MICRO_PER_DOLLAR
from hosts.demo import demo_step as hosts_demo_step
from hosts.models import Machine
from marketplace.models import Membership, Role, Team, User
from marketplace.services.accounts import api_key_create

CREDIT = 200 * MICRO_PER_DOLLAR
SHORT_CREDIT = MICRO_PER_DOLLAR // 100  # a cent: any rental is refused with 402


def _user(username: str) -> User:
    user = User.objects.filter(username=username).first()
    if user is None:
        user = User.objects.create_user(
            username=username,
            email=f"{username}@cluster.invalid",
            password=secrets.token_urlsafe(24),  # unknown to anyone: keys and cookies only
        )
    if not Membership.objects.filter(user=user, team__personal=True).exists():
        team = Team.objects.create(name=f"{username}'s team", personal=True)
        Membership.objects.create(team=team, user=user, role=Role.OWNER)
    return user


def session_cookie(user: User) -> str:
    """A signed-in session for ``user``, as the log-in page would make it."""
    engine = importlib.import_module(settings.SESSION_ENGINE)
    session = engine.SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.save()
    return session.session_key


def populate(simhosts: str, *, renters: int = 8, short_of_credit: int = 1) -> dict:
    """A provider listing every simulated host, ``renters`` renter teams with credit (the
    last ``short_of_credit`` of them with a cent), an API key each."""
    provider = _user("cluster-provider")
    hosts = json.loads(Path(simhosts).read_text())
    message = hosts_demo_step({"provider": provider}, hosts)
    team_id = provider.memberships.get(team__personal=True).team_id
    machines = list(
        Machine.objects.filter(team_id=team_id).order_by("pk").values_list("pk", flat=True)
    )
    if len(machines) != len(hosts):
        raise RuntimeError(f"machines not listed: {message}")
    out = {"machines": machines, "renters": []}
    for number in range(renters):
        user = _user(f"cluster-renter-{number}")
        membership = user.memberships.get(team__personal=True)
        short = number >= renters - short_of_credit
        credit_grant(
            team_id=membership.team_id,
            amount=SHORT_CREDIT if short else CREDIT,
            reason="Cluster demo credit",
            idempotency_key=f"cluster-credit:team-{membership.team_id}",
        )
        key = api_key_create(membership=membership, name="cluster", access="write").secret
        out["renters"].append(
            {
                "user": user.username,
                "team_id": membership.team_id,
                "key": key,
                "short_of_credit": short,
                "session": session_cookie(user),
            }
        )
    print(json.dumps(out))
    return out
