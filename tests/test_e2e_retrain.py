"""End-to-end local flow runs of `retrain` and `batch-inference` with 2 Ray Train workers."""

import datetime
import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pytest
import ray.data
from mlflow import MlflowClient
from prefect.artifacts import Artifact

import trainflow
from trainflow.run.tracking import mlflow_key
from tests.conftest import (
    churn_config,
    flow_run_logs,
    info_logs_to_server,
    make_regression_table,
    prefect_events,
    write_parquet,
)
from trainflow.tables.sample import make_churn_table
from trainflow.tasks.drift import DRIFT_EVENT
from trainflow.tasks.monitor import DEGRADED_EVENT
from trainflow.trainer.serving.checkpoint import read_metrics
from trainflow.trainer.serving.servable import load_servable
from trainflow.trainer.serving.predict import predict_table
from trainflow.flows.cli import main as cli_main
from trainflow.run.tracking import tracking as tracking_uri

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness", "ray_local")]


def _check_common(summary, metric, mode, score_table, id_column):
    hist = read_metrics(summary["best_checkpoint"]["path"])["history"]
    # the loss falls
    assert hist[-1]["val_loss"] < hist[0]["val_loss"]
    # the selected checkpoint is the best by the metric among every epoch (num_to_keep >= epochs)
    values = [h[metric] for h in hist]
    best = min(values) if mode == "min" else max(values)
    assert summary["best_checkpoint"]["metrics"][metric] == pytest.approx(best)
    assert summary["best_checkpoint"]["epoch"] == values.index(best)
    # one output row per input row, ids intact and in input order
    out = pads.dataset(summary["predictions_path"]).to_table()
    assert summary["input_rows"] == summary["output_rows"] == score_table.num_rows == out.num_rows
    assert out[id_column].to_pylist() == score_table[id_column].to_pylist()
    # the written predictions are what the checkpoint's own preprocessor + weights give
    direct = predict_table(load_servable(summary["best_checkpoint"]["path"]), score_table, id_column)
    np.testing.assert_allclose(
        np.asarray(out["prediction"].to_pylist(), dtype=float),
        np.asarray(direct["prediction"].to_pylist(), dtype=float),
        rtol=1e-5,
    )
    return out


def _serves_without_trainflow(where, tracking, model_uri, frame, expected):
    """The registered model loaded and predicted by MLflow alone, in a virtual environment that has the model's
    requirements (this venv's site-packages, added by a .pth line, which runs no .pth of its own: trainflow's
    editable-install hook stays out) but not trainflow: through mlflow.pyfunc and through `mlflow models predict`'s
    own function (mlflow.models.predict, local environment), in one process."""
    with tracking_uri(tracking):  # models:/ resolves through the process's registry URI
        model_dir = mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=str(where / "model"))
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    frame.to_csv(where / "input.csv", index=False)
    script = (
        "import importlib.util, sys, mlflow, pandas as pd\n"
        "assert importlib.util.find_spec('trainflow') is None, 'trainflow is importable'\n"
        f"model = mlflow.pyfunc.load_model({model_dir!r})\n"
        f"model.predict(pd.read_csv({str(where / 'input.csv')!r})).to_csv({str(where / 'pyfunc.csv')!r}, index=False)\n"
        f"mlflow.models.predict({model_dir!r}, input_path={str(where / 'input.csv')!r}, content_type='csv', "
        f"output_path={str(where / 'cli.json')!r}, env_manager='local')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    run = subprocess.run(
        [str(venv / "bin" / "python"), "-c", script], cwd=where, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    served = pd.read_csv(where / "pyfunc.csv")
    np.testing.assert_array_equal(served["prediction"].to_numpy(), expected["prediction"].to_numpy())
    cli = pd.DataFrame(json.loads((where / "cli.json").read_text())["predictions"])
    np.testing.assert_array_equal(cli["prediction"].to_numpy(), expected["prediction"].to_numpy())


def _check_mlflow(summary, tracking_uri, model_name):
    client = MlflowClient(tracking_uri=tracking_uri)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.data.tags["trainflow.data_fingerprint"] == summary["data_fingerprint"]
    assert summary["data_fingerprint"].startswith("content:")
    assert len(client.get_metric_history(run.info.run_id, "val_loss")) == summary["epochs_run"]
    version = client.get_model_version(model_name, summary["model_version"])
    assert version.run_id == run.info.run_id
    # the plots of the model that serves, drawn (pixels vary), and a card that names its figures by what they are
    judged = summary["promotion"].get("judged_on", "validation")
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"loss_curve.png", f"{judged}_rows.png", "model_card.md"} <= artifacts, artifacts
    from matplotlib.image import imread

    for name in ("loss_curve.png", f"{judged}_rows.png"):
        assert imread(client.download_artifacts(run.info.run_id, name)).std() > 0.05, name
    card = Path(client.download_artifacts(run.info.run_id, "model_card.md")).read_text()
    assert "## The model" in card and "Best checkpoint" not in card and "| val_" not in card
    assert not [
        line for line in card.splitlines() if line.startswith("|") and ("| None |" in line or "| nan |" in line)
    ]


