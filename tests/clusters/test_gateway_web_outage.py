"""While no web process answers the gateway's forward-auth, a cluster's URL goes on serving
the keys a web process let through recently, and only those; revoking one takes it out of
the gateway at once."""

from __future__ import annotations

import pytest
from django.test.testcases import LiveServerThread

from marketplace.clusters import routes
from marketplace.models import ApiKey
from marketplace.services.accounts import api_key_revoke
from scheduler import gateway as gw
from tests.clusters.support import bearer, call, key_secret, serving
from tests.conftest import key_client
from tests.marketplace.conftest import until

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def web(gateway, settings):
    """A web server of its own answering the gateway's forward-auth, to stop mid-test."""
    server = LiveServerThread("127.0.0.1", lambda app: app)
    server.daemon = True
    server.start()
    server.is_ready.wait()
    if server.error:
        raise server.error
    settings.GATEWAY_AUTH_UPSTREAM = f"127.0.0.1:{server.port}"
    routes.routes_push()
    yield server
    server.terminate()


def remembered(admin: str, cluster_id: int) -> set[str]:
    """The ``Authorization`` values the gateway lets through by itself for the cluster."""
    errors = (gw.CaddyAdmin(admin).server().get("errors") or {}).get("routes") or []
    return gw.remembered_keys(errors).get(cluster_id, set())


def test_a_cluster_url_serves_recently_checked_keys_while_the_web_is_down(
    funded_team, machines, gateway, web
):
    it = serving(key_client(funded_team), funded_team, gateway, replicas=2)
    kept, revoked = it.key, bearer(key_secret(funded_team))
    never_used = bearer(key_secret(funded_team))
    for key in (kept, revoked):
        assert call(gateway.listen, it.path, key)[0] == 200  # checked by the web process
    headers = {kept["Authorization"], revoked["Authorization"]}
    until(lambda: remembered(gateway.admin, it.cluster.pk) == headers, 10)

    web.terminate()  # the web process is down: its port refuses connections

    answers = [call(gateway.listen, it.path, kept) for _ in range(6)]
    assert {status for status, _ in answers} == {200}
    assert {body for _, body in answers} <= replica_names(it)
    assert call(gateway.listen, it.path, revoked)[0] == 200
    # A key no web process let through, another cluster's URL, a made-up key, no key: none
    # gets to a replica.
    for path, headers in [
        (it.path, never_used),
        (it.path, bearer("gpk_nope_nope")),
        (it.path, {}),
        (f"/clusters/{it.cluster.pk + 1}/service/", kept),
    ]:
        status, body = call(gateway.listen, path, headers)
        assert status in (401, 502) and body not in replica_names(it), (path, status, body)

    # Revoked (here, while the API's web process is down, by the same services the API
    # uses): refused from the next request on; the other key still passes.
    api_key_revoke(
        membership=funded_team.memberships.get(role="owner"),
        api_key=ApiKey.objects.get(prefix=revoked["Authorization"].split("_")[1]),
    )
    assert remembered(gateway.admin, it.cluster.pk) == {kept["Authorization"]}
    assert call(gateway.listen, it.path, revoked)[0] == 502
    assert call(gateway.listen, it.path, kept)[0] == 200


def replica_names(it) -> set[str]:
    """What the cluster's replicas answer with: their containers' names (hostnames)."""
    return {
        r.instance.container_id[:12]
        for r in it.cluster.deployment.replicas.select_related("instance")
    }
