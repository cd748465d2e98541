"""Hostile inputs over both APIs and the console's forms: each is answered with a 4xx in the
API's error shape naming the field (the console: a message naming it), nothing is written, and
no traceback reaches any log (issue 30 §3, §4).

Part of the list is written by hand (each one a bug a user met, or its sibling); the rest is
generated from the two OpenAPI schemas: every id in every path, past what the database holds;
every text property of every request body, sent an object.
"""

from __future__ import annotations

import html
import json
import logging
import re
from dataclasses import dataclass
from urllib.parse import quote

import pytest
from django.apps import apps
from django.test import Client
from rest_framework.test import APIClient

from billing.credits import credit_grant
from billing.money import MICRO_PER_DOLLAR
from marketplace.models import Offer, Role
from marketplace.rentals.renting import RentalRequest, rental_create
from tests.conftest import client_for, key_client
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.test_api_number_inputs import (
    APPS_THAT_HOLD_STATE,
    api_schema,
    machine_for_sale,
    resolve,
)
from tests.marketplace.test_console_actions import page_messages

pytestmark = pytest.mark.django_db

BIG_IDS = [2**63, 10**22, 1180591620717411303424]
SSH_LINE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl me@box"
# Names and labels a user types: each refused by the one rule (hosts/user_text.py).
BAD_NAMES = [
    "d\n\u202e",  # the deployment name
    "\u202eevil.exe",  # right-to-left override
    "tab\there",
    "esc\x1b[31mred",
    "zero\u200bwidth",
    "nul\x00",
    "line\u2028sep",
]
DEEP_ARRAY = "[" * 10_000 + "]" * 10_000
DEEP_OBJECT = '{"a":' * 10_000 + "1" + "}" * 10_000


@dataclass
class Hostile:
    """One request: who sends it, what, and the field its answer must name (None: a request
    that is wrong as a whole, such as a body nested 10,000 deep)."""

    name: str
    method: str
    path: str
    body: object = None  # a dict/list is sent as JSON; a str as it is
    field: str | None = None
    status: tuple[int, ...] = (400,)
    vast: bool = False


@pytest.fixture
def place(team, owner):
    """A funded renter team with one rental (an instance) on another provider's 8-GPU machine,
    and a second team's instance."""
    provider = TeamFactory(name="Provider")
    add_member(provider, UserFactory(username="provider"), Role.OWNER)
    machine = machine_for_sale(provider, "hostile", gpus=8)
    credit_grant(team_id=team.pk, amount=100 * MICRO_PER_DOLLAR, reason="t", idempotency_key="h")
    rental = rental_create(
        team=team,
        request=RentalRequest(
            machine_id=machine.pk, gpu_count=1, image="gpumkt/busybox:latest", hours=2
        ),
    ).rental
    session = APIClient()  # for what the API leaves to the console (API keys, members)
    session.cookies = client_for(Client(), owner, team).cookies
    return {
        "machine": machine,
        "own": machine_for_sale(team, "own-hostile", gpus=1),
        "instance_id": rental.instance_id,
        "api": key_client(team),
        "session": session,
    }


def row_counts() -> dict[str, int]:
    return {
        model._meta.label: model.objects.count()
        for label in APPS_THAT_HOLD_STATE
        for model in apps.get_app_config(label).get_models()
    }


def rent_body(place, **changes) -> dict:
    body = {
        "machine_id": place["machine"].pk,
        "num_gpus": 1,
        "image": "gpumkt/busybox:latest",
        "duration_hours": 1,
    }
    return {**body, **changes}


