"""The vast.ai facade through Django's test client: the shapes the CLI sends, translated onto
our services, and the edge cases a user meets (a bad query, someone else's id, a read-only
key, options we cannot honour, shell metacharacters that must stay data).

The CLI itself drives the same endpoints in test_cli_conformance.py; here each body is the one
the CLI 1.9.1 builds (vastai/api/instances.py build_create_instance_payload, the search body
of vastai/cli/commands/offers.py)."""

from __future__ import annotations

import json

import pytest

from marketplace.models import ApiKey, Offer, Rental, SshKey, Volume
from scheduler.models import Instance, InstanceState
from tests.conftest import key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.conftest import fund

pytestmark = [pytest.mark.django_db]

# What `vastai search offers 'num_gpus>=1'` posts (its default filters included).
SEARCH = {
    "verified": {"eq": True},
    "external": {"eq": False},
    "rentable": {"eq": True},
    "num_gpus": {"gte": "1"},
    "order": [["score", "desc"]],
    "type": "on-demand",
    "allocated_storage": 5.0,
}
# What `vastai create instance ID --image … --disk 12.5 --env '-p 8080:8080 -e K=V' --args …`
# puts.
CREATE = {
    "client_id": "me",
    "image": "gpumkt/busybox:latest",
    "env": {"-p 8080:8080": "1", "K": "V"},
    "price": None,
    "disk": 12.5,
    "label": None,
    "extra": None,
    "onstart": "sh",
    "image_login": None,
    "python_utf8": False,
    "lang_utf8": False,
    "use_jupyter_lab": False,
    "jupyter_dir": None,
    "force": False,
    "cancel_unavail": False,
    "template_hash_id": None,
    "user": None,
    "runtype": "args",
    "args": ["-c", "echo hi"],
}


def renter(funded_team):
    return key_client(funded_team)


def bundle(machine, gpus: int | None = None) -> Offer:
    """The machine's offer of ``gpus`` GPUs (default: of all its free GPUs)."""
    if gpus is None:
        return Offer.objects.get(machine=machine, all_free=True)
    return Offer.objects.get(machine=machine, num_gpus=gpus)


def rent(client, machine, gpus: int | None = None, **changes):
    offer = bundle(machine, gpus)
    return client.put(f"/api/v0/asks/{offer.pk}/", {**CREATE, **changes}, format="json")


def test_show_user_answers_the_teams_credit_in_dollars(funded_team):
    body = renter(funded_team).get("/api/v0/users/current").json()
    assert body["balance"] == 100.0 and body["credit"] == 100.0
    assert body["username"] == funded_team.name


def test_search_translates_the_clis_body_and_units(funded_team, machine):
    client = renter(funded_team)
    offers = client.post("/api/v0/bundles/", SEARCH, format="json").json()["offers"]
    # The 4-GPU machine is offered as bundles of 1, 2 and 4 GPUs, each with its own id.
    assert [(o["machine_id"], o["num_gpus"]) for o in offers] == [
        (machine.pk, 1), (machine.pk, 2), (machine.pk, 4),
    ]  # fmt: skip
    assert [o["id"] for o in offers] == [bundle(machine, n).pk for n in (1, 2, 4)]
    row = offers[2]
    assert row["gpu_name"] == "RTX 4090" and row["ask_contract_id"] == row["id"]
    assert row["gpu_ram"] == pytest.approx(23990)  # 23.99 GB in MB: the CLI divides by 1000
    assert row["dph_total"] == pytest.approx(2.0)  # 4 × $0.50
    assert offers[0]["dph_total"] == pytest.approx(0.5) and row["dph_per_gpu"] == 0.5
    # The CLI multiplies GB by 1000 before sending: 20 GB of GPU RAM matches, 30 does not.
    found = client.post("/api/v0/bundles/", {**SEARCH, "gpu_ram": {"gte": 20000.0}}, format="json")
    assert {o["machine_id"] for o in found.json()["offers"]} == {machine.pk}
    none = client.post("/api/v0/bundles/", {**SEARCH, "gpu_ram": {"gte": 30000.0}}, format="json")
    assert none.json()["offers"] == []


