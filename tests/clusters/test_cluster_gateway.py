"""Clusters through the real gateway: Caddy 2 in front, Django answering its forward-auth,
replicas on simulated hosts (real sshd + Docker) running busybox httpd that answers with its
container's name."""

from __future__ import annotations

import subprocess
import time
from collections import Counter

import pytest
from django.test import Client

from billing.models import Hold
from billing.selectors import team_balance
from marketplace.clusters import routes
from marketplace.clusters.tasks import clusters_tick
from marketplace.models import ApiKey, Cluster, Rental
from marketplace.services.accounts import api_key_revoke, membership_remove
from marketplace.services.pricing import quote_at
from scheduler import services as scheduler
from scheduler.models import PortAllocation
from tests.billing.ledger_checks import assert_ledger_consistent, holds_and_balance
from tests.clusters.support import (
    IMAGE,
    SERVE_NAME,
    Load,
    bearer,
    call,
    create,
    key_secret,
    path_of,
    pushing_until,
    rolled,
    routed,
    routes_settle,
    serving,
)
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import (
    PRICE_PER_GPU_HOUR,
    STORAGE_PER_GB_MONTH,
    until,
)

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

NEW_IMAGE = "gpumkt/busybox:rolled"


def moved_to_8081(admin: str, cluster_id: int, first_instances: list[int]) -> bool:
    """Every replica routed is a new one publishing 8081, and the old ones are gone."""
    running = Cluster.objects.get(pk=cluster_id).deployment.replicas.filter(state="running")
    instance_ids = [r.instance_id for r in running]
    return (
        len(instance_ids) == 3
        and not set(instance_ids) & set(first_instances)
        and routed(admin, cluster_id) == published_at(instance_ids, 8081)
    )


def published_at(instance_ids: list[int], container_port: int) -> set[str]:
    """``address:host_port`` of each instance that publishes ``container_port``."""
    rows = PortAllocation.objects.filter(
        instance_id__in=instance_ids, container_port=container_port, released_at=None
    ).values_list("machine__address", "host_port")
    return {f"{address}:{port}" for address, port in rows}


