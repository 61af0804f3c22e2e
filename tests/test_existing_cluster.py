"""`ray.address` joins a running cluster (a head and a second node on loopback) instead of starting one."""

from __future__ import annotations

import json

import pytest
import ray
from ray.cluster_utils import Cluster

from tests.conftest import churn_config
from trainer.recovery import read_events
from trainflow.cli import main as cli_main

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness")]


def test_retrain_joins_an_existing_cluster_and_spreads_over_its_nodes(tmp_path):
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    second = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        cfg = churn_config(
            tmp_path, rows=2000, train={"epochs": 2},
            scaling={"num_workers": 2, "placement_strategy": "SPREAD"}, ray={"address": cluster.address},
        )
        assert not ray.is_initialized()
        assert cli_main(["retrain", "--config", str(cfg), "--summary-json", str(tmp_path / "s.json")]) == 0
        # the flow joined this cluster rather than starting its own
        assert ray.get_runtime_context().gcs_address == cluster.address
        summary = json.loads((tmp_path / "s.json").read_text())
        starts = [e for e in read_events(summary["ray_run_path"]) if e["event"] == "worker_start"]
        assert sorted(e["rank"] for e in starts) == [0, 1]
        # one worker on each node, checkpoints in the storage both nodes share
        assert {e["node_id"] for e in starts} == {cluster.head_node.node_id, second.node_id}
        assert summary["best_checkpoint"]["path"].startswith(str(tmp_path / "runs"))
        assert summary["output_rows"] == 500
    finally:
        ray.shutdown()
        cluster.shutdown()
