"""A 2-node ray.cluster_utils.Cluster loses the node running training; a new node joins; the run completes."""

from __future__ import annotations

import threading
import time

import pytest
import ray
from ray.cluster_utils import Cluster

from tests.faults import EPOCHS, FAIL_AT, faulty, small_run
from trainer.checkpoint import read_metrics
from trainer.recovery import read_events, recoveries
from trainer.runner import build_trainer, run_dir
from trainflow.runtime import quiet_ray_data

pytestmark = pytest.mark.e2e

# training workers need this resource, so they run only on the worker nodes, never on the head
TRAIN_NODE = {"trainer_node": 2}


@pytest.fixture
def cluster():
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    ray.init(address=c.address, log_to_driver=False)
    quiet_ray_data()
    yield c
    ray.shutdown()
    c.shutdown()


def test_training_survives_losing_its_node(cluster, tmp_path):
    # the datasets are built and materialized on the head, which stays up
    cfg, prep, train, val = small_run(tmp_path, resources_per_worker={"CPU": 1, "trainer_node": 1})
    first_node = cluster.add_node(num_cpus=2, resources=TRAIN_NODE)
    cluster.wait_for_nodes()
    trainer = build_trainer(cfg, prep, train, val, "node-loss", train_fn=faulty(str(tmp_path), "node"))
    result: dict = {}
    fit = threading.Thread(target=lambda: result.setdefault("r", trainer.fit()), daemon=True)
    fit.start()

    # wait until epoch FAIL_AT-1's checkpoint is on disk: the workers are then parked in epoch FAIL_AT
    run = tmp_path / "runs" / "node-loss"
    deadline = time.monotonic() + 240
    while not any(read_metrics(d)["epoch"] == FAIL_AT - 1 for d in run.glob("checkpoint_*") if (d / "metrics.json").exists()):
        assert fit.is_alive() and time.monotonic() < deadline, "training never reached the fault point"
        time.sleep(0.5)
    time.sleep(3)  # the controller registers that checkpoint
    assert {(tmp_path / f"faulted-{r}").read_text() for r in (0, 1)} == {first_node.node_id}
    cluster.remove_node(first_node)
    second_node = cluster.add_node(num_cpus=2, resources=TRAIN_NODE)
    fit.join(timeout=300)
    assert not fit.is_alive(), "the run did not finish after the new node joined"

    with result["r"].checkpoint.as_directory() as d:
        history = read_metrics(d)["history"]
    assert [h["epoch"] for h in history] == list(range(EPOCHS))
    # the second attempt ran on the node that joined, from the checkpoint of epoch FAIL_AT-1
    assert {(tmp_path / f"resumed-{r}").read_text() for r in (0, 1)} == {second_node.node_id}
    events = read_events(run_dir(cfg, "node-loss"))
    assert [e["epoch"] for e in events if e["event"] == "resume"] == [FAIL_AT]
    assert [r["resumed_from_epoch"] for r in recoveries(events)] == [FAIL_AT]