def test_a_cluster_url_balances_over_its_replicas_and_answers_only_its_team(
    funded_team, owner, teammate, machines, gateway, settings
):
    client = key_client(funded_team)
    created = create(client)
    assert (created["state"], created["replicas"], created["running"]) == ("running", 3, 3)
    assert created["url"] == f"{gateway.url}/clusters/{created['id']}/service/"
    path = path_of(created["url"])
    first_instances = list(
        Cluster.objects.get(pk=created["id"]).deployment.replicas.values_list(
            "instance_id", flat=True
        )
    )
    routes_settle(gateway.admin, created["id"], 3)
    key = bearer(key_secret(funded_team))

    names = Counter(call(gateway.listen, path, key)[1] for _ in range(300))
    containers = {
        r.instance.container_name: r.instance.container_id
        for r in Cluster.objects.get(pk=created["id"]).deployment.replicas.select_related(
            "instance"
        )
    }
    # Every one of the 3 replicas answered, about a third each (round robin).
    assert len(names) == 3 and all(90 <= n <= 110 for n in names.values()), names
    assert {name[:12] for name in names} == {cid[:12] for cid in containers.values()}

    # No credentials, a wrong key, another team's key: the same 401 as a cluster that does not
    # exist, so nothing tells an outsider the cluster is there.
    outsider_team = TeamFactory(name="Other")
    add_member(outsider_team, UserFactory(username="other"), "owner")
    nobody = call(gateway.listen, path)
    assert nobody[0] == 401
    assert call(gateway.listen, path, bearer("gpk_nope_nope"))[0] == 401
    assert call(gateway.listen, path, bearer(key_secret(outsider_team))) == nobody
    assert call(gateway.listen, "/clusters/999999/service/", key) == nobody
    # A member's console session passes; an outsider's does not.
    member = Client()
    member.force_login(owner)
    cookie = {"Cookie": f"sessionid={member.cookies['sessionid'].value}"}
    assert call(gateway.listen, path, cookie)[0] == 200
    stranger = Client()
    stranger.force_login(outsider_team.memberships.get().user)
    strangers_cookie = {"Cookie": f"sessionid={stranger.cookies['sessionid'].value}"}
    assert call(gateway.listen, path, strangers_cookie)[0] == 401

    # A member removed from the team, like a revoked key, is refused within the auth
    # cache's few seconds.
    leaver = Client()
    leaver.force_login(teammate)
    leaver_cookie = {"Cookie": f"sessionid={leaver.cookies['sessionid'].value}"}
    assert call(gateway.listen, path, leaver_cookie)[0] == 200
    membership_remove(
        actor=funded_team.memberships.get(user=owner),
        target=funded_team.memberships.get(user=teammate),
    )

    revoked = key_secret(funded_team)
    assert call(gateway.listen, path, bearer(revoked))[0] == 200
    api_key_revoke(
        membership=funded_team.memberships.first(),
        api_key=ApiKey.objects.get(prefix=revoked.split("_")[1]),
    )
    # Refused once the remembered answers expire: polled, with the cache's time and a busy
    # machine's margin as the deadline.
    refused_within = settings.GATEWAY_AUTH_CACHE_SECONDS + 10
    until(lambda: call(gateway.listen, path, bearer(revoked))[0] == 401, refused_within)
    until(lambda: call(gateway.listen, path, leaver_cookie)[0] == 401, refused_within)

    # The port changes (the replicas roll to publish 8081) while requests flow: the URL
    # stays and never fails.
    with Load(gateway.listen, path, key, rate=20) as load:
        moved = client.put(
            f"/api/v1/clusters/{created['id']}/endpoint/", {"port": 8081}, format="json"
        )
        assert moved.status_code == 200, moved.content
        assert (moved.json()["url"], moved.json()["service_port"]) == (created["url"], 8081)
        pushing_until(lambda: moved_to_8081(gateway.admin, created["id"], first_instances))
        load.more(20)  # and on over the new port a while
    assert load.failed == [] and len(load.results) > 20
    assert moved_to_8081(gateway.admin, created["id"], first_instances)

    # Stop: nothing runs, the URL still answers its team (503, it is stopped); resume: the
    # same URL serves again.
    stopped = client.post(f"/api/v1/clusters/{created['id']}/stop/")
    assert (stopped.json()["state"], stopped.json()["running"]) == ("stopped", 0)
    assert call(gateway.listen, path, key)[0] == 503
    assert call(gateway.listen, path)[0] == 401
    resumed = client.post(f"/api/v1/clusters/{created['id']}/resume/")
    assert (resumed.json()["state"], resumed.json()["running"], resumed.json()["url"]) == (
        "running",
        3,
        created["url"],
    )
    routes_settle(gateway.admin, created["id"], 3)
    assert {call(gateway.listen, path, key)[0] for _ in range(10)} == {200}


def test_a_port_the_new_replicas_do_not_answer_on_leaves_the_old_ones_serving(
    funded_team, machines, gateway
):
    """Moving the URL's port rolls the replicas; until a new one answers on the new port, the
    old ones go on serving on the port they publish. Here the app never listens on 8082, so
    the roll waits and the URL keeps answering from the old replicas."""
    client = key_client(funded_team)
    it = serving(client, funded_team, gateway)
    old = set(it.cluster.deployment.replicas.values_list("instance_id", flat=True))

    moved = client.put(f"/api/v1/clusters/{it.cluster.pk}/endpoint/", {"port": 8082}, format="json")
    assert moved.status_code == 200, moved.content
    for _ in range(5):  # as the worker's retries would
        routes.routes_push()
        time.sleep(0.2)
    assert routed(gateway.admin, it.cluster.pk) == it.routed
    assert {call(gateway.listen, it.path, it.key)[0] for _ in range(20)} == {200}
    # The roll waits on its one new replica, which does not answer; no old one was stopped.
    running = it.cluster.deployment.replicas.filter(state="running")
    assert set(running.values_list("instance_id", flat=True)) > old
    assert running.count() == 4 and running.filter(ready_at=None).count() == 1
    # The cluster says what its roll waits for, and where to look.
    unready = running.get(ready_at=None)
    reason = client.get(f"/api/v1/clusters/{it.cluster.pk}/").json()["queue_reason"]
    assert reason == (
        f"rolling update waits for replica {unready.pk} to answer on port 8082 at the"
        " cluster's URL; the old replicas keep serving meanwhile"
    )