def test_a_bad_query_answers_a_readable_msg(funded_team, machine):
    response = renter(funded_team).post(
        "/api/v0/bundles/", {**SEARCH, "gpu_nmae": {"eq": "RTX 4090"}}, format="json"
    )
    assert response.status_code == 400
    body = response.json()
    assert body["success"] is False
    assert "unknown field 'gpu_nmae'" in body["msg"]
    assert body["error"]["code"] == "validation_error"


def test_a_reserved_search_is_refused_not_answered_with_on_demand_offers(funded_team):
    response = renter(funded_team).post(
        "/api/v0/bundles/", {**SEARCH, "type": "reserved"}, format="json"
    )
    assert response.status_code == 400
    assert "on-demand or interruptible" in response.json()["msg"]


def test_a_bid_search_lists_machines_that_take_bids_with_the_whole_offers_min_bid(
    funded_team, machine, sim_host_factory, provider_team
):
    from tests.marketplace.conftest import machine_for

    biddable = machine_for(
        sim_host_factory(gpus=2), provider_team, min_bid_price_per_gpu_hour=150_000
    )
    response = renter(funded_team).post(
        "/api/v0/bundles/", {**SEARCH, "type": "bid"}, format="json"
    )
    assert response.status_code == 200, response.content
    offers = {(o["machine_id"], o["num_gpus"]): o for o in response.json()["offers"]}
    assert sorted(offers) == [(biddable.pk, 1), (biddable.pk, 2)]  # not the on-demand machine
    # vast.ai's units: dollars per hour for the offer's GPUs together (2 × $0.15).
    assert offers[(biddable.pk, 2)]["min_bid"] == 0.3 and offers[(biddable.pk, 2)]["is_bid"]
    assert offers[(biddable.pk, 1)]["min_bid"] == 0.15


def test_a_bid_rents_interruptibly_at_the_bid_split_over_the_offers_gpus(funded_team, machine):
    machine.min_bid_price_per_gpu_hour = 100_000
    machine.save(update_fields=["min_bid_price_per_gpu_hour"])
    response = rent(renter(funded_team), machine, price=1.0)  # the CLI's --bid_price 1.0
    assert response.status_code == 200, response.content
    rental = Rental.objects.get(instance_id=response.json()["new_contract"])
    assert rental.interruptible and rental.gpu_count == 4
    assert rental.price_per_gpu_hour == 250_000  # $1.00 an hour for 4 GPUs


def test_create_rents_the_offer_with_image_disk_env_ports_and_args(funded_team, machine):
    response = rent(renter(funded_team), machine)
    assert response.status_code == 200, response.content
    instance = Instance.objects.get(pk=response.json()["new_contract"])
    assert instance.team == funded_team and instance.machine == machine
    assert instance.image == "gpumkt/busybox:latest"
    assert instance.disk_gb == 13  # 12.5 GB rounded up, never less than asked
    assert instance.launch_mode == "entrypoint"
    assert instance.entrypoint == "sh" and instance.args == ["-c", "echo hi"]
    assert instance.env == {"K": "V"}
    assert [p.container_port for p in instance.port_allocations.all()] == [8080]
    assert instance.gpu_count == 4  # the offer: its bundle of 4 GPUs


def test_create_on_a_one_gpu_bundle_rents_exactly_one_gpu(funded_team, machine):
    client = renter(funded_team)
    single = bundle(machine, 1)
    response = rent(client, machine, gpus=1)
    assert response.status_code == 200, response.content
    instance = Instance.objects.get(pk=response.json()["new_contract"])
    assert instance.gpu_count == 1 and instance.machine == machine
    assert instance.rental.price_per_gpu_hour == 500_000  # the bundle's $0.50 an hour
    # The same bundle is still offered (3 GPUs are free); the 4-GPU one no longer fits.
    after = {o.num_gpus: o for o in Offer.objects.filter(machine=machine)}
    assert after[1].pk == single.pk and after[1].rentable
    assert after[4].rentable is False and after[4].rented is True
    assert after[3].all_free and after[3].rentable  # all 3 free GPUs, its own bundle


def test_a_bundle_that_no_longer_fits_answers_409_and_rents_nothing(funded_team, machine):
    client = renter(funded_team)
    whole = bundle(machine, 4)
    assert rent(client, machine, gpus=1).status_code == 200
    before = Instance.objects.count()
    response = client.put(f"/api/v0/asks/{whole.pk}/", CREATE, format="json")
    assert response.status_code == 409, response.content
    assert response.json()["success"] is False
    assert Instance.objects.count() == before


