"""Which keys the gateway goes on letting through by itself while the web processes are down:
each push keeps only those a web process would let through now and did let through lately."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace.clusters import remembered
from marketplace.clusters.services import ClusterSpec, cluster_create
from marketplace.models import ApiKey, Role
from marketplace.services.accounts import api_key_create, api_key_revoke, membership_remove
from tests.factories import TeamFactory, UserFactory, add_member

pytestmark = pytest.mark.django_db


def test_a_push_keeps_only_keys_that_still_pass_and_passed_lately(funded_team, owner, settings):
    settings.GATEWAY_ADMIN = ""  # no gateway here: what is checked is the choice of keys
    cluster = cluster_create(
        team=funded_team,
        spec=ClusterSpec(name="svc", image="busybox", gpu_names=["None"], service_port=80),
    )
    owners = funded_team.memberships.get(user=owner)
    leaver = add_member(funded_team, UserFactory(username="leaver"), Role.ADMIN)
    other_team = TeamFactory(name="Other")
    others = add_member(other_team, UserFactory(username="other"), Role.OWNER)

    def key(membership, **kwargs) -> str:
        return api_key_create(membership=membership, name="k", **kwargs).secret

    kept, revoked, expired, not_lately = (key(owners) for _ in range(4))
    leavers = key(leaver)
    others_key = key(others)
    operator = key(owners, audience=ApiKey.Audience.PROVIDER)
    for k in (kept, revoked, expired, leavers, others_key, operator):
        remembered.seen_now(k)  # a web process let each through (not_lately: never)

    api_key_revoke(membership=owners, api_key=ApiKey.objects.get(prefix=revoked.split("_")[1]))
    ApiKey.objects.filter(prefix=expired.split("_")[1]).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    membership_remove(actor=owners, target=leaver)

    every = {kept, revoked, expired, leavers, not_lately, others_key, operator, "gpk_x_y", "x"}
    assert remembered.still_allowed(
        {cluster.pk: every, cluster.pk + 1: {kept}}, {cluster.pk: funded_team.pk}
    ) == {cluster.pk: {kept}}
