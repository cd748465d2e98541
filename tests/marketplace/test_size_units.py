"""Sizes named by their unit (issue 33 §5): nvidia-smi reports a card's memory in MiB, and the
offers divide by 1024, so a 24564 MiB card is 24 GiB, not "24 GB"; disks are sized in GiB too
(Docker's ``--storage-opt size=NG``). The console says GiB everywhere it shows them."""

from __future__ import annotations

import re

import pytest

from marketplace.models import Role
from tests.conftest import client_for
from tests.factories import TeamFactory, UserFactory, add_member
from tests.marketplace.test_offer_search import offer_on

pytestmark = pytest.mark.django_db


def test_offers_and_the_rent_dialog_say_gib(client):
    provider = TeamFactory(name="Provider")
    offer_on(provider, "gib-box", gpus=1)  # one 24564 MiB card
    renter = TeamFactory(name="Renter")
    user = UserFactory(username="renter")
    add_member(renter, user, Role.OWNER)
    page = client_for(client, user, renter).get("/offers/").content.decode()
    assert re.search(r'class="num gpu-memory"[^>]*>24 GiB<', page)
    assert "Disk GiB" in page and "GiB<small" in page
    assert not re.search(r"\d GB\b", page), re.findall(r".{40}\d GB\b.{20}", page)
