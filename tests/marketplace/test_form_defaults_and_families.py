"""Deployment and cluster forms whose defaults fit what is listed, and GPU families: "A100"
means every A100 model (issue 33 §8). Machines are listed rows with their offers, as a probe
leaves them; nothing is launched."""

from __future__ import annotations

import html
import re

import pytest

from hosts.models import Gpu, Machine
from marketplace.deployments.conditions import matching_offers
from marketplace.models import Deployment, Offer
from marketplace.services.offers import offer_refresh
from scheduler.placement import gpu_family_matches
from tests.conftest import client_for
from tests.factories import TeamFactory

pytestmark = pytest.mark.django_db


def listed(name: str, gpu: str, *, gpus: int = 2, disk_free_gb: int = 6) -> Machine:
    machine = Machine.objects.create(
        team=TeamFactory(name=f"host {name}"), name=name, address=f"10.8.{Machine.objects.count()}.1",
        status="online", listed=True, price_per_gpu_hour=400_000, storage_price_per_gb_month=100_000,
        cpu_cores=8 * gpus, ram_mb=16384 * gpus, disk_free_gb=disk_free_gb, reliability=0.99,
        driver_version="550.54.14", cuda_version="12.4", location="US",
    )  # fmt: skip
    Gpu.objects.bulk_create(
        Gpu(machine=machine, index=i, uuid=f"GPU-{name}-{i}", name=gpu, memory_mib=81920)
        for i in range(gpus)
    )
    offer_refresh(machine_id=machine.pk)
    return machine


def field_value(page: str, name: str) -> str:
    found = re.search(rf'name="{name}"[^>]*value="([^"]*)"', page)
    assert found, name
    return found.group(1)


def test_the_deployment_form_defaults_to_a_disk_some_listed_machine_gives(client, owner, team):
    machine = listed("small-disk", "RTX 4090", gpus=2, disk_free_gb=6)  # 3 GB per GPU
    page = client_for(client, owner, team).get("/deployments/").content.decode()
    disk = int(field_value(page, "disk_gb"))
    assert disk == Offer.objects.get(machine=machine, all_free=True).disk_per_unit == 3
    probe = Deployment(gpu_names=[], gpus_per_replica=1, disk_gb=disk)
    assert list(matching_offers(probe).values_list("machine_id", flat=True)) == [machine.pk]


def test_the_cluster_cost_review_uses_the_disk_typed(client, owner, team):
    listed("small-disk", "RTX 4090", gpus=2, disk_free_gb=6)
    form = {
        "name": "svc", "image": "gpumkt/busybox:latest", "gpu_names": "", "replicas": "2",
        "gpus_per_replica": "1", "duration_hours": "1", "disk_gb": "2", "service_port": "8080",
    }  # fmt: skip
    page = html.unescape(client_for(client, owner, team).post("/clusters/", form).content.decode())
    assert 'id="cluster-hold"' in page, page  # a rate and a hold, not "no machine matches"
    assert "$0.40 per GPU-hour × 1 GPU × 2 replicas" in page.replace("</strong>", "")
    assert "replicas fit on the machines listed now" not in page  # both fit


def test_a_gpu_family_matches_its_models_and_not_its_prefixes():
    assert gpu_family_matches("A100", "A100-SXM4-80GB")
    assert gpu_family_matches("a100", "A100 PCIE 40GB")
    assert gpu_family_matches("RTX 4090", "RTX 4090")
    assert not gpu_family_matches("RTX 40", "RTX 4090")
    assert not gpu_family_matches("A10", "A100-SXM4-80GB")


def test_a_deployment_for_a100_matches_every_a100_model_and_the_form_lists_them(
    client, owner, team
):
    sxm = listed("sxm", "A100-SXM4-80GB")
    pcie = listed("pcie", "A100-PCIE-40GB")
    listed("other", "A10")
    probe = Deployment(gpu_names=["A100"], gpus_per_replica=1, disk_gb=1)
    assert set(matching_offers(probe).values_list("machine_id", flat=True)) == {sxm.pk, pcie.pk}
    page = client_for(client, owner, team).get("/deployments/").content.decode()
    choices = re.findall(r'<datalist id="gpu-models">(.*?)</datalist>', page)[0]
    assert re.findall(r'<option value="([^"]+)">', choices) == [
        "A10", "A100", "A100-PCIE-40GB", "A100-SXM4-80GB",
    ]  # fmt: skip