@pytest.mark.parametrize(
    ("rented", "bundles"), [("any", [1, 2, 3, 4]), (False, [1, 2, 3]), (True, [4])]
)
def test_rented_is_a_field_of_the_search(funded_team, machine, rented, bundles):
    """`vastai self-test machine` searches with rented=any; every search sends rented=false."""
    client = renter(funded_team)
    assert rent(client, machine, gpus=1).status_code == 200
    body = {
        **SEARCH, "rentable": {"eq": "any"}, "rented": {"eq": rented},
        "machine_id": {"eq": machine.pk}, "order": [["num_gpus", "asc"]],
    }  # fmt: skip
    response = client.post("/api/v0/bundles/", body, format="json")
    assert response.status_code == 200, response.content
    found = response.json()["offers"]
    assert [o["num_gpus"] for o in found] == bundles
    assert [o["rented"] for o in found] == [n > 3 for n in bundles]


def test_shell_metacharacters_in_args_and_env_are_kept_as_data(funded_team, machine):
    args = ["-c", "echo $(id); rm -rf / ; `reboot` && true | cat > /x"]
    env = {"X": "a; rm -rf / $(id) `id` 'q' \"dq\"", "-p 9000:9000": "1"}
    response = rent(renter(funded_team), machine, args=args, env=env)
    assert response.status_code == 200, response.content
    instance = Instance.objects.get(pk=response.json()["new_contract"])
    # Each stays one argv element / one value, exactly as typed: the launch hands them to
    # `docker run` as a list (tests/marketplace/test_rentals.py shows the container gets them).
    assert instance.args == args
    assert instance.env == {"X": env["X"]}


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"label": "two\nlines"}, "Printable characters only"),
        ({"price": 0.1}, "This machine takes no bids"),
        ({"image_login": "-u bob -p x docker.io"}, "--login is not supported"),
        ({"env": {"-h": "billybob"}}, "'-h' is not supported"),
        ({"env": {"-p 53:53/udp": "1"}}, "only TCP"),
        ({"runtype": "ssh_proxy", "args": None, "onstart": "echo hi"}, "--onstart-cmd"),
        ({"image": ""}, "image"),
    ],
)
def test_options_we_cannot_honour_are_refused_and_nothing_is_rented(
    funded_team, machine, changes, words
):
    response = rent(renter(funded_team), machine, **changes)
    assert response.status_code == 400, response.content
    assert words in response.json()["msg"]
    assert not Rental.objects.exists()


def test_a_label_is_kept_at_rent_and_changed_by_put(funded_team, machine):
    client = renter(funded_team)
    response = rent(client, machine, label="trainer")
    assert response.status_code == 200, response.content
    instance_id = response.json()["new_contract"]
    assert Instance.objects.get(pk=instance_id).label == "trainer"
    changed = client.put(f"/api/v0/instances/{instance_id}/", {"label": "eval"}, format="json")
    assert changed.status_code == 200 and changed.json()["success"] is True
    shown = client.get(f"/api/v0/instances/{instance_id}/").json()["instances"]
    assert shown["label"] == "eval"
    assert (
        key_client(funded_team).get(f"/api/v1/instances/{instance_id}/").json()["label"] == "eval"
    )
    too_long = client.put(f"/api/v0/instances/{instance_id}/", {"label": "x" * 101}, format="json")
    assert too_long.status_code == 400 and "At most 100 characters" in too_long.json()["msg"]
    assert Instance.objects.get(pk=instance_id).label == "eval"


def test_another_teams_instance_answers_404_and_is_untouched(funded_team, machine):
    instance_id = rent(renter(funded_team), machine).json()["new_contract"]
    other = TeamFactory(name="Other Co")
    add_member(other, UserFactory(username="other"), role="owner")
    fund(other)
    stranger = key_client(other)
    for method, path, body in [
        ("get", f"/api/v0/instances/{instance_id}/", None),
        ("put", f"/api/v0/instances/{instance_id}/", {"state": "stopped"}),
        ("delete", f"/api/v0/instances/{instance_id}/", {}),
        ("put", f"/api/v0/instances/request_logs/{instance_id}/", {}),
        ("put", f"/api/v0/instances/command/{instance_id}/", {"command": "touch /tmp/x"}),
    ]:
        response = getattr(stranger, method)(path, body, format="json")
        assert response.status_code == 404, (method, path, response.content)
        assert (
            response.json()["msg"] == f"Instance {instance_id} is not one of your team's instances."
        )
    assert Instance.objects.get(pk=instance_id).state == InstanceState.LAUNCHING