def test_retrain_classification_end_to_end_then_boosters_replace_the_champion(tmp_path, capsys):
    # the network is the user's own module (the shipped example), imported by its path on every worker,
    # and rebuilt from the checkpoint's config by the gate, `predict` and MLflow's pyfunc. Trained briefly at a
    # low learning rate it is a weak champion, which the boosters of the second run replace.
    user_model = {
        "type": "torch",
        "class_path": "trainflow.examples.tabular_resnet:TabularResNet",
        "init_args": {"width": 32},
    }
    # class weights distort its probabilities: the calibrate step fits a temperature on the validation split
    cfg_path = churn_config(
        tmp_path,
        model=user_model,
        network={"epochs": 2, "learning_rate": 1e-4},
        train={"class_weight": "balanced"},
        checkpoint={"metric": "val_roc_auc"},
        calibration={"decision_threshold": "f1"},
    )
    summary_path = tmp_path / "summary.json"
    since = datetime.datetime.now(datetime.timezone.utc)
    assert (
        cli_main(["retrain", "--config", str(cfg_path), "--run-name", "clf-e2e", "--summary-json", str(summary_path)])
        == 0
    )
    summary = json.loads(summary_path.read_text())
    # the gate's decision is an event an automation can act on, with the summary's promotion record as payload
    [promoted] = prefect_events("trainflow.model.promoted", since)
    assert promoted.payload == summary["promotion"] and promoted.resource.id == "trainflow.model.churn-test"
    for key in (
        "run_name",
        "data_fingerprint",
        "best_checkpoint",
        "mlflow_run_id",
        "model_version",
        "predictions_path",
        "input_rows",
        "output_rows",
    ):
        assert summary[key] is not None, key
    assert summary["run_name"] == "clf-e2e"
    served = load_servable(summary["best_checkpoint"]["path"])
    assert type(served.predict.model).__name__ == "TabularResNet" and served.config["model"] == {
        **served.config["model"],
        **user_model,
    }
    score = pads.dataset(tmp_path / "data" / "score.parquet").to_table()
    out = _check_common(summary, "val_roc_auc", "max", score, "customer_id")
    assert set(out.column_names) == {"customer_id", "prediction", "proba_0", "proba_1"}
    np.testing.assert_allclose(out["proba_0"].to_numpy() + out["proba_1"].to_numpy(), 1.0, rtol=1e-6)
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _check_mlflow(summary, tracking, "churn-test")
    # three roles by the seeded id hash, written with the run: the test rows are read only after every choice
    assert (
        summary["train_rows"] + summary["validation_rows"] + summary["test_rows"] == 3000 and summary["test_rows"] > 400
    )
    roles = pads.dataset(summary["split_path"], format="parquet").to_table()
    assert roles.num_rows == 3000 and pc.sum(pc.equal(roles["role"], "test")).as_py() == summary["test_rows"]
    test_ids = pc.filter(roles["customer_id"], pc.equal(roles["role"], "test"))
    train_table = pads.dataset(tmp_path / "data" / "train.parquet").to_table()
    test_rows = ray.data.from_arrow(train_table.filter(pc.is_in(train_table["customer_id"], value_set=test_ids)))
    # the first model becomes champion; the gate's score is its test_roc_auc, on every test row
    promo = summary["promotion"]
    assert (promo["decision"], promo["champion_version"], promo["serving_version"]) == ("promoted", None, "1")
    assert (promo["judged_on"], promo["rows"]) == ("test", summary["test_rows"])
    assert promo["challenger_score"] == pytest.approx(summary["test_metrics"]["test_roc_auc"], rel=1e-6)
    assert set(summary["test_metrics"]) >= {"test_loss", "test_accuracy", "test_f1", "test_roc_auc"}
    # calibration (fitted on the validation rows), judged on the test rows: ECE, Brier and the reliability bins
    cal = summary["calibration"]
    assert 0.0 <= cal["ece"] < 0.5 and 0.0 < cal["brier"] < 0.5
    assert sum(b["rows"] for b in cal["bins"]) == summary["test_rows"]
    fit = summary["calibration_fit"]
    assert (fit["method"], fit["why"]) == ("temperature", "train.class_weight is set") and fit["ece_after"] < fit[
        "ece_before"
    ]
    from trainflow.trainer.evaluate import score_checkpoint

    # the gate scored the calibrated model, on the test rows the assignment names
    assert cal["ece"] == pytest.approx(
        score_checkpoint(summary["best_checkpoint"]["path"], test_rows).calibration()["ece"]
    )
    # on fresh rows of the same population the stored calibration lowers the ECE of the probabilities as trained

    fresh = ray.data.from_arrow(make_churn_table(6000, seed=77))
    ece = {
        c: score_checkpoint(summary["best_checkpoint"]["path"], fresh, calibrated=c).calibration()["ece"]
        for c in (True, False)
    }
    assert ece[True] < ece[False] and ece[True] < 0.05, ece
    # the decision threshold tuned for F1 on the validation split decides the written `prediction` column
    threshold = fit["threshold"]
    assert 0.0 < threshold < 1.0 and fit["threshold_why"].startswith("maximises validation F1")
    assert out["prediction"].to_pylist() == [int(p >= threshold) for p in out["proba_1"].to_pylist()]
    mlflow_run = MlflowClient(tracking_uri=tracking).get_run(summary["mlflow_run_id"])
    logged = mlflow_run.data.metrics
    # the training and validation tables are the run's dataset inputs: source the table, digest the fingerprint
    inputs = {i.tags[0].value: i.dataset for i in mlflow_run.inputs.dataset_inputs}
    assert set(inputs) == {"training", "validation"}
    assert inputs["training"].digest == summary["data_fingerprint"].split(":", 1)[1]
    assert json.loads(inputs["training"].source)["uri"] == summary["data_path"]
    # with their schema (every feature and the label) and a profile (rows per role, missing rates of the fit)
    columns = {c["name"]: c["type"] for c in json.loads(inputs["training"].schema)["mlflow_colspec"]}
    assert columns["churned"] == "long" and columns["plan"] == "string" and "customer_id" not in columns
    profile = json.loads(inputs["validation"].profile)
    assert profile["table_rows"] == summary["training_rows"] and profile["test_rows"] == summary["test_rows"]
    assert profile["train_rows"] == summary["train_rows"] and 0 < profile["missing_rate"]["age"] < 0.1
    assert "tenure (months)" not in profile["missing_rate"]  # only columns with missing values
    assert logged["test_ece"] == pytest.approx(cal["ece"]) and logged["test_brier"] == pytest.approx(cal["brier"])
    assert logged["test_roc_auc"] == pytest.approx(summary["test_metrics"]["test_roc_auc"])

    # the registered model serves through MLflow's pyfunc API with the same predictions
    with tracking_uri(tracking):
        pyfunc = mlflow.pyfunc.load_model(f"models:/churn-test/{summary['model_version']}")
    got = pyfunc.predict(score.slice(0, 50).drop_columns(["customer_id"]).to_pandas())
    # its input example is one typical row (built from the fitted preprocessor), which it predicts
    assert (
        list(pyfunc.input_example.columns)
        == load_servable(summary["best_checkpoint"]["path"]).preprocessor.feature_order
    )
    assert len(pyfunc.predict(pyfunc.input_example)) == 1
    assert got["prediction"].tolist() == out["prediction"].to_pylist()[:50]
    # the Python API: class probabilities as sklearn's predict_proba gives them, metrics on the user's labelled rows
    model = trainflow.load_model(
        f"models:/churn-test/{summary['model_version']}",
        tracking_uri=tracking,
        allowed_class_paths=(user_model["class_path"],),
    )
    probs = model.predict_proba(score.slice(0, 50).to_pandas())
    assert list(probs.columns) == model.classes == [0, 1] and np.allclose(probs.sum(axis=1), 1.0)
    np.testing.assert_allclose(probs[1].to_numpy(), out["proba_1"].to_numpy()[:50], rtol=1e-5)
    labelled = pads.dataset(str(tmp_path / "data" / "train.parquet")).to_table().to_pandas()
    scores = trainflow.evaluate(model, labelled)
    from sklearn.metrics import roc_auc_score  # the same figure from the served probabilities (a 2-epoch model: no

    # level is asserted)
    assert scores["roc_auc"] == pytest.approx(
        roc_auc_score(labelled["churned"], model.predict_proba(labelled)[1]), abs=1e-6
    )
    assert scores["loss"] > 0 and set(scores) >= {"accuracy", "f1"}
    with pytest.raises(ValueError, match="no label column 'churned'"):
        model.evaluate(labelled.drop(columns=["churned"]))
    # ... and where trainflow is not installed: the model's own code (code_paths) and its listed requirements
    _serves_without_trainflow(
        tmp_path / "isolated",
        tracking,
        f"models:/churn-test/{summary['model_version']}",
        score.slice(0, 50).drop_columns(["customer_id"]).to_pandas(),
        got,
    )

    # batch-inference from the registry's @champion (the first version claims it) writes the same predictions
    out2 = tmp_path / "again"
    rc = cli_main(
        [
            "predict",
            "--config",
            str(cfg_path),
            "--set",
            f"inference.output={out2}",
            "--summary-json",
            str(tmp_path / "p.json"),
        ]
    )
    assert rc == 0
    predicted = json.loads((tmp_path / "p.json").read_text())
    assert (predicted["model"], predicted["model_version_uri"]) == (
        "models:/churn-test@champion",
        "models:/churn-test/1",
    )
    # the scoring table comes from the training distribution: no feature drifted, each judged by its measure
    drift = predicted["drift"]
    assert drift["drifted_columns"] == [] and drift["rows"] == score.num_rows
    assert {c: r["method"] for c, r in drift["columns"].items()}["age"] == "jensen_shannon"
    assert {c: r["method"] for c, r in drift["columns"].items()}["plan"] == "l_infinity"
    assert all(r["verdict"] == "ok" and r["score"] < r["threshold"] for r in drift["columns"].values())
    again = pads.dataset(out2).to_table()
    assert again["prediction"].to_pylist() == out["prediction"].to_pylist()

    # a category never seen in training: with inference.on_unseen=error the run fails naming the column and
    # value and the old output is intact; by default every row is predicted and the rows are counted. The same
    # table has `age` shifted by 2 standard deviations: that feature, and only it, is reported as drifted
    before = sorted(p.name for p in out2.iterdir())
    plans = score["plan"].to_pylist()
    drift = score.set_column(score.schema.get_field_index("plan"), "plan", pa.array(["platinum"] * 7 + plans[7:]))
    ages = np.asarray(score["age"].to_pylist(), dtype=float)
    drift = drift.set_column(
        drift.schema.get_field_index("age"), "age", pa.array(ages + 2 * np.nanstd(ages), mask=np.isnan(ages))
    )
    write_parquet(drift, tmp_path / "drift" / "score.parquet")
    drift_args = [
        "predict",
        "--config",
        str(cfg_path),
        "--model",
        summary["model_uri"],
        "--set",
        f"inference.input={tmp_path / 'drift' / 'score.parquet'}",
        "--set",
        f"inference.output={out2}",
    ]
    assert cli_main([*drift_args, "--set", "inference.on_unseen=error"]) == 2
    assert "column 'plan' has category 'platinum'" in capsys.readouterr().err
    assert sorted(p.name for p in out2.iterdir()) == before
    assert pads.dataset(out2).to_table()["prediction"].to_pylist() == out["prediction"].to_pylist()
    assert not [p for p in out2.parent.iterdir() if "trainflow-tmp-" in p.name or "trainflow-old-" in p.name]
    assert cli_main([*drift_args, "--summary-json", str(tmp_path / "drift.json")]) == 0
    drifted_summary = json.loads((tmp_path / "drift.json").read_text())
    assert drifted_summary["unseen_categories"] == {"plan": 7}
    assert drifted_summary["drift"]["drifted_columns"] == ["age"]
    assert drifted_summary["drift"]["columns"]["age"]["score"] > 0.3
    drifted = pads.dataset(out2).to_table()
    assert drifted.num_rows == score.num_rows
    # the scores are MLflow metrics of the serving version's run, one point per scoring run; the Prefect
    # artifact shows the table and the bar chart
    client = MlflowClient(tracking_uri=tracking)
    history = client.get_metric_history(client.get_model_version("churn-test", "1").run_id, "drift.age")
    assert len(history) == 3 and history[-1].value == pytest.approx(drifted_summary["drift"]["columns"]["age"]["score"])
    card = Artifact.get("churn-test-drift").data
    assert "drifted: `age`" in card and "data:image/png;base64," in card

    _boosters_replace_the_champion(tmp_path, cfg_path, score, tracking, capsys)