def v1_cases(place) -> list[Hostile]:
    m, iid, own = place["machine"].pk, place["instance_id"], place["own"].pk
    cases = []

    def rent(name, field, **changes):
        cases.append(
            Hostile(name, "post", "/api/v1/instances/", rent_body(place, **changes), field)
        )

    for image in [
        "BUSYBOX/busybox",  # the issue's: pulled from a "host" named BUSYBOX
        "Gpumkt/busybox:latest",
        "BusyBox",
        "ghcr.io/Owner/repo",
        "busybox:lat\nest",
        "busy box",
        "-busybox",
        "busybox@sha256:xyz",
        "a" * 300,
        "",
        "busybox;rm -rf /",
        "../busybox",
        {"name": "busybox"},
        ["busybox"],
    ]:
        rent(f"image {image!r:.30}", "image", image=image)
    for username in ["bob\nevil", "bob\x1b[31m", "bob:x", "bob\u202e", "bo\rb", {"u": 1}]:
        rent(
            f"registry user {username!r}",
            "registry_username",
            registry_username=username,
            registry_password="pw",
        )
    for password in ["pw\nx", "pw\x00", "pw\x1b"]:
        rent(
            f"registry password {password!r}",
            "registry_password",
            registry_username="bob",
            registry_password=password,
        )
    for label in [*BAD_NAMES, "x" * 101, {"a": 1}]:
        rent(f"label {label!r:.30}", "label", label=label)
    for env in [
        {"FOO": {"x": [1]}},
        {"FOO": ["a"]},
        {"FOO": None},
        {"1BAD": "x"},
        {"FOO": "a\x00b"},
        {"NVIDIA_VISIBLE_DEVICES": "all"},
        ["FOO=1"],
        "FOO=1",
    ]:
        rent(f"env {env!r:.30}", "env", env=env)
    for ports in [[0], [70000], ["x"], [22, 22], "22"]:
        rent(f"ports {ports!r}", "ports", ports=ports)
    for entrypoint in ["-rf", "a b", "s\nh"]:
        rent(f"entrypoint {entrypoint!r}", "entrypoint", entrypoint=entrypoint)
    for args in [["a\x00"], "notalist", [{"a": 1}]]:
        rent(f"args {args!r}", "args", args=args)
    for machine_id in [2**63, 10**30, -1, "abc", 1e309, None]:
        rent(f"machine_id {machine_id!r:.30}", "machine_id", machine_id=machine_id)
    rent("volume id past bigint", "volumes", volumes=[{"volume": 2**63, "target": "/data"}])
    rent("volume target /etc", "volumes", volumes=[{"volume": 1, "target": "/etc"}])

    for body in [DEEP_ARRAY, DEEP_OBJECT]:
        cases.append(Hostile(f"rent nested {body[:2]}", "post", "/api/v1/instances/", body))
        cases.append(
            Hostile(f"label nested {body[:2]}", "post", f"/api/v1/instances/{iid}/label/", body)
        )
    cases.append(
        Hostile("rent 3 MB body", "post", "/api/v1/instances/", "x" * 3_000_000, status=(413,))
    )
    cases.append(Hostile("rent non-JSON", "post", "/api/v1/instances/", "{'a': 1}"))
    cases.append(Hostile("rent NaN literal", "post", "/api/v1/instances/", '{"num_gpus": NaN}'))
    for label in BAD_NAMES:
        cases.append(
            Hostile(
                f"relabel {label!r}",
                "post",
                f"/api/v1/instances/{iid}/label/",
                {"label": label},
                "label",
            )
        )

    named = {
        "/api/v1/deployments/": {
            "name": "web", "image": "gpumkt/busybox:latest", "gpu_names": ["No Such GPU"],
            "gpus_per_replica": 1, "duration_hours": 1,
        },
        "/api/v1/clusters/": {
            "name": "web", "image": "gpumkt/busybox:latest", "gpu_names": ["No Such GPU"],
            "gpus_per_replica": 1, "replicas": 2, "duration_hours": 1, "service_port": 8080,
        },
        "/api/v1/volumes/": {"machine_id": m, "name": "v", "size_gb": 1, "duration_hours": 24},
        "/api/v1/machines/": {"name": "m", "address": "gpu1.example.com", "port": 22},
        "/api/v1/ssh-keys/": {"name": "k", "public_key": SSH_LINE},
        "/api/v1/api-keys/": {"name": "k"},
    }  # fmt: skip
    for path, body in named.items():
        for name in BAD_NAMES:
            cases.append(
                Hostile(f"{path} name {name!r}", "post", path, {**body, "name": name}, "name")
            )
    cases.append(
        Hostile("deployment image BUSYBOX/busybox", "post", "/api/v1/deployments/",
                {**named["/api/v1/deployments/"], "image": "BUSYBOX/busybox"}, "image")
    )  # fmt: skip
    cases.append(
        Hostile("machine location with a newline", "put", f"/api/v1/machines/{own}/terms/",
                {"price_per_gpu_hour": "1", "storage_price_per_gb_month": "0.1", "listed": True,
                 "location": "US\nEU"}, "location")
    )  # fmt: skip

    for big in BIG_IDS:  # ids in paths past the generator's {id}
        path = f"/api/v1/instances/{iid}/versions/{big}/"
        cases.append(Hostile(f"delete version {big}", "delete", path, None, status=(404,)))
        # A window not on the machine is a 400 naming it, however large its number.
        path = f"/api/v1/machines/{own}/maintenance/{big}/"
        cases.append(Hostile(f"delete window {big}", "delete", path, None, "window"))
    for tail in ["1e309", "abc", "NaN", "1" * 5000]:
        cases.append(
            Hostile(
                f"logs tail {tail:.12}",
                "get",
                f"/api/v1/instances/{iid}/logs/?tail={tail}",
                None,
                "tail",
            )
        )
    return cases


