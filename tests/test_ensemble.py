"""The weighted ensemble: greedy selection that weights complementary models, an ensemble checkpoint built from real
member checkpoints (a linear network and an XGBoost booster), served and registered like any model, rebuilt the
same on a rerun, and read strictly (no member chooses the code or the files it loads)."""

from __future__ import annotations

import json
import shutil

import mlflow
import numpy as np
import pyarrow as pa
import pytest
import ray.data
import torch

from tests.conftest import BUCKET, write_config, write_parquet
from trainflow.config import load_config
from trainflow.errors import CheckpointError
from trainflow.trainer.ensemble import cross_fitted, greedy_weights, halves
from trainflow.trainer.serving.servable import combine, load_servable

pytestmark = pytest.mark.usefixtures("prefect_harness", "ray_local")


def test_greedy_selection_weights_complementary_models_and_drops_a_bad_one():
    rng = np.random.default_rng(0)
    y = rng.normal(size=4000)
    a, b = y + rng.normal(0, 0.5, y.size), y + rng.normal(0, 0.5, y.size)  # equally good, errors independent
    bad = rng.normal(0, 3, y.size)  # a model that learnt nothing (its best weight, 1/(4+4+0.1), is below 1/25)
    weights = greedy_weights("regression", [a[:, None], b[:, None], bad[:, None]], y)
    assert weights[2] == 0 and 0.35 <= weights[0] <= 0.65 and sum(weights) == pytest.approx(1.0)
    mixed = combine("regression", [a[:, None], b[:, None], bad[:, None]], weights).ravel()
    assert np.mean((mixed - y) ** 2) < 0.7 * min(np.mean((a - y) ** 2), np.mean((b - y) ** 2))
    # classes: a model sure of the truth on one half and one sure of it on the other half get about half each
    labels = rng.integers(0, 3, 4000)
    half = np.arange(labels.size) < labels.size // 2
    left, right = rng.normal(0, 1, (labels.size, 3)), rng.normal(0, 1, (labels.size, 3))
    left[half, labels[half]] += 4
    right[~half, labels[~half]] += 4
    weights = greedy_weights("classification", [left, right], labels)
    assert 0.3 <= weights[0] <= 0.7
    # cross-fitted outputs: every row scored, by weights from the other half
    assert cross_fitted("classification", [left, right], labels, halves(rng.random(labels.size))).shape == left.shape


def _members(tmp_path):
    """A regression table (y = x + noise), its fitted preprocessor, and real member checkpoints written with
    trainflow's checkpoint code: a shrunk linear network (mlp) and a small XGBoost booster (xgboost), about as good
    as each other with different errors, and a LightGBM booster fitted to shuffled labels."""
    import lightgbm as lgb
    import xgboost as xgb

    from trainflow.preprocessors.fit import fit_preprocessor
    from trainflow.tables.files import table_spec
    from trainflow.trainer.serving.checkpoint import save_checkpoint, write_common
    from trainflow.trainer.families.lightgbm_family import LGB_MODEL
    from trainflow.trainer.families.xgboost_family import XGB_MODEL, xgb_matrix

    rng = np.random.default_rng(0)
    x = rng.normal(size=2000)
    table = pa.table({"x": x, "y": x + rng.normal(0, 0.05, x.size)})
    write_parquet(table, tmp_path / "t.parquet")
    cfg = load_config(
        write_config(
            tmp_path,
            {
                "data": {"path": "t.parquet", "label": "y", "features": ["x"]},
                "task": "regression",
                "model": {"type": ["mlp", "xgboost", "lightgbm"], "hidden_sizes": [], "numeric_embedding": "none"},
                "storage_path": "runs",
                "mlflow": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "registered_model": "ens"},
            },
        )
    )
    ds = ray.data.from_arrow(table)
    prep = fit_preprocessor(ds, table_spec(table.schema, cfg.data, cfg.task, "t"), cfg.task)
    packed = prep.transform_features(table)
    target = prep.transform_label(table)
    paths = {}
    for family in ("mlp", "xgboost", "lightgbm"):
        d = tmp_path / "best" / family
        d.mkdir(parents=True)
        if family == "mlp":
            state = {"0.weight": torch.tensor([[0.8]], dtype=torch.float32), "0.bias": torch.zeros(1)}
            save_checkpoint(
                d, state, {"epoch": 4}, {"val_loss": 0.1}, [], prep.to_dict(), cfg.for_family(family).to_dict()
            )
        elif family == "xgboost":
            booster = xgb.train({"max_depth": 2, "eta": 0.3}, xgb_matrix(prep, packed, target), num_boost_round=6)
            booster.save_model(str(d / XGB_MODEL))
        else:  # fitted to shuffled labels: no use to the ensemble
            shuffled = rng.permutation(target)
            lgb.train({"num_leaves": 4, "verbose": -1}, lgb.Dataset(packed, shuffled), num_boost_round=5).save_model(
                str(d / LGB_MODEL)
            )
        if family != "mlp":
            write_common(d, 5, {"val_loss": 0.1}, [], prep.to_dict(), cfg.for_family(family).to_dict())
        paths[family] = str(d)
    return cfg, ds, table, paths


