"""The real ``vastai`` CLI's serverless commands against a live server, a real worker and a
simulated host (tests/vast/serverless_cli.py), on their own: the conformance test runs the
same section among all the others."""

from __future__ import annotations

import pytest

from tests.marketplace.conftest import machine_for
from tests.vast.cli import VastCli, ensure_cli
from tests.vast.serverless_cli import WORKER_GPU, serverless
from tests.vast.test_cli_conformance import Table, key_for

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def test_the_vastai_cli_runs_an_endpoint_on_a_cluster(
    live_server_url, celery_worker, funded_team, provider_team, sim_host_factory, tmp_path
):
    machine_for(sim_host_factory(gpus=2, gpu_name=WORKER_GPU), provider_team)
    table = Table()
    with VastCli(ensure_cli(), live_server_url, key_for(funded_team), tmp_path) as cli:
        serverless(cli, table, funded_team)
    assert not table.failures, "\n\n".join(table.failures)