def v0_cases(place) -> list[Hostile]:
    iid = place["instance_id"]
    offer = Offer.objects.get(machine=place["machine"], all_free=True)  # an offer's id
    ask = f"/api/v0/asks/{offer.pk}/"
    cases = []

    def create(name, field, **body):
        cases.append(
            Hostile(name, "put", ask, {"image": "gpumkt/busybox:latest", **body}, field, vast=True)
        )

    for env in [
        {"FOO": {"x": [1]}},
        {"FOO": ["a"]},
        {"FOO": None},
        {"FOO": True},
        ["FOO"],
        "FOO=1",
    ]:
        create(f"v0 env {env!r:.30}", "env", env=env)
    create("v0 env port out of range", "ports", env={"-p 1:99999": "1"})
    create("v0 env flag", "env", env={"--privileged": "1"})
    for label in [5, 1.5, ["a"], {"a": 1}, True, *BAD_NAMES[:3]]:
        create(f"v0 label {label!r}", "label", label=label)
    for image in ["BUSYBOX/busybox", "busy box", "a" * 300]:
        cases.append(
            Hostile(f"v0 image {image:.20}", "put", ask, {"image": image}, "image", vast=True)
        )
    create("v0 runtype", "runtype", runtype="nope")
    create("v0 args not a list", "args", runtype="args", args="x")
    create("v0 disk 1e309", "disk_gb", disk=1e309)
    for body in [DEEP_ARRAY, DEEP_OBJECT]:
        cases.append(Hostile(f"v0 ask nested {body[:2]}", "put", ask, body, vast=True))
        cases.append(
            Hostile(
                f"v0 label nested {body[:2]}", "put", f"/api/v0/instances/{iid}/", body, vast=True
            )
        )
    cases.append(Hostile("v0 ask body a list", "put", ask, [1, 2], vast=True))
    for label in [5, {"a": 1}, *BAD_NAMES]:
        cases.append(
            Hostile(
                f"v0 relabel {label!r}",
                "put",
                f"/api/v0/instances/{iid}/",
                {"label": label},
                "label",
                vast=True,
            )
        )
    for tail in [1e309, -1e309, "abc", [1], {"a": 1}, True]:
        cases.append(
            Hostile(f"v0 logs tail {tail!r}", "put", f"/api/v0/instances/request_logs/{iid}/",
                    {"tail": tail}, "tail", vast=True)
        )  # fmt: skip
    for name in ("select_filters", "order_by"):
        for text in (DEEP_ARRAY, DEEP_OBJECT, "{nope"):
            url = f"/api/v0/instances/?{name}={quote(text)}"
            cases.append(Hostile(f"v0 {name} {text[:5]}", "get", url, None, name, vast=True))
    cases += v0_volume_cases(place, ask)
    for big in BIG_IDS:
        cases.append(
            Hostile(
                f"v0 ask {big}",
                "put",
                f"/api/v0/asks/{big}/",
                {"image": "x"},
                status=(404,),
                vast=True,
            )
        )
    return cases


