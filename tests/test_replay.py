"""trainflow replay end to end: the retraining policies over a dated table's history, one retrain per cutoff shared
by the policies, each policy's gate through its own alias, every period's predictions on disk, nothing of the user's
touched, a rerun under its name resuming after its last finished period; and the mistakes refused before anything
starts."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import roc_auc_score

from tests.conftest import daily_table, write_config, write_parquet
from trainflow.flows.cli import main as cli_main

DAYS = 258  # 2013-01-01 to 2013-09-15: from July, periods July and August (September is not full)


def _table(seed: int = 0) -> pa.Table:
    """6 rows a day; y follows x1 until mid-June, then its opposite."""
    return daily_table(DAYS, 6, seed, lambda day, x1, x2: 1.5 * np.where(day < 165, 1.0, -1.0) * x1 + 0.5 * x2)


UNLABELLED_DAY = 184  # 2013-07-04: its 6 rows' labels never arrived (left out of July's score and of later fits)


def _config(tmp_path, unlabelled: bool = False, monitor: dict | None = None, **split):
    history = _table()
    if unlabelled:
        y = history["y"].to_numpy().astype(object)
        y[UNLABELLED_DAY * 6 : (UNLABELLED_DAY + 1) * 6] = None
        history = history.set_column(history.schema.get_field_index("y"), "y", pa.array(list(y), pa.int64()))
    write_parquet(history, tmp_path / "data" / "history.parquet")
    write_parquet(_table(1).drop_columns(["y"]), tmp_path / "data" / "score.parquet")
    return write_config(
        tmp_path,
        {
            "data": {"path": "data/history.parquet", "label": "y", "id_column": "id", "features": ["x1", "x2"]},
            "task": "classification",
            "split": {"time_column": "when", "backtest_fit": False, **split},
            "model": {"type": "xgboost", "params": {"xgboost": {"num_boost_round": 20}}},
            "train": {"folds": 1},
            "scaling": {"num_workers": 1},
            "storage_path": "runs",
            "mlflow": {"experiment": "history", "registered_model": "user-model"},
            "promotion": {"metric": "val_roc_auc", "mode": "max"},
            "inference": {"input": "data/score.parquet", "output": "out/predictions"},
            **({"monitor": monitor} if monitor else {}),
        },
    )


def test_mistakes_are_refused_before_anything_starts_naming_the_key_or_the_time_range(tmp_path, capsys):
    cfg = _config(tmp_path)
    assert cli_main(["replay", "--config", str(cfg), "--every", "fortnight"]) == 2
    assert "--every 'fortnight': expected day, week, month, quarter or a number of days" in capsys.readouterr().err
    assert cli_main(["replay", "--config", str(cfg), "--every", "month", "--from", "2012-06-01"]) == 2
    err = capsys.readouterr().err
    assert "--from 2012-06-01: outside the table's history" in err and "from 2013-01-01 to 2013-09-15" in err
    assert cli_main(["replay", "--config", str(cfg), "--every", "month", "--policies", "gate,sometimes"]) == 2
    assert "'sometimes': not a policy" in capsys.readouterr().err
    undated = _config(tmp_path / "undated", time_column=None)
    assert cli_main(["replay", "--config", str(undated), "--every", "month"]) == 2
    assert "replay needs split.time_column" in capsys.readouterr().err
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert not (tmp_path / "runs").exists() and client.get_experiment_by_name("history-replay") is None


@pytest.mark.e2e
@pytest.mark.usefixtures("prefect_harness", "ray_local")
def test_replay_runs_each_policy_over_the_history_shares_fits_writes_only_its_own_and_resumes(tmp_path, capsys):
    import mlflow

    # July 4th's labels missing; a period under 183 labelled rows is noise-bound
    cfg = _config(tmp_path, unlabelled=True, monitor={"min_rows": 183})
    out = tmp_path / "replay.json"
    args = ["replay", "--config", str(cfg), "--every", "month", "--from", "2013-07-01"]
    args += ["--policies", "gate,always,every-2,never,warm", "--run-name", "hist", "--summary-json", str(out)]
    assert cli_main(args) == 0
    s = json.loads(out.read_text())
    r = s["replay"]
    periods = r["periods"]
    assert [(p["start"], p["end"]) for p in periods] == [("2013-07-01", "2013-08-01"), ("2013-08-01", "2013-09-01")]
    # 6 rows a day; July's 6 unlabelled rows left out of its score and counted (and of the August cutoff's fit)
    assert [(p["rows"], p["unlabelled_rows"]) for p in periods] == [(180, 6), (186, 0)]
    assert periods[0]["noise_bound"] and "noise_bound" not in periods[1]
    assert periods[0]["note"] == "180 labelled rows, fewer than monitor.min_rows 183: noise-bound"
    # who retrained when: every policy at the first cutoff, gate, always and warm at each, every-2 and never not at
    # the second
    trained = {q: [p["policies"][q]["trained"] for p in periods] for q in r["policies"]}
    assert trained == {
        "gate": [True, True],
        "always": [True, True],
        "every-2": [True, False],
        "never": [True, False],
        "warm": [True, True],
    }
    assert [p["policies"]["never"]["serving"] for p in periods] == [0, 0]
    assert [p["policies"]["always"]["serving"] for p in periods] == [0, 1]
    assert periods[1]["policies"]["every-2"]["serving"] == 0
    # warm: at the second cutoff, XGBoost's boosters continue the model the warm policy serves (a fit of its own)
    assert periods[1]["policies"]["warm"]["note"].startswith("warm start: continued version ")
    assert periods[1]["policies"]["warm"]["training_s"] > 0  # its own fit's seconds (its own version: below; two
    # fits' seconds, rounded to 0.1, were once equal)
    # one fresh retrain per cutoff, shared: the same seconds charged to every policy that used it
    fit_s = [p["policies"]["gate"]["training_s"] for p in periods]
    assert all(t > 0 for t in fit_s) and periods[0]["policies"]["never"]["training_s"] == fit_s[0]
    assert r["policies"]["every-2"]["training_s"] == pytest.approx(fit_s[0], abs=0.1)
    assert r["policies"]["warm"]["training_s"] == pytest.approx(fit_s[0] + periods[1]["policies"]["warm"]["training_s"])
    assert r["policies"]["never"]["retrains"] == 1 and r["policies"]["gate"]["retrains"] == 2
    # each policy's mean score and regret (its shortfall from the period's best policy), from the periods' scores
    for q, totals in r["policies"].items():
        scores = [p["policies"][q]["score"] for p in periods]
        best = [max(v["score"] for v in p["policies"].values()) for p in periods]
        assert totals["mean_score"] == pytest.approx(np.mean(scores))
        assert totals["regret"] == pytest.approx(np.mean(np.subtract(best, scores)))
    assert r["recommendation"].startswith("retraining every") and "the gate kept the champion" in r["recommendation"]
    assert "noise" in r["recommendation"]
    shown = capsys.readouterr().out
    assert "trainflow replay" in shown and "recommendation    retraining every" in shown
    # each policy's predictions for each period, from which its score is recomputed
    folder = tmp_path / "runs" / "replay" / "hist"
    for q in r["policies"]:
        for p in periods:
            written = pq.read_table(folder / "predictions" / f"policy={q}" / f"period={p['period']}").to_pandas()
            assert len(written) == p["rows"] and set(written.columns) >= {"id", "prediction", "proba_1", "label"}
            assert roc_auc_score(written["label"], written["proba_1"]) == pytest.approx(p["policies"][q]["score"])
    # only its own: the replay's folder, experiment and registered model; no version of the user's model, no
    # @champion moved, no predictions written to inference.output
    assert sorted(x.name for x in (tmp_path / "runs").iterdir()) == ["replay"]
    assert not (tmp_path / "out").exists()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    assert [m.name for m in client.search_registered_models()] == ["user-model-replay"]
    versions = client.search_model_versions("name='user-model-replay'")
    assert len(versions) == 3  # a fresh fit per cutoff, and the warm policy's at the second
    started = [v for v in versions if v.tags.get("trainflow.warm_start_from")]
    assert len(started) == 1 and all(
        "models:/user-model-replay@hist-warm" in v.tags["trainflow.warm_start_from"] for v in started
    )
    for q in r["policies"]:
        alias = client.get_model_version_by_alias("user-model-replay", f"hist-{q}")
        assert str(alias.version) == periods[-1]["policies"][q]["serving_version"]
    assert client.get_experiment_by_name("history") is None
    exp = client.get_experiment_by_name("history-replay")
    runs = {run.info.run_name: run for run in client.search_runs([exp.experiment_id])}
    assert runs["hist"].data.metrics["never.regret"] == pytest.approx(r["policies"]["never"]["regret"])
    assert "replay.png" in [a.path for a in client.list_artifacts(runs["hist"].info.run_id)]
    # killed after its first period: the rerun judges the second again, training nothing again
    state = json.loads((folder / "replay.json").read_text())
    state["periods"] = state["periods"][:1]
    planted = tmp_path / "planted"  # a checkpoint path edited into the file is never read: the registry's is
    for fit in state["fits"].values():
        fit["path"] = str(planted)
    (folder / "replay.json").write_text(json.dumps(state))
    again = tmp_path / "again.json"
    assert cli_main(args[:-1] + [str(again)]) == 0
    r2 = json.loads(again.read_text())["replay"]

    def decisions(ps):
        keys = ("trained", "promoted", "serving", "score")
        return [{q: [v[k] for k in keys] for q, v in p["policies"].items()} for p in ps]

    assert decisions(r2["periods"]) == decisions(periods)
    # the score plot as a Prefect image artifact too (the latest under its key: this rerun's), beside the totals
    from prefect.artifacts import Artifact

    plot = Artifact.get("user-model-replay-replay")
    assert plot is not None and plot.type == "image" and str(plot.id) == r2["artifacts"]["plot"]
    assert str(plot.data).startswith("data:image/png;base64,")
    assert len(client.search_model_versions("name='user-model-replay'")) == 3  # nothing trained again
    assert r["resumed_periods"] == 0 and r2["resumed_periods"] == 1


def test_a_warm_start_the_config_cannot_make_is_tried_once_then_the_fresh_fits_serve_the_warm_policy():
    from trainflow.flows.replay import Replay, fit_key, warm_refused

    state = Replay("r", ["gate", "warm"], [0.0, 1.0, 2.0])
    state.fits = {fit_key(0): {"cutoff": 0, "version": "1"}, fit_key(1): {"cutoff": 1, "version": "2"}}
    assert warm_refused(state) is None  # no warm retrain yet: cutoff 1's is tried
    state.fits[fit_key(1, warm=True)] = {
        "cutoff": 1,
        "version": "3",
        "note": "warm start: a fresh fit (no model to start from: cannot load model models:/m@r-warm)",
    }
    assert warm_refused(state) is None  # a missing source may be there at the next cutoff
    state.fits[fit_key(1, warm=True)]["note"] = "warm start: a fresh fit (train.folds 5: the challenger is a bag)"
    assert warm_refused(state) == (
        "warm start: a fresh fit (train.folds 5: the challenger is a bag) at cutoff 1: the warm policy takes each "
        "cutoff's fresh fit"
    )


def test_a_resumed_replay_refuses_rows_its_state_file_names_outside_its_folder(tmp_path):
    from trainflow.config import config_from_dict
    from trainflow.errors import DataError
    from trainflow.flows.replay import _trusted_fits

    cfg = config_from_dict(
        {"data": {"path": "t.parquet", "label": "y"}, "task": "classification", "split": {"time_column": "when"}},
        base_dir=tmp_path,
    )
    folder = str(tmp_path / "runs" / "replay" / "r")
    with pytest.raises(DataError, match="names rows outside the replay's folder"):
        _trusted_fits(cfg, folder, {"0": {"cutoff": 0, "version": None, "table": "/home/someone/data.parquet"}})
    inside = {"0": {"cutoff": 0, "version": None, "table": f"{folder}/snapshots/x/table.parquet", "path": "/planted"}}
    assert _trusted_fits(cfg, folder, inside)["0"]["path"] is None  # no version: nothing read, the planted path gone


@pytest.mark.e2e
def test_a_replay_killed_between_a_fit_and_its_period_resumes_skips_the_empty_period_and_trains_nothing_twice(
    tmp_path, capsys, ray_local, prefect_home
):
    """A real SIGKILL as cutoff 1's retrain returns (its version registered, its period not yet in replay.json); the
    rerun under the name resumes after period 0, finds cutoff 1's version instead of registering another, says the
    empty period was skipped, and gives cutoff 2 (no new rows) cutoff 1's model."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    import mlflow

    # 125 days from 2013-01-01; no rows from 2013-04-17 to 2013-04-23: periods of 7 days from 2013-04-10 are
    # 0 (rows), 1 (none) and 2 (rows); cutoffs 1 and 2 see the same rows
    table = _table().slice(0, 125 * 6)
    day = np.repeat(np.arange(125), 6)
    table = table.filter(pa.array((day < 106) | (day >= 113)))
    write_parquet(table, tmp_path / "data" / "history.parquet")
    write_parquet(table.drop_columns(["y"]), tmp_path / "data" / "score.parquet")
    cfg = write_config(
        tmp_path,
        {
            "data": {"path": "data/history.parquet", "label": "y", "id_column": "id", "features": ["x1", "x2"]},
            "task": "classification",
            "split": {"time_column": "when"},
            "model": {"type": "xgboost", "params": {"xgboost": {"num_boost_round": 20}}},
            "train": {"folds": 1},
            # the fits in the replay's own process, as on the Ray it starts itself: joined to this test's Ray, each
            # would start a worker group (12 s here); what a worker's death does is tests/test_faults.py's
            "scaling": {"local_mode": True},
            "storage_path": "runs",
            "mlflow": {"experiment": "history", "registered_model": "user-model"},
            "promotion": {"metric": "val_roc_auc", "mode": "max"},
        },
    )
    out = tmp_path / "replay.json"
    args = ["replay", "--config", str(cfg), "--every", "7", "--from", "2013-04-10", "--policies", "gate,never"]
    args += ["--run-name", "cut", "--summary-json", str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(  # a user's start (Prefect's temporary server) joining this test's Ray as it would a cluster
        PYTHONUNBUFFERED="1",
        PREFECT_HOME=str(prefect_home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        RAY_ADDRESS=ray_local.get_runtime_context().gcs_address,
    )
    log = tmp_path / "killed.log"
    repo = Path(__file__).resolve().parents[1]
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.kill_at", "replay-second-fit", *args],
            env=env,
            cwd=repo,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=300)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its temporary Prefect server too
    assert code == -signal.SIGKILL, f"exit {code}, not killed after cutoff 1's fit:\n{log.read_text()[-4000:]}"
    folder = tmp_path / "runs" / "replay" / "cut"
    state = json.loads((folder / "replay.json").read_text())  # whole: written by replacement
    assert [p["period"] for p in state["periods"]] == [0] and set(state["fits"]) == {"0"}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    assert len(client.search_model_versions("name='user-model-replay'")) == 2  # cutoffs 0 and 1: both registered

    assert cli_main(args) == 0
    r = json.loads(out.read_text())["replay"]
    assert r["resumed_periods"] == 1
    assert len(client.search_model_versions("name='user-model-replay'")) == 2  # cutoff 1's found, not trained again
    periods = r["periods"]
    assert [(p["start"], p["end"], p["rows"]) for p in periods] == [
        ("2013-04-10", "2013-04-17", 42),
        ("2013-04-17", "2013-04-24", 0),
        ("2013-04-24", "2013-05-01", 42),
    ]
    empty = periods[1]
    assert empty["note"] == "no rows in this period: skipped"
    assert all(v["score"] is None for v in empty["policies"].values())
    assert r["scored_periods"] == 2  # the empty one in no mean, regret or recommendation
    gate = [p["policies"]["gate"] for p in periods]
    assert [g["trained"] for g in gate] == [True, True, False]  # cutoff 2: no new rows, nothing to retrain
    assert gate[2]["serving"] == gate[1]["serving"] and gate[2]["training_s"] == 0.0
    for q, totals in r["policies"].items():
        scores = [p["policies"][q]["score"] for p in (periods[0], periods[2])]
        assert totals["mean_score"] == pytest.approx(np.mean(scores))
    shown = capsys.readouterr().out
    assert "(no rows in this period: skipped)" in shown
    assert not (folder / "predictions" / "policy=gate" / "period=1").exists()
