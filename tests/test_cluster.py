"""The retrain flow on an existing multi-node cluster (`ray.address`) whose nodes come and go, under an elastic
worker count.

A `ray.cluster_utils.Cluster` on loopback: a head that does the data work, and nodes that carry only a custom
`trainer` resource, so the Train workers spread one per node. scaling.num_workers [1, 2]: once Ray has
registered a checkpoint, the first training node is killed (its raylet and every process on it): the run goes
on with one worker; a node joins: the run grows back to two at its next resize check; that node is then drained
as a cloud drains a spot instance (`ray drain-node`, reason preemption) and killed at its deadline: a
preemption, counted on its own budget, not against failure.max_failures (1 here, spent by the killed node).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from tests.conftest import churn_config
from tests.faults import wait_registered
from trainflow.trainer.recovery import read_events
from trainflow.flows.cli import main as cli_main

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness", "own_ray")]

TRAINER = {"trainer": 1}
HELD = "tests.faults:HeldNet"
EPOCHS = 24


def _wait_for(run, what, test, alive, timeout_s=240.0):
    deadline = time.monotonic() + timeout_s
    while True:
        events = read_events(str(run))
        if test(events):
            return events
        assert alive(), f"the run ended while waiting for {what}: {events}"
        assert time.monotonic() < deadline, f"no {what} after {timeout_s:g} s: {events}"
        time.sleep(0.2)


def _attempts(events):
    return [e for e in events if e["event"] == "attempt"]


def _training(events, workers: int) -> bool:
    """The latest worker group has `workers` workers and every one of them has started training (a drain that lands
    while a group still starts is a failed start, waited for up to failure.worker_start_timeout_s, not a preemption)."""
    starts = [k for k, e in enumerate(events) if e["event"] == "attempt"]
    if not starts or events[starts[-1]]["workers"] != workers:
        return False
    return sum(e["event"] == "worker_start" for e in events[starts[-1] :]) >= workers


def test_an_elastic_retrain_shrinks_when_a_node_dies_grows_back_and_counts_a_drain_as_a_preemption(tmp_path, capsys):
    cluster = Cluster(
        initialize_head=True,
        # a lost node is noticed after 2 missed health checks 0.5 s apart instead of Ray's 5 missed 3 s apart: the
        # same detection, 3 node losses here, 40 s sooner
        head_node_args={
            "num_cpus": 2,
            "include_dashboard": False,
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 2},
        },
    )
    try:  # shut down however the test ends: a head left running is what ray.init() joins next
        first = cluster.add_node(num_cpus=0, resources=TRAINER)
        second = cluster.add_node(num_cpus=0, resources=TRAINER)
        cluster.wait_for_nodes()
        # training held at a slow pace (a step each 0.3 s) from its first registered checkpoint until the churn is
        # over, then at full speed: the run outlasts the churn however loaded the machine, and ends soon after it
        # (80 plain epochs, the earlier way, trained 35 s past the churn alone)
        hold = tmp_path / "hold"
        cfg = churn_config(
            tmp_path,
            rows=6000,
            model={"type": "torch", "params": {"torch": {"class_path": HELD, "init_args": {"hold": str(hold)}}}},
            network={"epochs": EPOCHS, "batch_size": 64},
            train={"early_stopping": {"patience": "off"}},
            scaling={
                "num_workers": [1, 2],
                "placement_strategy": "SPREAD",
                "resources_per_worker": {"CPU": 0, **TRAINER},
                "elastic_resize_monitor_interval_s": 2,
            },
            failure={"max_failures": 1},
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
        hold.touch()
        assert [a["workers"] for a in _attempts(read_events(str(run)))] == [2]
        cluster.remove_node(first, allow_graceful=False)  # the node dies: its raylet and its worker, SIGKILLed
        _wait_for(run, "a group of one", lambda ev: [a["workers"] for a in _attempts(ev)][-1:] == [1], flow.is_alive)
        third = cluster.add_node(num_cpus=0, resources=TRAINER)
        _wait_for(run, "the group grown back, training", lambda ev: _training(ev, 2), flow.is_alive)
        drain = [
            "ray", "drain-node", "--address", cluster.address, "--node-id", third.node_id,
            "--reason", "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", "spot capacity reclaimed",
            "--deadline-remaining-seconds", "4",
        ]  # fmt: skip
        subprocess.run([str(Path(sys.executable).parent / drain[0]), *drain[1:]], check=True, timeout=60)
        reclaim_at = time.monotonic() + 5  # (a deadline of 10 s, reclaimed at 12 s, only waited 7 s longer)
        _wait_for(run, "the preemption", lambda ev: any(e["event"] == "preemption" for e in ev), flow.is_alive)
        time.sleep(max(0.0, reclaim_at - time.monotonic()))
        cluster.remove_node(third, allow_graceful=False)  # the cloud takes the node back just after its deadline
        hold.unlink()  # the churn is over: the remaining epochs at full speed
        flow.join(timeout=600)
        assert outcome.get("rc") == 0
        # the flow joined this cluster instead of starting its own Ray
        assert ray.get_runtime_context().gcs_address == cluster.address
        # on a cluster it joins, Ray Train's preemption watcher keeps Ray's default (on)
        assert "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER" not in ray.get_runtime_context().runtime_env.get("env_vars", {})
        summary = json.loads((tmp_path / "s.json").read_text())
        events = read_events(summary["ray_run_path"])
        sizes = [(a["workers"], set(a["nodes"])) for a in _attempts(events)]
        assert sizes[0] == (2, {first.node_id, second.node_id}) and sizes[-1] == (1, {second.node_id}), sizes
        assert (2, {second.node_id, third.node_id}) in sizes
        # never on the head; every resize in the summary, each with its cause
        assert all(
            a["workers"] == len(a["nodes"]) and cluster.head_node.node_id not in a["nodes"] for a in _attempts(events)
        )
        resized = summary["resizes"]
        assert [(r["from"], r["to"]) for r in resized] == [(2, 1), (1, 2), (2, 1)], resized
        died, grew, drained = resized
        assert f"node {first.node_id[:12]} died" in died["why"] and died["epoch"] >= 1
        assert "capacity returned" in grew["why"] and grew["epoch"] >= died["epoch"]
        assert f"node {third.node_id[:12]} drained (a preemption)" in drained["why"]
        restarts = [e for e in events if e["event"] == "restart"]
        assert [r["preempted"] for r in restarts][-1] is True  # on its own budget: max_failures (1) was not exceeded
        # the drain's recovery says it was a preemption (on a loaded machine the new group's worker on the drained node
        # may die at its deadline too, a recovery of its own after it)
        assert any(
            r["error"].startswith(f"a preemption: node {third.node_id[:12]} drained") for r in summary["recoveries"]
        ), summary["recoveries"]
        assert summary["epochs_run"] == EPOCHS
        # checkpoints in the storage every node shares; predictions for every row
        assert summary["best_checkpoint"]["path"].startswith(str(run))
        assert summary["output_rows"] == summary["input_rows"] == 500
        import mlflow

        client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
        [family_run] = [
            r for r in client.search_runs(client.get_experiment_by_name("test").experiment_id)
            if "mlflow.parentRunId" in r.data.tags
        ]  # fmt: skip
        assert family_run.data.tags["trainflow.resizes"].count(" -> ") == 3
        assert [m.value for m in client.get_metric_history(family_run.info.run_id, "workers")][-1] == 1

        # a fixed-size run of 2 that loses a node: refused at its restart in seconds, naming the numbers, not after
        # failure.worker_start_timeout_s (180 s) per restart; exit 2, resumable under its name
        fourth = cluster.add_node(num_cpus=0, resources=TRAINER)
        cluster.wait_for_nodes()
        fixed = ["retrain", "--config", str(cfg), "--run-name", "fixed", "--force", "--set", "scaling.num_workers=2"]
        flow = threading.Thread(target=lambda: outcome.update(fixed=cli_main(fixed)), daemon=True)
        flow.start()
        wait_registered(tmp_path / "runs" / "fixed", timeout_s=300, alive=flow.is_alive)
        lost = time.monotonic()
        cluster.remove_node(fourth, allow_graceful=False)
        flow.join(timeout=240)
        assert outcome.get("fixed") == 2 and time.monotonic() - lost < 120
        err = capsys.readouterr().err
        assert "the restart of training after a lost node asks for 2 worker(s)" in err and "can place only 1" in err
        assert "scaling.num_workers: [min, max]" in err
    finally:
        ray.shutdown()
        cluster.shutdown()
