"""node-loss: the wall time of an elastic retrain (scaling.num_workers [1, 2]) that loses one of its two worker nodes
halfway, against the same run uninterrupted, same table, same cluster, same process; with each run's test figure.

The cluster: a `ray.cluster_utils.Cluster` on loopback, a head for the data work and two nodes that carry only a
custom `trainer` resource, so the two Train workers run one per node. The loss: once the checkpoint of the middle
epoch is registered, the first worker node is killed (its raylet and every process on it, SIGKILL); the run goes on
with one worker from that checkpoint. Ratio: interrupted wall / uninterrupted wall (lower is better; 1 + the share
of the run the loss cost). The test figures (ROC AUC on the same held-out rows) should agree within noise.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path

from bench.common import report

ROWS = int(os.environ.get("NODE_LOSS_ROWS", "20000"))
EPOCHS = int(os.environ.get("NODE_LOSS_EPOCHS", "16"))
TRAINER = {"trainer": 1}


def _run(cluster, work: Path, name: str, kill=None) -> tuple[float, dict]:
    from tests.conftest import churn_config
    from tests.faults import wait_registered
    from trainflow.flows.cli import main as cli_main

    cfg = churn_config(
        work,
        rows=ROWS,
        # a learning rate low enough that the best epoch comes late: after the loss, not one both runs share
        model={"type": "mlp", "params": {"mlp": {"epochs": EPOCHS, "batch_size": 128, "learning_rate": 0.001}}},
        train={"early_stopping": {"patience": "off"}},
        scaling={
            "num_workers": [1, 2],
            "placement_strategy": "SPREAD",
            "resources_per_worker": {"CPU": 0, **TRAINER},
        },
        ray={"address": cluster.address},
        checkpoint={"min_interval_s": 0},
        mlflow={"experiment": "node-loss", "registered_model": f"node-loss-{name}"},
    )
    out: dict = {}
    args = ["retrain", "--config", str(cfg), "--run-name", name, "--summary-json", str(work / f"{name}.json")]
    started = time.perf_counter()
    flow = threading.Thread(target=lambda: out.setdefault("rc", cli_main(args)), daemon=True)
    flow.start()
    if kill is not None:
        wait_registered(work / "runs" / name, epoch=EPOCHS // 2, timeout_s=900, alive=flow.is_alive)
        kill()
    flow.join()
    wall = time.perf_counter() - started
    if out.get("rc") != 0:
        raise SystemExit(f"node-loss: the {name} run failed (exit {out.get('rc')})")
    return wall, json.loads((work / f"{name}.json").read_text())


def main() -> None:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        first = cluster.add_node(num_cpus=0, resources=TRAINER)
        cluster.add_node(num_cpus=0, resources=TRAINER)
        cluster.wait_for_nodes()
        with tempfile.TemporaryDirectory() as tmp:
            whole_s, whole = _run(cluster, Path(tmp) / "whole", "whole")
            lost_s, lost = _run(
                cluster, Path(tmp) / "lost", "lost", kill=lambda: cluster.remove_node(first, allow_graceful=False)
            )
        resized = "; ".join(f"{r['from']} -> {r['to']} at epoch {r['epoch']}" for r in lost.get("resizes", []))
        auc = [s.get("test_metrics") or {} for s in (lost, whole)]
        report(
            "node-loss",
            lost_s,
            whole_s,
            "s",
            lost_s / whole_s,
            f"elastic [1, 2] retrain of {ROWS} churn rows, {EPOCHS} epochs, one of two worker nodes killed after epoch "
            f"{EPOCHS // 2} vs uninterrupted; resizes: {resized or 'none'}; test ROC AUC "
            f"{auc[0].get('test_roc_auc', float('nan')):.4f} vs {auc[1].get('test_roc_auc', float('nan')):.4f}, test loss "
            f"{auc[0].get('test_loss', float('nan')):.5f} vs {auc[1].get('test_loss', float('nan')):.5f} "
            f"({lost['test_rows']} test rows each; best epoch {lost['best_checkpoint']['epoch']} vs "
            f"{whole['best_checkpoint']['epoch']}, its val_loss {lost['best_checkpoint']['metrics']['val_loss']:.6f} vs "
            f"{whole['best_checkpoint']['metrics']['val_loss']:.6f})",
            digits=1,
        )
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