def _boosters_replace_the_champion(tmp_path, cfg_path, score, tracking, capsys):
    """Both boosters train (a fan-out of train task runs, each its own Ray Train run); the better one is gated
    against the weak network champion and replaces it."""
    summary_path = tmp_path / "trees.json"
    # a config that does not name the champion's module class never imports it from the registry: `predict` refuses
    # (exit 2), and the gate below scores the champion only because the config allows its class path
    trees = ["--set", "model.class_path=null", "--set", "model.init_args={}", "--set", "model.params.torch=null"]
    rc = cli_main(
        [
            "predict",
            "--config",
            str(cfg_path),
            "--set",
            "model.type=mlp",
            *trees,
            "--set",
            f"inference.output={tmp_path / 'refused'}",
        ]
    )
    assert rc == 2 and not (tmp_path / "refused").exists()
    boosters = [
        "--config",
        str(cfg_path),
        "--set",
        "model.type=[xgboost, lightgbm]",
        *trees,
        "--set",
        "model.allowed_class_paths=[trainflow.examples.tabular_resnet:TabularResNet]",
        "--set",
        "model.params.learning_rate=0.2",
        "--set",
        "model.params.num_boost_round=100",
        "--set",
        "model.params.early_stopping_rounds=10",
    ]
    rc = cli_main(["retrain", *boosters, "--run-name", "trees", "--summary-json", str(summary_path)])
    assert rc == 0
    summary = json.loads(summary_path.read_text())
    candidates = summary["candidates"]
    # both boosters and their weighted ensemble (greedy selection kept both: each has weight)
    assert sorted(c["family"] for c in candidates) == ["ensemble", "lightgbm", "xgboost"]
    assert [c["val_roc_auc"] for c in candidates] == sorted((c["val_roc_auc"] for c in candidates), reverse=True)
    members = summary["ensemble"]["members"]
    assert sorted(m["family"] for m in members) == ["lightgbm", "xgboost"] and all(m["weight"] > 0 for m in members)
    assert sum(m["weight"] for m in members) == pytest.approx(1.0)
    winner = candidates[0]["family"]
    # one split of a small table, one worker each: both families trained in one Ray Train run (tasks/cross_fit.py
    # train_config), each in its own folder with its own MLflow run of plain metrics
    runs = {c["family"]: c["run_name"] for c in candidates if c["family"] != "ensemble"}
    assert runs == {f: f"trees-families/trees-{f}" for f in ("xgboost", "lightgbm")}, runs
    assert summary["model_family"] == winner and summary["run_name"] == runs.get(winner, "trees-ensemble")
    for c in candidates:  # each family's run kept its own checkpoints, the ensemble its own folder
        assert load_servable(c["checkpoint"]).family == c["family"]
    promo = summary["promotion"]
    assert (promo["decision"], promo["champion_version"], promo["serving_version"]) == ("promoted", "1", "2")
    assert promo["challenger_score"] > promo["champion_score"]
    rows = summary["feature_importance"]
    assert all("change" in r for r in rows) and rows[0]["importance"] > 0 and promo["confidence"]["gain_p05"] > 0
    # both champion and challenger were trained under the same plan: judged on every test row; every candidate
    # has its test score beside the validation score that ranked it
    assert (promo["judged_on"], promo["rows"]) == ("test", summary["test_rows"])
    assert promo["challenger_score"] == pytest.approx(summary["test_metrics"]["test_roc_auc"], rel=1e-6)
    assert all(0.5 < c["test_roc_auc"] <= 1.0 for c in candidates)
    # the leaderboard's test figures are the models chosen among; the served one is the winner refitted on the
    # training and validation rows (train.refit auto: a booster, a winning ensemble's boosters), scored beside it
    refit = summary["refit"]
    assert refit["refitted"] and summary["test_metrics"] == refit["test_metrics"]["refitted"]
    assert next(c for c in candidates if c["family"] == winner)["test_roc_auc"] == pytest.approx(
        refit["test_metrics"]["chosen"]["test_roc_auc"], rel=1e-6
    )
    if winner != "ensemble":
        # the booster's selected round is the best reported one
        hist = read_metrics(summary["best_checkpoint"]["path"])["history"]
        assert summary["best_checkpoint"]["epoch"] < len(hist) and hist[-1]["val_loss"] < hist[0]["val_loss"]
        # the trees' own gain share beside the permutation scores
        assert sum(r["gain_share"] for r in rows) == pytest.approx(1.0)
    # every row predicted by the new champion, as its own checkpoint predicts them
    out = pads.dataset(summary["predictions_path"]).to_table()
    assert out["customer_id"].to_pylist() == score["customer_id"].to_pylist()
    direct = predict_table(load_servable(summary["best_checkpoint"]["path"]), score, "customer_id")
    np.testing.assert_allclose(out["proba_1"].to_numpy(), direct["proba_1"].to_numpy(), rtol=1e-6)
    # registered as a pyfunc model like every family: MLflow serves the same predictions
    client = MlflowClient(tracking_uri=tracking)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.data.tags["trainflow.model_family"] == winner
    assert run.data.params["model.type"] == (str(["xgboost", "lightgbm"]) if winner == "ensemble" else winner)
    assert len(client.get_metric_history(run.info.run_id, "val_loss")) == summary["epochs_run"]
    # one parent run for the retrain, every family's run (and the ensemble's) nested under it, all ended; the
    # summary is the parent's artifact; the version says what it is and why the gate decided as it did
    parent = client.get_run(run.data.tags["mlflow.parentRunId"])
    children = client.search_runs(
        [run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    assert {c.info.run_name for c in children} >= set(runs.values())
    for child in children:  # each family's every round under its plain name, as a run of its own logs them
        if child.info.run_name in runs.values():
            assert len(client.get_metric_history(child.info.run_id, "val_loss")) > 1
            assert not [m for m in child.data.metrics if m.startswith("fold")], child.data.metrics
    assert parent.info.run_name == "trees" and parent.info.status == "FINISHED"
    assert {c.info.status for c in children} == {"FINISHED"}
    with tracking_uri(tracking):
        stored = json.loads(
            Path(
                mlflow.artifacts.download_artifacts(
                    run_id=parent.info.run_id, artifact_path="summary.json", dst_path=str(tmp_path / "parent")
                )
            ).read_text()
        )
    assert stored["model_version"] == summary["model_version"] and stored["candidates"] == summary["candidates"]
    # the leaderboard (every candidate: validation and test scores, training seconds) and the model card beside it
    with tracking_uri(tracking):
        board = pd.read_json(
            mlflow.artifacts.download_artifacts(
                run_id=parent.info.run_id, artifact_path="leaderboard.json", dst_path=str(tmp_path / "parent")
            ),
            orient="split",
        )
        card = Path(
            mlflow.artifacts.download_artifacts(
                run_id=parent.info.run_id, artifact_path="model_card.md", dst_path=str(tmp_path / "parent")
            )
        ).read_text()
    assert list(board["family"]) == [c["family"] for c in summary["candidates"]]
    assert {"val_roc_auc", "test_roc_auc", "train_s"} <= set(board.columns)
    assert all(board.loc[board["family"] != "ensemble", "train_s"] > 0) and board["train_s"].notna().all()
    header = next(line for line in card.splitlines() if line.startswith("| family"))
    assert [c.strip() for c in header.strip("|").split("|")] == list(board.columns)  # the card's leaderboard
    assert card.startswith("# ") and f"version {summary['model_version']}" in card, card[:300]
    description = client.get_model_version("churn-test", summary["model_version"]).description
    assert f"trainflow {winner} trained on" in description and "Gate: promoted" in description, description
    # the alias's history: v1 served from the first run until the gate replaced it with v2, saying why
    from trainflow.champion import history

    served = history(client, "churn-test")
    assert [(r["version"], r["replaced_by"] if r["until"] else None) for r in served] == [("1", "2"), ("2", None)]
    assert served[0]["replaced_why"] == summary["promotion"]["reason"] and served[1]["by"].startswith("the gate")
    with tracking_uri(tracking):
        pyfunc = mlflow.pyfunc.load_model("models:/churn-test@champion")
    got = pyfunc.predict(score.slice(0, 40).drop_columns(["customer_id"]).to_pandas())
    np.testing.assert_allclose(got["proba_1"].to_numpy(), direct["proba_1"].to_numpy()[:40], rtol=1e-6)
    # its training split matched the network champion's baseline: every check ran, none flagged
    validation = summary["validation"]
    assert validation["champion_version"] == "1" and validation["anomalies"] == [] and len(validation["checks"]) > 10
    _unchanged_data_is_skipped_and_broken_data_is_refused(tmp_path, boosters, client, capsys)


def _unchanged_data_is_skipped_and_broken_data_is_refused(tmp_path, boosters, client, capsys):
    """The same data and training config as the champion: nothing trains or registers, the champion scores.
    A table with 5% of the rows, a column 40% empty, or the class balance flipped: exit 2 before any training."""
    versions = len(client.search_model_versions("name = 'churn-test'"))
    skipped = _small_work_without_prefect_or_ray(tmp_path, boosters)
    assert skipped["skipped"]["champion_version"] == "2" and "--force" in skipped["skipped"]["reason"]
    assert skipped["predictions_model_version"] == "2" and skipped["output_rows"] == 500
    assert not list((tmp_path / "runs").glob("skip-here*"))
    assert len(client.search_model_versions("name = 'churn-test'")) == versions
    table = pads.dataset(tmp_path / "data" / "train.parquet").to_table()
    rng = np.random.default_rng(5)
    charges = np.asarray(table["monthly charges ($)"].to_pylist(), dtype=float)
    emptied = table.set_column(
        table.schema.get_field_index("monthly charges ($)"),
        "monthly charges ($)",
        pa.array(charges, mask=rng.random(table.num_rows) < 0.4),
    )
    y = np.asarray(table["churned"].to_pylist())
    flipped = table.filter(pa.array((y == 1) | (rng.random(table.num_rows) < 0.15)))
    for name, broken, needle in (
        ("few", table.slice(0, table.num_rows // 20), "the table: row_count was 19"),
        ("empty", emptied, "column 'monthly charges ($)': null_rate was 0.0"),
        ("flipped", flipped, "label_balance was {"),
    ):
        write_parquet(broken, tmp_path / name / "train.parquet")
        rc = cli_main(
            ["retrain", *boosters, "--run-name", name, "--set", f"data.path={tmp_path / name / 'train.parquet'}"]
        )
        err = capsys.readouterr().err
        assert rc == 2 and needle in err and "relax with validation." in err, err
        assert not list((tmp_path / "runs").glob(f"{name}*"))
    assert len(client.search_model_versions("name = 'churn-test'")) == versions
    _monitor_live_performance(tmp_path, boosters[1], client, capsys)


def _small_work_without_prefect_or_ray(tmp_path, boosters) -> dict:
    """With no Prefect API configured, a retrain on the champion's own data and config (a skip: nothing trains, the
    champion scores) and a predict of a small table run in the calling process: neither Ray nor Prefect's temporary
    server starts, and the predictions are the flow run's. (The skip under a Prefect server: test_deployments.)
    Returns the skip's summary."""
    # (Prefect's INFO lines shown: they would say "Starting temporary server")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")} | {"PREFECT_LOGGING_LEVEL": "INFO"}
    out, summaries = tmp_path / "here", {}
    for args in (["retrain", *boosters, "--run-name", "skip-here"], ["predict", *boosters[:2]]):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "trainflow.flows.cli",
                *args,
                "--set",
                f"inference.output={out}",
                "--summary-json",
                str(tmp_path / f"{args[0]}.json"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Ray dashboard" not in proc.stderr and "temporary server" not in proc.stderr, proc.stderr[-3000:]
        assert "Downloading artifacts" not in proc.stderr  # MLflow's progress bars only in a terminal
        assert "trainflow summary" in proc.stdout and f"{out} (500 rows for 500 inputs" in proc.stdout, proc.stdout
        assert "wrote 500 predictions for 500 input rows" in proc.stderr  # the task's lines, as in a flow run
        assert (
            pads.dataset(out).to_table()["prediction"].to_pylist()
            == pads.dataset(tmp_path / "out" / "predictions").to_table()["prediction"].to_pylist()
        )
        summaries[args[0]] = json.loads((tmp_path / f"{args[0]}.json").read_text())
    assert summaries["predict"]["model_version_uri"] == "models:/churn-test/2"
    assert summaries["predict"]["drift"]["drifted_columns"] == []
    # beside drift, the scoring run's CBPE estimate (a classifier scored in this process)
    assert set(summaries["predict"]["estimated_metrics"]) >= {"val_accuracy", "val_roc_auc"}
    # validate: every check (the split, the fit, each family's memory, the data against the champion's), no Ray
    proc = subprocess.run(
        [sys.executable, "-m", "trainflow.flows.cli", "validate", *boosters[:2]],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Ray dashboard" not in proc.stderr and "temporary server" not in proc.stderr, proc.stderr[-3000:]
    assert "  valid             yes" in proc.stdout, proc.stdout
    assert re.search(r"validation against version 2: \d+ check\(s\), 0 anomal", proc.stderr), proc.stderr[-3000:]
    return summaries["retrain"]


def _monitor_live_performance(tmp_path, cfg_path, client, capsys):
    """The scoring rows' true labels arrive: the version that wrote the predictions (read from their manifest) scores
    about its validation score on them; with 40% of the labels flipped it is degraded."""
    truth = make_churn_table(500, seed=2, id_offset=10_000).select(["customer_id", "churned"])
    write_parquet(truth, tmp_path / "labels" / "true.parquet")
    y = np.asarray(truth["churned"].to_pylist())
    flip = np.random.default_rng(3).random(len(y)) < 0.4
    write_parquet(
        truth.set_column(1, "churned", pa.array(np.where(flip, 1 - y, y))), tmp_path / "labels" / "flipped.parquet"
    )
    reports = {}
    capsys.readouterr()
    for name in ("true", "flipped"):
        out = tmp_path / f"monitor-{name}.json"
        assert (
            cli_main(
                [
                    "monitor",
                    "--config",
                    cfg_path,
                    "--labels",
                    str(tmp_path / "labels" / f"{name}.parquet"),
                    "--summary-json",
                    str(out),
                ]
            )
            == 0
        )
        reports[name] = json.loads(out.read_text())["monitor"]
        printed = capsys.readouterr().out  # a summary a person reads; the JSON is behind --summary-json
        assert (
            f"  verdict           {reports[name]['verdict']}" in printed and "  labelled rows     500 of 500" in printed
        )
    good, bad = reports["true"], reports["flipped"]
    assert good["model_version"] == bad["model_version"] == "2" and good["rows"] == 500
    assert good["metric"] == "val_roc_auc" and abs(good["live_score"] - good["validation_score"]) < 0.1
    assert good["degraded"] is False and bad["degraded"] is True and bad["drop"] > 0.05
    assert set(good["metrics"]) >= {"val_loss", "val_accuracy", "val_f1", "val_roc_auc"}
    assert good["coverage"] == 1.0 and good["verdict"] == "ok" and bad["verdict"] == "degraded"
    run = client.get_model_version("churn-test", "2").run_id
    assert len(client.get_metric_history(run, "live_val_roc_auc")) == 2
    # before the labels arrive: the same figures estimated from the calibrated probabilities alone (CBPE), close to
    # what the true labels then measured
    # the labels' report puts the estimate of the same rows beside what they measured
    assert abs(good["estimated_metrics"]["val_accuracy"] - good["metrics"]["val_accuracy"]) < 0.06, good
    logged = len(client.get_metric_history(run, "estimated_val_roc_auc"))  # the scoring runs' estimates so far
    out = tmp_path / "monitor-estimated.json"
    assert cli_main(["monitor", "--config", cfg_path, "--summary-json", str(out)]) == 0
    estimated = json.loads(out.read_text())["monitor"]
    assert estimated["estimated"] is True and estimated["labels"] == 0 and estimated["verdict"] == "ok"
    for metric in ("val_accuracy", "val_roc_auc"):  # (F1 at a tuned threshold on 500 rows is noisier: unit-tested)
        assert abs(estimated["metrics"][metric] - good["metrics"][metric]) < 0.06, (metric, estimated, good)
    assert "  estimated         from the probabilities of 500 predictions" in capsys.readouterr().out
    assert len(client.get_metric_history(run, "estimated_val_roc_auc")) == logged + 1
    _an_estimated_drop_raises_the_drift_event(tmp_path, cfg_path, good["validation_score"])
    # 100 ids repeated 20 times would count 20 rows each: refused with the count, nothing logged
    write_parquet(pa.concat_tables([truth.slice(0, 100)] * 20), tmp_path / "labels" / "repeated.parquet")
    assert cli_main(["monitor", "--config", cfg_path, "--labels", str(tmp_path / "labels" / "repeated.parquet")]) == 2
    assert len(client.get_metric_history(run, "live_val_roc_auc")) == 2


def _an_estimated_drop_raises_the_drift_event(tmp_path, cfg_path, held_out):
    """Rows the model cannot tell apart (one scoring row 500 times): every probability alike, an estimated ROC AUC
    of 0.5, far below the version's held-out score. The scoring run itself says so and raises the drift event (before
    any label, for the automations that retrain on drift), and monitor's estimate of that output is degraded."""
    since = datetime.datetime.now(datetime.timezone.utc)
    row = make_churn_table(1, seed=4, with_label=False)
    same = pa.concat_tables([row] * 500).set_column(0, "customer_id", pa.array(np.arange(500) + 50_000))
    write_parquet(same, tmp_path / "same" / "score.parquet")
    where = ["--config", str(cfg_path), "--set", f"inference.output={tmp_path / 'same-out'}"]
    assert (
        cli_main(
            [
                "predict",
                *where,
                "--set",
                f"inference.input={tmp_path / 'same' / 'score.parquet'}",
                "--summary-json",
                str(tmp_path / "same.json"),
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "same.json").read_text())["estimated_metrics"]["val_roc_auc"] == pytest.approx(0.5)
    assert cli_main(["monitor", *where, "--summary-json", str(tmp_path / "same-monitor.json")]) == 0
    report = json.loads((tmp_path / "same-monitor.json").read_text())["monitor"]
    assert report["estimated"] is True and report["verdict"] == "degraded"
    assert report["drop"] == pytest.approx(held_out - 0.5)
    # one drift event per run: the scoring run's names its drifted columns (one row repeated moves every feature's
    # distribution) beside the estimated drop, monitor's the drop alone
    scoring, monitoring = prefect_events(DRIFT_EVENT, since, count=2)
    assert [e.payload["estimated_drop"]["val_roc_auc"] for e in (scoring, monitoring)] == pytest.approx(
        [held_out - 0.5] * 2
    )
    assert "age" in scoring.payload["drifted_columns"] and monitoring.payload["drifted_columns"] == []
    assert scoring.resource.id == monitoring.resource.id == "trainflow.model.churn-test"
    assert len(prefect_events(DEGRADED_EVENT, since)) == 1


def _with_store_and_visit(table: pa.Table, seed: int, codes: int) -> pa.Table:
    """Adds a text column of up to `codes` store codes and an ISO-8601 timestamp column written as text."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, codes, table.num_rows)
    ids[: min(codes, table.num_rows)] = rng.permutation(codes)[: table.num_rows]  # every code appears
    stores = [f"S{i:05d}" for i in ids]
    base = np.datetime64("2024-01-01T00:00:00")
    visits = (base + rng.integers(0, 365 * 86400, table.num_rows).astype("timedelta64[s]")).astype(str)
    return table.append_column("store", pa.array(stores)).append_column("visited at", pa.array(visits.tolist()))


def test_retrain_regression_end_to_end(tmp_path, monkeypatch):
    # a 5,000-value text column (embedded) and a timestamp written as text (date parts); the scoring table
    # holds store codes never seen in training, and every one of its rows is still predicted
    train_table = _with_store_and_visit(make_regression_table(6000, seed=1), seed=1, codes=5000)
    write_parquet(train_table, tmp_path / "reg" / "train.parquet")
    score = _with_store_and_visit(make_regression_table(400, seed=9, with_label=False), seed=9, codes=20000)
    write_parquet(score, tmp_path / "reg" / "score.parquet")
    # through the Python API with a dict (relative paths resolve against the working directory) and no `task`:
    # the label's fractional numbers make it regression
    monkeypatch.chdir(tmp_path)
    config = {
        "data": {"path": "reg/train.parquet", "label": "target y", "id_column": "row id"},
        "model": {"type": "mlp", "params": {"mlp": {"epochs": 3, "batch_size": 64, "learning_rate": 0.01}}},
        # a secret for the workers: a dict config is handed to the flow in-process, never stored as a flow parameter
        "scaling": {"num_workers": 2, "env_vars": {"TRAINFLOW_TEST_TOKEN": "tok-s3cr3t-in-a-dict"}},
        "checkpoint": {"num_to_keep": 3, "metric": "val_r2", "min_interval_s": 0},  # a report (and a line) per epoch
        "mlflow": {"registered_model": "reg-test"},
        "inference": {"input": "reg/score.parquet", "output": "out/reg"},
    }
    from prefect.logging.handlers import APILogHandler

    with info_logs_to_server():
        summary = trainflow.retrain(config, run_name="reg-e2e")
    APILogHandler().flush()  # the logs go to the server in the background: all of them now
    assert summary["task"] == "regression"
    # a progress line per reported epoch in the Prefect logs, the first written while training went on (before the
    # last epoch's checkpoint), and the same metrics in MLflow as they came
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    flow_run_id = (
        MlflowClient(tracking_uri=tracking).get_run(summary["mlflow_run_id"]).data.tags["trainflow.prefect_flow_run_id"]
    )
    logs = flow_run_logs(flow_run_id)
    progress = [log for log in logs if log.message.startswith("mlp epoch ")]
    assert [log.message.split(":")[0] for log in progress] == ["mlp epoch 1/3", "mlp epoch 2/3", "mlp epoch 3/3"]
    assert all("val_r2" in log.message and "train_loss" in log.message for log in progress)
    last_checkpoint = max(f.stat().st_mtime for f in Path(summary["ray_run_path"]).glob("checkpoint_*/*"))
    assert progress[0].timestamp.timestamp() < last_checkpoint
    live = MlflowClient(tracking_uri=tracking).get_metric_history(summary["mlflow_run_id"], "val_r2")
    assert sorted(m.step for m in live) == [0, 1, 2] and min(m.timestamp for m in live) / 1000 < last_checkpoint
    assert summary["best_checkpoint"]["metrics"]["val_r2"] > 0.7
    # what it relies on: the three columns y is made of, then the two noise columns (a store code, a visit time)
    ranked = [r["column"] for r in summary["feature_importance"]]
    assert ranked[0] == "x 1 (m/s)" and set(ranked[3:]) == {"store", "visited at"}, summary["feature_importance"]
    assert (
        mlflow_key("importance.x 1 (m/s)")
        in MlflowClient(tracking_uri=tracking).get_run(summary["mlflow_run_id"]).data.metrics
    )
    _check_common(summary, "val_r2", "max", score, "row id")
    prep = load_servable(summary["best_checkpoint"]["path"]).preprocessor
    assert len(set(train_table["store"].to_pylist())) == 5000 and set(prep.embedded) == {"store"}
    assert list(prep.dates) == ["visited at"] and "kind, class" in prep.categorical
    known = set(prep.embedded["store"]["categories"])
    assert summary["unseen_categories"] == {"store": sum(v not in known for v in score["store"].to_pylist())}
    _check_mlflow(summary, tracking, "reg-test")
    assert summary["promotion"]["decision"] == "promoted"
    # the retrain's parent run holds the summary, the version its description: neither holds the workers' secret
    client = MlflowClient(tracking_uri=tracking)
    parent = client.get_run(client.get_run(summary["mlflow_run_id"]).data.tags["mlflow.parentRunId"])
    assert parent.info.status == "FINISHED" and parent.info.run_name == "reg-e2e"
    with tracking_uri(tracking):
        stored = Path(
            mlflow.artifacts.download_artifacts(
                run_id=parent.info.run_id, artifact_path="summary.json", dst_path=str(tmp_path / "parent")
            )
        ).read_text()
    description = client.get_model_version("reg-test", summary["model_version"]).description
    assert "s3cr3t" not in stored and "s3cr3t" not in description and "Gate: promoted" in description
    # the registered model in this process (Python API): the batch output's columns for every row
    model = trainflow.load_model(summary["model_uri"], tracking_uri=tracking)
    frame = score.to_pandas().set_index("row id", drop=False)
    got = model.predict(frame)
    written = pads.dataset(summary["predictions_path"]).to_table()
    assert list(got.columns) == ["prediction"] and list(got.index) == list(frame.index)
    assert model.evaluate(train_table.to_pandas())["r2"] > 0.5 and model.classes is None
    with pytest.raises(ValueError, match="predict_proba is for classification"):
        model.predict_proba(frame)
    np.testing.assert_allclose(got["prediction"].to_numpy(), written["prediction"].to_numpy(), rtol=1e-5)
    # a registered challenger that is not promoted (champion kept, predictions from it, the artifacts that say
    # so): tests/test_s3.py's resumed rerun, which makes no fit of its own for it