def v0_volume_cases(place, ask: str) -> list[Hostile]:
    """``create/delete/search volume(s)`` and ``create instance --create/link-volume``."""
    machine_id = place["machine"].pk
    cases = []
    for size in [-1, 0, 1.5, 1e309, "1", None, [1], 10**12]:
        body = {"id": machine_id, "size": size}
        cases.append(Hostile(f"v0 volume size {size!r:.12}", "put", "/api/v0/volumes/", body,
                             "size", vast=True))  # fmt: skip
    for offer in [0, -1, 2**63, "x", 1.5, True]:
        body = {"id": offer, "size": 1}
        cases.append(Hostile(f"v0 volume offer {offer!r:.12}", "put", "/api/v0/volumes/", body,
                             "id", vast=True))  # fmt: skip
    for name in [5, {"a": 1}, *BAD_NAMES[:3]]:
        body = {"id": machine_id, "size": 1, "name": name}
        cases.append(Hostile(f"v0 volume name {name!r:.12}", "put", "/api/v0/volumes/", body,
                             "name", vast=True))  # fmt: skip
    for raw in ["abc", "-1", "1" * 30, "%0A"]:
        cases.append(Hostile(f"v0 delete volume id {raw}", "delete", f"/api/v0/volumes/?id={raw}",
                             None, "id", vast=True))  # fmt: skip
    for query in [{"gpu_nmae": {"eq": 1}}, {"disk_space": {"gte": "a"}}, {"disk_space": 5},
                  {"disk_space": {"like": 1}}, {"id": {"in": 5}}, {"order": "x"},
                  {"limit": 10**9}, {"allocated_storage": "x"}]:  # fmt: skip
        field = next(iter(query)).replace("allocated_storage", "storage")
        cases.append(Hostile(f"v0 search volumes {query!r:.30}", "post", "/api/v0/volumes/search/",
                             query, field, vast=True))  # fmt: skip
    cases.append(Hostile("v0 search volumes nested", "post", "/api/v0/volumes/search/",
                         DEEP_OBJECT, vast=True))  # fmt: skip
    for info, field in [
        ("x", "volume_info"),
        ({"create_new": False, "volume_id": 1}, "mount-path"),
        ({"create_new": False, "volume_id": 2**63, "mount_path": "/d"}, "link-volume"),
        ({"create_new": False, "volume_id": "1", "mount_path": "/d"}, "link-volume"),
        ({"create_new": False, "volume_id": 1, "mount_path": {"a": 1}}, "mount-path"),
        ({"create_new": True, "volume_id": "x", "mount_path": "/d"}, "create-volume"),
    ]:
        body = {"image": "gpumkt/busybox:latest", "volume_info": info}
        cases.append(Hostile(f"v0 ask volume_info {info!r:.30}", "put", ask, body, field,
                             vast=True))  # fmt: skip
    for body, field in [({"src_id": "x", "dst_id": machine_id}, "src_id"),
                        ({"src_id": 2**63, "dst_id": machine_id}, "src_id"),
                        ({"src_id": 1, "dst_id": [1]}, "dst_id"),
                        ({"src_id": 1, "dst_id": machine_id, "size": 1e309}, "size"),
                        ({"src_id": 1, "dst_id": machine_id, "size": "9"}, "size")]:  # fmt: skip
        cases.append(Hostile(f"v0 clone volume {body!r:.40}", "post", "/api/v0/volumes/copy/",
                             body, field, vast=True))  # fmt: skip
    return cases + v0_copy_cases(place)


def v0_copy_cases(place) -> list[Hostile]:
    """``vastai copy``: ids and paths that name no instance or no absolute path, refused by
    field before any host is reached."""
    iid = place["instance_id"]
    cases = []
    for kind in ("rsync", "copy_direct"):
        for value in ["V.1", "s3.101", "C.", "C.-1", "1e3", 2**63, True, {"a": 1}, "a:b"]:
            body = {"src_id": value, "dst_id": iid, "src_path": "/a", "dst_path": "/b"}
            cases.append(Hostile(f"v0 {kind} src_id {value!r:.12}", "put",
                                 f"/api/v0/commands/{kind}/", body, "src_id", vast=True))  # fmt: skip
        for path in ["rel", "", "/a\n/b", "/a\x00b", "/" + "a" * 5000, 5, ["/a"], None]:
            body = {"src_id": None if kind == "rsync" else iid, "dst_id": iid,
                    "src_path": "/a", "dst_path": path}  # fmt: skip
            cases.append(Hostile(f"v0 {kind} dst_path {path!r:.12}", "put",
                                 f"/api/v0/commands/{kind}/", body, "dst_path", vast=True))  # fmt: skip
    return cases