def test_a_killed_replica_is_replaced_while_requests_flow(funded_team, machines, gateway):
    """20 requests/s through the URL while one replica's container is killed: the gateway
    retries a request that reached the dead replica on another one, its health checks take
    the replica out, the monitor sees it die and a new one is placed and added once it
    answers. Measured bound: 0 failed requests (asserted ≤ 1%, a slow machine's margin)."""
    client = key_client(funded_team)
    it = serving(client, funded_team, gateway)
    victim = it.cluster.deployment.replicas.select_related("instance").first()

    with Load(gateway.listen, it.path, it.key, rate=20) as load:
        load.more(20)
        subprocess.run(
            ["docker", "kill", victim.instance.container_id], check=True, capture_output=True
        )
        load.more(20)  # requests meet the dead replica before the monitor looks
        scheduler.machine_reconcile(machine_id=victim.instance.machine_id)  # as its beat does
        after = routes_settle(gateway.admin, it.cluster.pk, 3)
        load.more(40)
    victim.refresh_from_db()
    assert victim.state == "failed" and victim.exit_code == 137
    assert len(after) == 3 and after != it.routed  # the new replica took the dead one's place
    names = Counter(body for status, body in load.results if status == 200)
    print(f"kill under load: {len(load.failed)} of {len(load.results)} requests failed")
    assert len(load.results) >= 60
    assert len(load.failed) <= len(load.results) // 100, load.failed
    # The last requests are spread over three live replicas again.
    tail = Counter(body for _, body in load.results[-30:])
    assert len(tail) == 3 and victim.instance.container_id[:12] not in tail, (tail, names)


def test_scaling_holds_for_new_replicas_and_releases_what_stopped_ones_did_not_use(
    funded_team, machines
):
    client = key_client(funded_team)
    created = create(client, service_port=None)
    assert created["url"] is None
    base = f"/api/v1/clusters/{created['id']}/"
    funded = team_balance(funded_team.pk).total

    grown = client.post(f"{base}scale/", {"replicas": 5}, format="json")
    assert (grown.status_code, grown.json()["running"]) == (200, 5), grown.content
    rentals = list(Rental.objects.filter(instance__replica__deployment_id=created["deployment_id"]))
    holds = {h.pk: h for h in Hold.objects.filter(pk__in=[r.hold_id for r in rentals])}
    assert len(holds) == 5
    for rental in rentals:  # each replica holds rate × GPUs × its hours, disk included
        seconds = (rental.ends_at - rental.starts_at).total_seconds()
        quote = quote_at(
            price_per_gpu_hour=PRICE_PER_GPU_HOUR,
            storage_price_per_gb_month=STORAGE_PER_GB_MONTH,
            gpu_count=1,
            disk_gb=1,
            hours=seconds / 3600,
        )
        assert holds[rental.hold_id].amount == quote.total
    # A metering sweep may already have captured the first seconds of some holds.
    holds, balance = holds_and_balance(holds, funded_team.pk)
    assert balance.held == sum(h.remaining for h in holds.values())
    # Holding moves credit and spends none: only what was captured has left the team.
    assert balance.total == funded - sum(h.captured for h in holds.values())

    shrunk = client.post(f"{base}scale/", {"replicas": 2}, format="json")
    assert (shrunk.json()["replicas"], shrunk.json()["running"]) == (2, 2)
    stopped = Rental.objects.filter(
        instance__replica__deployment_id=created["deployment_id"],
        instance__replica__state="stopped",
    )
    assert stopped.count() == 3
    captured = 0
    for rental in stopped:
        hold = Hold.objects.get(pk=rental.hold_id)
        assert rental.settled_at is not None and hold.status != "open"
        # What it used is captured, to the micro-dollar; the rest is released.
        used = hold.captured_gpu + hold.captured_storage
        assert used + hold.released == hold.amount and hold.released > 0
        captured += used
    running_holds, balance = holds_and_balance([r.hold_id for r in rentals], funded_team.pk)
    still = [h for h in running_holds.values() if h.status == "open"]
    assert len(still) == 2
    assert balance.held == sum(h.remaining for h in still)
    assert balance.total == funded - captured - sum(h.captured for h in still)

    # Extending moves each running replica's rental end, and its hold grows by that hour.
    amounts = {h.pk: h.amount for h in still}
    extended = client.post(f"{base}extend/", {"hours": 1}, format="json")
    assert extended.status_code == 200, extended.content
    one_hour = quote_at(
        price_per_gpu_hour=PRICE_PER_GPU_HOUR,
        storage_price_per_gb_month=STORAGE_PER_GB_MONTH,
        gpu_count=1,
        disk_gb=1,
        hours=1,
    ).total
    for hold in Hold.objects.filter(pk__in=amounts):
        assert hold.amount - amounts[hold.pk] == pytest.approx(one_hour, abs=2000)
    assert_ledger_consistent()