def test_an_ensemble_checkpoint_is_served_registered_rebuilt_and_read_strictly(tmp_path):
    from trainflow.tasks.ensemble import ensemble
    from trainflow.trainer.resolve import check_class_path
    from trainflow.tasks.model_package import MODEL_CODE, requirements
    from trainflow.tasks.values import Selected, TrainOutcome
    from trainflow.trainer.serving.servable import checkpoint_families
    from trainflow.run.tracking import ensure_experiment, tracking

    cfg, ds, table, paths = _members(tmp_path)
    outcomes = {f: TrainOutcome(f"r-{f}", f, "", [], []) for f in paths}
    selections = {f: Selected(path=p, epoch=1, metrics={"val_loss": 0.1}, skipped=[]) for f, p in paths.items()}
    built = ensemble(cfg, ds, outcomes, selections, "r", "fp:1")
    weights = {m["family"]: m["weight"] for m in built.record["members"]}
    assert weights["mlp"] > 0 and weights["xgboost"] > 0 and weights["lightgbm"] == 0
    # the member greedy selection dropped says why, in the summary's record and its printed line
    why = {m["family"]: m.get("left_out") for m in built.record["members"]}
    assert why["mlp"] is None and why["xgboost"] is None and "weight 0" in why["lightgbm"]
    from trainflow.flows.cli import format_summary

    assert "lightgbm   not in the ensemble: greedy selection" in format_summary({"ensemble": built.record})
    assert sum(weights.values()) == pytest.approx(1.0)
    assert built.outcome.family == "ensemble" and built.outcome.run_name == "r-ensemble"
    assert built.selected.metrics["val_loss"] == built.record["cross_fitted"]["val_loss"]
    # the cross-fitted score is not better than the score of weights fitted on the rows scored
    assert built.record["cross_fitted"]["val_loss"] >= built.record["in_sample"]["val_loss"] - 1e-9
    # served: the weighted mean of its members' predictions, through the ensemble's one preprocessor
    served = load_servable(built.selected.path)
    assert served.family == "ensemble" and checkpoint_families(built.selected.path) == ["mlp", "xgboost"]
    x = served.preprocessor.transform_features(table)
    members = [load_servable(paths[f]).predict(x) for f in ("mlp", "xgboost")]
    np.testing.assert_allclose(
        served.predict(x), combine("regression", members, [weights["mlp"], weights["xgboost"]]), rtol=1e-5, atol=1e-6
    )
    assert not (
        tmp_path
        / "runs"
        / "r-ensemble"
        / (built.selected.path.rsplit("/", 1)[-1])
        / "members"
        / "mlp"
        / "train_state.pt"
    ).exists()
    reqs = requirements(checkpoint_families(built.selected.path))
    assert any(r.startswith("xgboost-cpu==") for r in reqs) and any(r.startswith("torch==") for r in reqs)
    assert not [r for r in reqs if "+" in r]  # public versions only: "torch==2.13.0", never the local "+cpu" build
    # a rerun over the same best checkpoints (a resumed run) finds the ensemble it wrote, unchanged
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").rglob("*")}
    again = ensemble(cfg, ds, outcomes, selections, "r", "fp:1")
    assert again.selected.uri == built.selected.uri  # (each run checks and serves its own private copy)
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").rglob("*")} == before
    # registered as the pyfunc model every family is: MLflow serves the same predictions
    with tracking(cfg.mlflow.tracking_uri):
        with mlflow.start_run(experiment_id=ensure_experiment(cfg.mlflow.tracking_uri, "ens")):
            info = mlflow.pyfunc.log_model(
                name="model",
                python_model=MODEL_CODE,
                artifacts={"checkpoint": built.selected.path},
                pip_requirements=reqs,
                registered_model_name="ens",
            )
        got = mlflow.pyfunc.load_model(info.model_uri).predict(table.drop_columns(["y"]).to_pandas())
    expected = served.preprocessor.decode_predictions(served.predict(x), None)["prediction"]
    np.testing.assert_allclose(got["prediction"].to_numpy(), expected, rtol=1e-5)

    # read strictly: a member that names a module class the config does not allow is refused before any import
    planted = tmp_path / "planted"
    shutil.copytree(built.selected.path, planted)
    member_cfg = planted / "members" / "mlp" / "config.json"
    raw = json.loads(member_cfg.read_text())
    raw["model"].update(type="torch", class_path="evil.module:Payload")
    member_cfg.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="evil.module:Payload"):
        check_class_path(str(planted), set(), "planted")
    with pytest.raises(ValueError, match="model.type is not 'mlp'"):
        load_servable(planted)
    # ensemble.json naming a folder outside members/, or weights that are not a distribution
    for members in (
        [{"family": "../../elsewhere", "weight": 1.0}],
        [{"family": "mlp", "weight": 1.5}, {"family": "xgboost", "weight": -0.5}],
        [{"family": "mlp", "weight": 0.5}, {"family": "mlp", "weight": 0.5}],
    ):
        (planted / "ensemble.json").write_text(json.dumps({"members": members}))
        with pytest.raises(ValueError, match="ensemble.json"):
            load_servable(planted)