def unknown_path_cases() -> list[Hostile]:
    """Every method to a path no endpoint serves: the JSON 404, never Django's CSRF page."""
    cases = []
    for path in [
        "/api/v1/bogus/",
        "/api/nope",
        "/api/v2/instances/",
        "/api/v1/instances/1/versions/99999999999/",
    ]:
        for method in ["post", "put", "patch", "delete"]:
            cases.append(Hostile(f"{method} {path}", method, path, {}, status=(404, 405)))
    for method in ["post", "delete"]:
        cases.append(
            Hostile(f"{method} v0 bogus", method, "/api/v0/bogus/", {}, status=(404,), vast=True)
        )
    return cases


def generated_cases(place) -> list[Hostile]:
    """From the schemas: each path's ids past a bigint (404), each text property of each
    request body sent an object (400 naming it)."""
    cases = []
    v1 = api_schema()
    for path, operations in v1["paths"].items():
        for method, operation in operations.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            if re.search(r"{(id|machine_id)}", path):
                url = re.sub(r"{(id|machine_id)}", str(2**63), path)
                url = re.sub(r"{month}", "2026-01", url)
                if "{" not in url:
                    body = {} if method in ("post", "put", "patch") else None
                    # A body is checked before the id is looked up: a 400 is as right.
                    status = (404,) if body is None else (400, 404)
                    cases.append(Hostile(f"gen {method} {url}", method, url, body, status=status))
                continue
            content = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if not content or method != "post":
                continue
            for name, prop in resolve(v1, content["schema"]).get("properties", {}).items():
                prop = resolve(v1, prop)
                if prop.get("type") == "string" and not prop.get("readOnly") and "enum" not in prop:
                    cases.append(
                        Hostile(f"gen {path} {name} object", method, path, {name: {"x": [1]}}, name)
                    )
    v0 = place["api"].get("/api/v0/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    for path, operations in v0["paths"].items():
        if not re.search(r"{\w+}", path) or path == "/schema/":
            continue
        for method in operations:
            url = "/api/v0" + re.sub(r"{\w+}", str(10**22), path)
            body = {} if method in ("post", "put", "patch") else None
            cases.append(
                Hostile(f"gen v0 {method} {url}", method, url, body, status=(404,), vast=True)
            )
    return cases


def send(client, case: Hostile):
    body = case.body
    if body is None:
        return getattr(client, case.method)(case.path)
    if not isinstance(body, str):  # Python's inf goes as 1e309: legal JSON, a float overflow
        body = json.dumps(body).replace("Infinity", "1e309")
    return client.generic(case.method.upper(), case.path, body, content_type="application/json")


def assert_refused(response, case: Hostile) -> None:
    assert response.status_code in case.status, (
        case.name,
        response.status_code,
        response.content[:300],
    )
    assert response["Content-Type"].startswith("application/json"), (
        case.name,
        response.content[:200],
    )
    answer = response.json()
    expected_keys = {"success", "msg", "error"} if case.vast else {"error"}
    assert set(answer) == expected_keys, (case.name, answer)
    assert set(answer["error"]) == {"code", "message", "fields"}, (case.name, answer)
    if case.field is not None:
        assert case.field in answer["error"]["fields"], (case.name, answer["error"])


def no_tracebacks(caplog) -> list[str]:
    return [
        f"{r.name}: {r.getMessage()[:200]}"
        for r in caplog.records
        if r.levelno >= logging.ERROR or r.exc_info
    ]


def test_hostile_api_requests_are_refused_by_field_with_nothing_written(place, caplog):
    caplog.set_level(logging.WARNING)
    cases = v1_cases(place) + v0_cases(place) + generated_cases(place)
    assert len(cases) >= 200
    wrong = []  # every case that fails, not only the first
    for case in cases:
        before = row_counts()
        try:
            console_only = "/api-keys/" in case.path or "/team/" in case.path
            client = place["session"] if console_only else place["api"]
            assert_refused(send(client, case), case)
            assert row_counts() == before, (case.name, "rows written")
        except AssertionError as error:
            wrong.append(str(error)[:400])
    assert not wrong, "\n".join(wrong)
    assert no_tracebacks(caplog) == []


def test_unknown_api_paths_answer_the_json_404_for_every_method(place, owner, team, caplog):
    """A signed-in browser session without a CSRF token: Django's CSRF page came first."""
    caplog.set_level(logging.WARNING)
    session = Client(enforce_csrf_checks=True)
    client_for(session, owner, team)
    for client in (session, place["api"]):
        for case in unknown_path_cases():
            response = send(client, case)
            assert_refused(response, case)
    assert no_tracebacks(caplog) == []


def test_a_session_write_without_its_csrf_token_answers_in_the_error_shape(owner, team):
    session = Client(enforce_csrf_checks=True)
    client_for(session, owner, team)
    response = session.post("/api/v1/ssh-keys/", {"name": "k"}, content_type="application/json")
    assert response.status_code == 403
    assert set(response.json()["error"]) == {"code", "message", "fields"}


# --- the console's forms ---------------------------------------------------------------------


def console_cases(place) -> list[tuple[str, str, dict, str]]:
    """(name, path, form, what the page must say: the refusal, with the field it names)."""
    m = place["machine"].pk
    rent = {"num_gpus": "1", "duration_hours": "1", "image": "gpumkt/busybox:latest"}
    printable = "Printable characters only"
    cases = []
    for image in ["BUSYBOX/busybox", "Gpumkt/busybox", "busy box"]:
        form = {**rent, "image": image}
        cases.append((f"rent image {image}", f"/offers/{m}/rent/", form, "image: "))
    for username in ["bob\nevil", "bob\x1b[31m"]:
        form = {**rent, "registry_username": username, "registry_password": "pw"}
        cases.append(
            (f"rent registry {username!r}", f"/offers/{m}/rent/", form, "registry username: ")
        )
    deployment = {"name": "web", "image": "gpumkt/busybox:latest", "gpu_names": "No Such GPU",
                  "gpus_per_replica": "1", "duration_hours": "1"}  # fmt: skip
    volume = {"action": "create", "machine_id": str(m), "name": "v", "size_gb": "1", "days": "1"}
    machine = {"address": "gpu1.example.com", "port": "22", "ssh_user": "root"}
    for name in BAD_NAMES[:5]:
        cases += [
            (f"deployment {name!r}", "/deployments/", {**deployment, "name": name}, printable),
            (f"volume {name!r}", "/volumes/", {**volume, "name": name}, printable),
            (f"ssh key {name!r}", "/ssh-keys/", {"name": name, "public_key": SSH_LINE}, printable),
            (f"machine {name!r}", "/machines/add/", {**machine, "name": name}, printable),
            (f"team {name!r}", "/team/new/", {"name": name}, printable),
            (f"api key {name!r}", "/team/api-keys/", {"name": name, "access": "read", "audience": "renter"}, printable),
        ]  # fmt: skip
    return cases


def test_hostile_console_forms_are_refused_by_field_with_nothing_written(
    place, client, owner, team, caplog
):
    caplog.set_level(logging.WARNING)
    client_for(client, owner, team)
    wrong = []
    for name, path, form, says in console_cases(place):
        before = row_counts()
        try:
            response = client.post(path, form, follow=True)
            assert response.status_code in (200, 400), (name, response.status_code)
            shown = html.unescape(response.content.decode())
            assert says in shown, (name, page_messages(response))
            assert row_counts() == before, (name, "rows written")
        except AssertionError as error:
            wrong.append(str(error)[:400])
    assert not wrong, "\n".join(wrong)
    assert no_tracebacks(caplog) == []
