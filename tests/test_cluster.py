"""The retrain flow on an existing multi-node cluster (`ray.address`), surviving the loss of a training node.

A `ray.cluster_utils.Cluster` on loopback: a head that does the data work, and two nodes that
carry only a custom `trainer` resource, so the 2 Train workers spread one per node. Once Ray has
registered a checkpoint, the first training node is removed and a third joins: Ray Train restarts
the worker group on the surviving and the new node and resumes from that checkpoint.
"""

from __future__ import annotations

import json
import threading

import pytest
import ray
from ray.cluster_utils import Cluster

from tests.conftest import churn_config
from tests.faults import wait_registered
from trainflow.trainer.recovery import read_events, recoveries
from trainflow.flows.cli import main as cli_main

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness", "own_ray")]

TRAINER = {"trainer": 1}


def test_retrain_on_an_existing_cluster_survives_losing_a_node(tmp_path):
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:  # shut down however the test ends: a head left running is what ray.init() joins next
        first = cluster.add_node(num_cpus=0, resources=TRAINER)
        second = cluster.add_node(num_cpus=0, resources=TRAINER)
        cluster.wait_for_nodes()
        cfg = churn_config(
            tmp_path,
            rows=6000,
            train={"epochs": 4, "batch_size": 64},
            scaling={"num_workers": 2, "placement_strategy": "SPREAD", "resources_per_worker": {"CPU": 0, **TRAINER}},
            failure={"max_failures": 2},
            ray={"address": cluster.address},
            checkpoint={"min_interval_s": 0},  # a checkpoint per epoch, however fast the epochs
        )
        assert not ray.is_initialized()
        outcome: dict = {}
        args = ["retrain", "--config", str(cfg), "--run-name", "on-cluster", "--summary-json", str(tmp_path / "s.json")]
        flow = threading.Thread(target=lambda: outcome.setdefault("rc", cli_main(args)), daemon=True)
        flow.start()
        run = tmp_path / "runs" / "on-cluster"
        wait_registered(run, timeout_s=300, alive=flow.is_alive)
        cluster.remove_node(first)
        third = cluster.add_node(num_cpus=0, resources=TRAINER)
        flow.join(timeout=600)
        assert outcome.get("rc") == 0
        # the flow joined this cluster instead of starting its own Ray
        assert ray.get_runtime_context().gcs_address == cluster.address
        # on a cluster it joins, Ray Train's preemption watcher keeps Ray's default (on)
        assert "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER" not in ray.get_runtime_context().runtime_env.get("env_vars", {})
        summary = json.loads((tmp_path / "s.json").read_text())
        events = read_events(summary["ray_run_path"])
        starts = [e for e in events if e["event"] == "worker_start"]
        fresh = {e["node_id"] for e in starts if e["from_epoch"] == 0}
        resumed = {e["node_id"] for e in starts if e["from_epoch"] > 0}
        # one worker per training node, before and after the loss; never on the head
        assert fresh == {first.node_id, second.node_id}
        assert resumed == {second.node_id, third.node_id}
        assert summary["resumed_from_epoch"] is None  # the run was new; the resume happened inside Ray Train
        [recovery] = recoveries(events)
        assert recovery["resumed_from_epoch"] >= 1
        assert [e["epoch"] for e in events if e["event"] == "resume"] == [recovery["resumed_from_epoch"]]
        assert summary["epochs_run"] == 4
        # checkpoints in the storage every node shares; predictions for every row
        assert summary["best_checkpoint"]["path"].startswith(str(run))
        assert summary["output_rows"] == summary["input_rows"] == 500
    finally:
        ray.shutdown()
        cluster.shutdown()