def test_a_read_only_key_reads_but_cannot_create_or_destroy(funded_team, machine):
    instance_id = rent(renter(funded_team), machine).json()["new_contract"]
    reader = key_client(funded_team, access=ApiKey.Access.READ)
    assert reader.post("/api/v0/bundles/", SEARCH, format="json").status_code == 200
    assert reader.get(f"/api/v0/instances/{instance_id}/").status_code == 200
    for response in (
        rent(reader, machine),
        reader.delete(f"/api/v0/instances/{instance_id}/", {}, format="json"),
        reader.put(f"/api/v0/instances/{instance_id}/", {"state": "stopped"}, format="json"),
        reader.post("/api/v0/ssh/", {"ssh_key": "ssh-ed25519 AAAA x"}, format="json"),
    ):
        assert response.status_code == 403
        assert response.json()["msg"] == "This API key is read-only."
    assert Rental.objects.count() == 1
    assert Instance.objects.get(pk=instance_id).state == InstanceState.LAUNCHING


def test_show_instance_has_the_fields_the_cli_needs(funded_team, machine):
    client = renter(funded_team)
    instance_id = rent(client, machine).json()["new_contract"]
    row = client.get(f"/api/v0/instances/{instance_id}/?owner=me").json()["instances"]
    assert row["id"] == instance_id and row["actual_status"] == "loading"
    assert isinstance(row["start_date"], float)
    assert row["extra_env"] == [["K", "V"]]
    assert row["image_uuid"] == "gpumkt/busybox:latest" and row["num_gpus"] == 4


def test_ssh_keys_are_the_teams(funded_team):
    client = renter(funded_team)
    line = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl me@box"
    created = client.post("/api/v0/ssh/", {"ssh_key": line}, format="json")
    assert created.status_code == 200, created.content
    key = SshKey.objects.get(team=funded_team)
    assert key.name == "me@box"
    assert [row["id"] for row in client.get("/api/v0/ssh/").json()] == [key.pk]
    assert (
        "already on the team"
        in client.post("/api/v0/ssh/", {"ssh_key": line}, format="json").json()["msg"]
    )
    assert client.delete(f"/api/v0/ssh/{key.pk}/").json() == {"success": True}
    assert not SshKey.objects.exists()


def test_a_command_we_do_not_offer_says_so(funded_team):
    response = renter(funded_team).put("/api/v0/instances/recycle/1/", {}, format="json")
    assert response.status_code == 404
    assert "does not offer PUT /api/v0/instances/recycle/1/" in response.json()["msg"]


def test_a_2fa_command_is_refused_with_the_error_code_the_cli_reads(funded_team):
    # vastai 1.9.1's tfa login looks its answer's "error" up in a set of codes: an object there
    # was a traceback.
    response = renter(funded_team).post("/api/v0/tfa/", {"code": "123456"}, format="json")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"
    assert "does not offer POST /api/v0/tfa/" in response.json()["msg"]