def test_a_rolling_update_of_the_image_fails_no_request(funded_team, machines, gateway):
    """The image changes under 20 requests/s: one new replica at a time starts beside the
    old ones, joins the gateway once it answers (each takes 4 s to), and only then does an old
    one leave the gateway, drained before it is stopped: no request fails."""
    subprocess.run(["docker", "tag", IMAGE, NEW_IMAGE], check=True, capture_output=True)
    client = key_client(funded_team)
    created = create(client)
    path = path_of(created["url"])
    routes_settle(gateway.admin, created["id"], 3)
    key = bearer(key_secret(funded_team))
    with Load(gateway.listen, path, key, rate=20) as load:
        load.more(20)
        # The new replicas take 4 s to answer: each old one stays until a new one does
        # (rolling on "running" alone, this test saw 32 of 270 requests answered 503).
        slow = [SERVE_NAME[0], "sleep 4; " + SERVE_NAME[1]]
        patched = client.patch(
            f"/api/v1/clusters/{created['id']}/", {"image": NEW_IMAGE, "args": slow}, format="json"
        )
        assert patched.status_code == 200, patched.content
        rolled(gateway.admin, Cluster.objects.get(pk=created["id"]), NEW_IMAGE, 3)
        load.more(20)
    print(f"rolling update under load: {len(load.failed)} of {len(load.results)} requests failed")
    assert load.failed == [] and len(load.results) >= 40
    running = Cluster.objects.get(pk=created["id"]).deployment.replicas.filter(state="running")
    assert sorted(r.instance.image for r in running) == [NEW_IMAGE] * 3


def test_autoscaling_follows_the_request_rate_between_its_bounds(
    funded_team, machines, gateway, settings
):
    """Over the target per replica the cluster grows within 30 s (to its maximum here);
    idle, it shrinks back to its minimum."""
    settings.CLUSTER_SCALE_DOWN_WINDOW = 5
    client = key_client(funded_team)
    created = create(client, replicas=2, min_replicas=2, max_replicas=4, target_rps_per_replica=4)
    path = path_of(created["url"])
    routes_settle(gateway.admin, created["id"], 2)
    key = bearer(key_secret(funded_team))
    cluster = Cluster.objects.get(pk=created["id"])

    with Load(gateway.listen, path, key, rate=25):  # 25/s over 2 replicas: 12.5 each, target 4
        started = time.monotonic()
        while cluster.replicas < 4:
            assert time.monotonic() - started < 30, "not scaled up within 30 s"
            time.sleep(1)
            clusters_tick()  # as the beat does every 5 s
            cluster.refresh_from_db()
        assert client.get(f"/api/v1/clusters/{created['id']}/").json()["running"] == 4
        routes_settle(gateway.admin, created["id"], 4)

    started = time.monotonic()
    while cluster.replicas > 2:
        assert time.monotonic() - started < 30, "not scaled down when idle"
        time.sleep(1)
        clusters_tick()
        cluster.refresh_from_db()
    assert client.get(f"/api/v1/clusters/{created['id']}/").json()["running"] == 2
    routes_settle(gateway.admin, created["id"], 2)
