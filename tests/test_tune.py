"""`trainflow tune`: a Ray Tune sweep of TorchTrainer runs with concurrent trials, then the retrain path."""

import json
from itertools import combinations

import pyarrow.dataset as pads
import pytest
from mlflow import MlflowClient

from tests.conftest import churn_config, flow_run_logs, info_logs_to_server
from trainflow.flows.cli import main as cli_main

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.usefixtures("prefect_harness", "ray_local"),
]  # ray_local has the dashboard, whose state API frees stopped trials' placement groups


def test_tune_sweep_end_to_end(tmp_path, capsys):
    cfg = churn_config(
        tmp_path,
        rows=2000,
        network={"epochs": 2, "batch_size": 128},
        scaling={"num_workers": 1},
        tune={
            "num_samples": 2,
            "max_concurrent_trials": 2,
            "metric": "val_loss",
            "mode": "min",
            "scheduler": "asha",
            "search_space": {
                "model.params.mlp.learning_rate": {"loguniform": [0.001, 0.02]},
                "model.params.mlp.batch_size": {"choice": [64, 128]},
            },
        },
    )
    from prefect.logging.handlers import APILogHandler

    with info_logs_to_server():
        assert (
            cli_main(["tune", "--config", str(cfg), "--run-name", "sweep", "--summary-json", str(tmp_path / "s.json")])
            == 0
        )
    APILogHandler().flush()
    summary = json.loads((tmp_path / "s.json").read_text())
    assert (summary["tune_metric"], summary["tune_mode"]) == ("val_loss", "min")
    # the printed summary lists every trial with its sampled values and score
    printed = capsys.readouterr().out
    assert (
        f"sweep             2 trials, 2 at a time; best {summary['best_trial']['trial_id']} by val_loss (min)"
        in printed
    )
    assert all(f"    {t['trial_id']}  model.params.mlp.learning_rate=" in printed for t in summary["trials"])
    trials = summary["trials"]
    assert len(trials) == 2 and summary["max_concurrent_trials"] == 2
    assert all(t["status"] == "ok" and t["epochs_run"] >= 1 for t in trials)
    # each trial is its own Train run named from the trial id; the sampled values are in range
    assert len({t["run_name"] for t in trials}) == 2
    assert all(t["run_name"] == f"sweep-{t['trial_id']}" for t in trials)
    assert all(0.001 <= t["params"]["model.params.mlp.learning_rate"] <= 0.02 for t in trials)
    assert {t["params"]["model.params.mlp.batch_size"] for t in trials} <= {64, 128}
    # 2 CPUs, 1 CPU per trial: two trials ran at the same time
    assert any(a["started_at"] < b["ended_at"] and b["started_at"] < a["ended_at"] for a, b in combinations(trials, 2))
    # the best trial is the one with the lowest val_loss, and its run went on down the retrain path
    best = summary["best_trial"]
    assert best["val_loss"] == min(t["val_loss"] for t in trials)
    assert summary["run_name"] == best["run_name"]
    assert summary["best_checkpoint"]["metrics"]["val_loss"] == pytest.approx(best["val_loss"])
    assert summary["best_checkpoint"]["path"].startswith(str(tmp_path / "runs" / best["run_name"]))
    assert summary["promotion"]["decision"] == "promoted"
    out = pads.dataset(summary["predictions_path"]).to_table()
    assert out.num_rows == summary["input_rows"] == 500
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(summary["mlflow_run_id"])
    # each trial's reports became progress lines in the flow run's logs, named by trial and family
    logs = [log.message for log in flow_run_logs(run.data.tags["trainflow.prefect_flow_run_id"])]
    assert all(
        any(m.startswith(f"trial {t['trial_id']}: mlp epoch ") and "val_loss" in m for m in logs) for t in trials
    )
    # (MLflow's params are the run's config: the network's keys in its model section, as its checkpoint keeps them)
    best_lr = best["params"]["model.params.mlp.learning_rate"]
    assert float(run.data.params["model.learning_rate"]) == pytest.approx(best_lr)

    # a pickle planted in a sweep's folder is never loaded: an existing folder is restored only with --resume
    import pickle

    marker = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    planted = tmp_path / "runs" / "planted"
    planted.mkdir(parents=True)
    (planted / "tuner.pkl").write_bytes(pickle.dumps(Payload()))
    capsys.readouterr()
    assert cli_main(["tune", "--config", str(cfg), "--run-name", "planted"]) == 2
    assert "pass --resume if this is your sweep" in capsys.readouterr().err
    assert not marker.exists()


def test_a_sweep_without_a_search_space_searches_each_familys_default_space_and_the_family(tmp_path):
    """`trainflow tune` on the config `trainflow init` writes (model.type auto, no tune section): each family's own
    default space, the family a search dimension; every default value is one the config accepts."""
    from trainflow.config import AUTO_FAMILIES, config_from_dict
    from trainflow.errors import ConfigError
    from trainflow.trainer.families import REGISTRY
    from trainflow.trainer.tune import sweep_space

    base = {"data": {"path": str(tmp_path / "t.parquet"), "label": "y"}, "task": "classification"}
    space = sweep_space(config_from_dict(base))
    assert space["model.type"] == {"choice": list(AUTO_FAMILIES)}
    assert {
        "model.params.mlp.learning_rate",
        "model.params.mlp.dropout",  # each key where the config writes it, not an earlier spelling
        "model.params.learning_rate",
        "model.params.max_depth",
    } <= set(space)
    # no tune section: the sweep's defaults, its metric the checkpoint's in its direction (what the flow reports;
    # `trainflow tune` on such a config failed with an AttributeError after its services had started)
    tune = config_from_dict({**base, "checkpoint": {"metric": "val_roc_auc"}}).require_tune()
    assert (tune.metric, tune.mode, tune.num_samples) == ("val_roc_auc", "max", 4)
    for family in AUTO_FAMILIES:  # each default space passes the config's own check of a user's search space
        own = REGISTRY[family].search_space
        assert own, family
        config = config_from_dict({**base, "model": {"type": family}, "tune": {"search_space": own}})
        assert sweep_space(config) == own
    # a user's space under auto: the family is searched beside it; a family with no default space needs one
    mine = config_from_dict(
        {**base, "tune": {"search_space": {"model.params.mlp.learning_rate": {"loguniform": [0.001, 0.01]}}}}
    )
    assert set(sweep_space(mine)) == {"model.params.mlp.learning_rate", "model.type"}
    with pytest.raises(ConfigError, match="no default search space"):
        sweep_space(config_from_dict({**base, "model": {"type": "torch", "class_path": "x.y:Z"}}))