def test_listing_a_volume_offer_is_refused_naming_the_command(funded_team):
    response = renter(funded_team).post(
        "/api/v0/volumes/", {"size": 5, "machine": 1, "price_disk": 0.1}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["msg"].startswith("list volume is not offered")
    assert not Volume.objects.exists()


def test_no_key_answers_401_with_a_msg(client):
    response = client.get("/api/v0/users/current")
    assert response.status_code == 401
    assert response.json()["msg"]


# --- hosting ---------------------------------------------------------------------------------


def provider(provider_team):
    return key_client(provider_team, audience=ApiKey.Audience.PROVIDER)


LIST = {  # what `vastai list machine ID -g 0.75 -s 0.2 -e <epoch> -m 2` puts
    "price_gpu": 0.75,
    "price_disk": 0.2,
    "price_inetu": None,
    "price_inetd": None,
    "price_min_bid": None,
    "min_chunk": 2,
    "credit_discount_max": None,
    "duration": None,
    "vol_size": None,
    "vol_price": None,
}


def test_list_machine_sets_the_terms_and_lists(provider_team, machine):
    from datetime import timedelta

    from django.utils import timezone

    ends = (timezone.now() + timedelta(days=30)).replace(microsecond=0)
    body = {**LIST, "machine": machine.pk, "end_date": ends.timestamp()}
    machine.listed = False
    machine.save(update_fields=["listed"])
    response = provider(provider_team).put("/api/v0/machines/create_asks/", body, format="json")
    assert response.json() == {"success": True, "extended": 0}
    machine.refresh_from_db()
    assert machine.listed and machine.end_date == ends and machine.min_gpus == 2
    assert (machine.price_per_gpu_hour, machine.storage_price_per_gb_month) == (750_000, 200_000)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"price_min_bid": 0}, "min_bid_price_per_gpu_hour: Between $0.000001"),
        ({"price_min_bid": -0.5}, "--price_min_bid: The amount must not be negative."),
        ({"price_gpu": -1}, "--price_gpu: The amount must not be negative."),
        ({"price_gpu": "lots"}, "--price_gpu: a price in dollars"),
        ({"min_chunk": 9}, "min_gpus: Between 1 and the machine's 4 GPU(s)."),
        ({"end_date": 1.0}, "end_date: The end date must be in the future."),
    ],
)
def test_bad_listing_terms_change_nothing(provider_team, machine, changes, words):
    before = (machine.price_per_gpu_hour, machine.min_gpus, machine.end_date, machine.listed)
    body = {**LIST, "machine": machine.pk, "end_date": None, **changes}
    response = provider(provider_team).put("/api/v0/machines/create_asks/", body, format="json")
    assert response.status_code == 400, response.content
    assert words in response.json()["msg"]
    machine.refresh_from_db()
    assert (
        machine.price_per_gpu_hour,
        machine.min_gpus,
        machine.end_date,
        machine.listed,
    ) == before


def test_another_teams_machine_answers_404(funded_team, machine):
    client = renter(funded_team)
    body = {**LIST, "machine": machine.pk, "end_date": None}
    for response in (
        client.put("/api/v0/machines/create_asks/", body, format="json"),
        client.delete(f"/api/v0/machines/{machine.pk}/asks/"),
        client.put(f"/api/v0/machines/{machine.pk}/dnotify/", {"sdate": 2e9, "duration": 1}),
    ):
        assert response.status_code == 404
        assert response.json()["msg"] == f"Machine {machine.pk} is not one of your team's machines."
    machine.refresh_from_db()
    assert machine.listed and machine.price_per_gpu_hour == 500_000
    assert not machine.maintenance_windows.exists()
    assert renter(funded_team).get("/api/v0/machines?owner=me").json() == {"machines": []}


def test_a_read_only_provider_key_cannot_unlist(provider_team, machine):
    reader = key_client(provider_team, access=ApiKey.Access.READ)
    assert [m["id"] for m in reader.get("/api/v0/machines").json()["machines"]] == [machine.pk]
    response = reader.delete(f"/api/v0/machines/{machine.pk}/asks/")
    assert response.status_code == 403
    machine.refresh_from_db()
    assert machine.listed


def test_schedule_maint_records_a_window(provider_team, machine):
    import time

    starts = float(int(time.time()) + 86400)
    response = provider(provider_team).put(
        f"/api/v0/machines/{machine.pk}/dnotify/",
        {"client_id": "me", "sdate": starts, "duration": 1.5, "maintenance_category": "power"},
        format="json",
    )
    assert response.json()["success"] is True
    window = machine.maintenance_windows.get()
    assert window.starts_at.timestamp() == starts
    assert (window.ends_at - window.starts_at).total_seconds() == 5400
    bad = provider(provider_team).put(
        f"/api/v0/machines/{machine.pk}/dnotify/",
        {"sdate": starts, "duration": "nan"},
        format="json",
    )
    assert bad.status_code == 400 and "--duration" in bad.json()["msg"]