def test_a_killed_writers_staging_folder_is_removed_by_the_next_writer_and_a_living_ones_kept(tmp_path):
    """A checkpoint bundle (an ensemble, bagged folds) is written in a staging folder named for its writer, then
    renamed: the next writer of the same bundle removes what a dead process on this host left, nothing else."""
    import os
    import socket
    import subprocess

    from trainflow.run.storage import staging_folder

    gone = subprocess.Popen(["true"])
    gone.wait()
    host = socket.gethostname()
    dead = tmp_path / f".ensemble_ab.tmp-{host}-{gone.pid}-0123abcd"
    living = tmp_path / f".ensemble_ab.tmp-{host}-{os.getppid()}-0123abcd"
    elsewhere = tmp_path / f".ensemble_ab.tmp-another-host-{gone.pid}-0123abcd"  # its process may be alive there
    other_bundle = tmp_path / f".ensemble_cd.tmp-{host}-{gone.pid}-0123abcd"
    not_ours = tmp_path / ".ensemble_ab.tmp-notes"
    for folder in (dead, living, elsewhere, other_bundle, not_ours):
        folder.mkdir()
        (folder / "weights.pt").write_bytes(b"half a file")
    mine = staging_folder(tmp_path, "ensemble_ab")
    assert not dead.exists() and all(f.exists() for f in (living, elsewhere, other_bundle, not_ours))
    assert (
        mine.parent == tmp_path
        and mine.name.startswith(f".ensemble_ab.tmp-{host}-{os.getpid()}-")
        and not mine.exists()
    )


def test_an_ensemble_in_remote_storage_is_uploaded_whole_and_found_again(tmp_path, s3_endpoint):
    from trainflow.run.storage import list_dir
    from trainflow.tasks.ensemble import ensemble
    from trainflow.tasks.values import Selected, TrainOutcome

    cfg, ds, table, paths = _members(tmp_path)
    cfg = cfg.model_copy(update={"storage_path": f"s3://{BUCKET}/ensembles"})
    outcomes = {f: TrainOutcome(f"r-{f}", f, "", [], []) for f in paths}
    selections = {f: Selected(path=p, epoch=1, metrics={"val_loss": 0.1}, skipped=[]) for f, p in paths.items()}
    built = ensemble(cfg, ds, outcomes, selections, "r", "fp:1")
    uri = built.selected.uri
    assert uri.startswith(f"s3://{BUCKET}/ensembles/r-ensemble/ensemble_")
    assert {name for name, _ in list_dir(uri)} == {
        "members",
        "ensemble.json",
        "metrics.json",
        "preprocessor.json",
        "config.json",
        "lineage.json",
    }
    x = load_servable(built.selected.path).preprocessor.transform_features(table)
    # a rerun finds the uploaded ensemble (ensemble.json, written last, marks it whole) and reads it back
    again = ensemble(cfg, ds, outcomes, selections, "r", "fp:1")
    assert again.selected.uri == uri and again.selected.path != built.selected.path
    np.testing.assert_array_equal(
        load_servable(again.selected.path).predict(x), load_servable(built.selected.path).predict(x)
    )