def test_the_v0_schema_describes_vasts_paths_and_v1s_leaves_them_out(funded_team):
    client = renter(funded_team)
    v0 = client.get("/api/v0/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    assert v0["servers"] == [{"url": "/api/v0"}]
    assert {"/bundles/", "/asks/{offer_id}/", "/instances/{id}/", "/machines/create_asks/"} <= set(
        v0["paths"]
    )
    v1 = client.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    assert not [path for path in v1["paths"] if path.startswith("/api/v0/")]
    assert "/api/v1/offers/" in v1["paths"]


def test_the_instance_list_pages_as_the_cli_asks(funded_team, machine, sim_host_factory):
    from tests.marketplace.conftest import machine_for

    client = renter(funded_team)
    first = rent(client, machine).json()["new_contract"]
    second_machine = machine_for(sim_host_factory(gpus=1), machine.team)
    second = rent(client, second_machine).json()["new_contract"]
    query = (
        '?select_filters={"actual_status": {"in": ["loading"]}}'
        '&order_by=[{"col": "id", "dir": "asc"}]&limit=1'
    )
    page = client.get("/api/v0/instances/" + query).json()
    assert [row["id"] for row in page["instances"]] == [first]
    assert page["total_instances"] == 2 and page["next_token"] == str(first)
    rest = client.get(f"/api/v0/instances/{query}&after_token={page['next_token']}").json()
    assert [row["id"] for row in rest["instances"]] == [second] and rest["next_token"] is None
    running = client.get('/api/v0/instances/?select_filters={"actual_status": {"in": ["running"]}}')
    assert running.json()["instances"] == []
    labelled = client.get('/api/v0/instances/?select_filters={"label": {"in": ["x"]}}')
    assert labelled.status_code == 400 and "--status only" in labelled.json()["msg"]
    other = TeamFactory(name="Other Co")
    add_member(other, UserFactory(username="other"), role="owner")
    assert key_client(other).get("/api/v0/instances/?owner=me").json()["instances"] == []


def test_for_vastai_cli_sends_the_clis_list_here_and_the_rest_to_v1(funded_team, machine):
    """The wrapper offered to marketplace/urls.py for GET /api/v1/instances/."""
    from rest_framework.test import APIRequestFactory

    from marketplace.api.rentals import InstanceViewSet
    from marketplace.services.accounts import api_key_create
    from marketplace.vast.views import for_vastai_cli

    instance_id = rent(renter(funded_team), machine).json()["new_contract"]
    membership = funded_team.memberships.get(role="owner")
    secret = api_key_create(membership=membership, name="k", access="write", audience="all").secret
    view = for_vastai_cli(InstanceViewSet.as_view({"get": "list", "post": "create"}))
    factory = APIRequestFactory()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    cli = view(factory.get("/api/v1/instances/", {"select_filters": "{}", "limit": 25}, **auth))
    cli.render()
    assert [row["id"] for row in json.loads(cli.content)["instances"]] == [instance_id]
    ours = view(factory.get("/api/v1/instances/", **auth))
    ours.render()
    assert [row["id"] for row in json.loads(ours.content)["results"]] == [instance_id]


@pytest.mark.parametrize(
    ("runtype", "mode"),
    [
        ("ssh", "ssh"),  # the CLI's default, no flag
        ("ssh_proxy", "ssh"),  # --ssh
        ("ssh_direc ssh_proxy", "ssh"),  # --ssh --direct
        ("jupyter_proxy ssh_proxy", "jupyter"),  # --jupyter
        ("jupyter_direc ssh_direc ssh_proxy", "jupyter"),  # --jupyter --direct
    ],
)
def test_the_clis_launch_flags_choose_our_launch_mode(funded_team, machine, runtype, mode):
    response = rent(renter(funded_team), machine, runtype=runtype, args=None, onstart=None)
    assert response.status_code == 200, response.content
    instance = Instance.objects.get(pk=response.json()["new_contract"])
    assert instance.launch_mode == mode and instance.args == [] and instance.entrypoint == ""


def test_an_unknown_launch_type_is_refused(funded_team, machine):
    response = rent(renter(funded_team), machine, runtype="vm")
    assert response.status_code == 400
    assert response.json()["msg"] == "Unknown launch type 'vm'."
    assert not Rental.objects.exists()
