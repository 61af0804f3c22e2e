"""Model families: gradient-boosted trees (XGBoost, LightGBM) through Ray Train on in-memory and external-memory
matrices, and a killed booster worker resuming at a later round. Several families in one run replacing the
champion: tests/test_e2e_retrain.py."""

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import ray.train

from tests.faults import fit_here, pyfunc_serves_as_the_checkpoint, small_run, wait_registered
from trainflow.trainer.serving.checkpoint import read_metrics
from trainflow.trainer.serving.servable import load_servable
from trainflow.trainer.recovery import read_events, recoveries
from trainflow.trainer.runner import build_trainer, run_dir
from trainflow.config import DataSection, config_from_dict, trial_config
from trainflow.preprocessors.fit import fit_preprocessor
from trainflow.tables.files import table_spec
from trainflow.errors import ConfigError


def _cfg(model):
    return config_from_dict({"data": {"path": "x.parquet", "label": "y"}, "task": "classification", "model": model})


def test_model_type_and_params_are_validated_with_their_dotted_names():
    cfg = _cfg({"type": ["mlp", "lightgbm"], "params": {"num_leaves": 15, "max_depth": 4}})
    assert cfg.model.families == ["mlp", "lightgbm"]
    assert cfg.model.params.for_family("lightgbm")["num_leaves"] == 15
    assert "num_leaves" not in cfg.model.params.for_family("xgboost")
    assert cfg.model.for_family("lightgbm")["type"] == "lightgbm"
    for model, message in [
        ({"type": "xgboost", "params": {"num_leaves": 15}}, "model.params.num_leaves: applies to lightgbm"),
        ({"type": "xgboost", "params": {"max_dept": 3}}, "model.params.max_dept: unknown key"),
        ({"type": "lightgbm", "params": {"learning_rate": -1}}, "model.params.learning_rate"),
        (
            {"type": "mlp", "params": {"max_depth": 3}},
            "model.params.max_depth: applies to xgboost, lightgbm and catboost",
        ),
        ({"type": "catboost", "params": {"num_leaves": 15}}, "model.params.num_leaves: applies to lightgbm"),
        ({"type": ["xgboost", "xgboost"]}, "names a family more than once"),
        (
            {"type": "xgboost", "params": {"external_memory": "always", "tree_method": "exact"}},
            "needs tree_method 'hist'",
        ),
        ({"type": "lightgbm", "params": {"external_memory": "always"}}, "external_memory: applies to xgboost"),
        ({"type": "catbost"}, "model.type"),
    ]:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
            _cfg(model)


@pytest.mark.usefixtures("ray_local")
def test_external_memory_matrices_grow_the_same_trees_and_are_chosen_when_memory_is_short(tmp_path, monkeypatch):
    import xgboost as xgb

    from trainflow.preprocessors.tabular import FEATURES, LABEL
    from trainflow.trainer.families import xgboost_extmem as extmem
    from trainflow.trainer.families._trees import shard_arrays
    from trainflow.errors import DataError
    from trainflow.trainer.memory import check_booster_matrix

    rng = np.random.default_rng(3)
    x = rng.normal(size=(6000, 5)).astype(np.float32)
    x[:, 4] = rng.integers(0, 6, size=6000)  # a categorical code
    y = ((x[:, 0] - x[:, 1] ** 2 + (x[:, 4] == 2) + rng.normal(scale=0.3, size=6000)) > 0).astype(np.int64)

    def dataset(lo, hi):
        return (
            ray.data.range(hi - lo, override_num_blocks=6)
            .map_batches(lambda b: {FEATURES: x[lo + b["id"]], LABEL: y[lo + b["id"]]})
            .materialize()
        )

    train, val = dataset(0, 5000), dataset(5000, 6000)
    types = ["q"] * 4 + ["c"]
    params = {
        "tree_method": "hist",
        "objective": "binary:logistic",
        "eval_metric": "logloss",
        "nthread": 2,
        "seed": 0,
        "colsample_bynode": 0.5,
    }
    monkeypatch.setattr(extmem, "PAGE_BYTES", 20_000)  # about 1,000 rows a page: several pages per matrix
    dtrain, dval, labels = extmem.extmem_matrices(train.iterator(), val.iterator(), types, tmp_path, params)
    assert not list(tmp_path.glob("*/x-*.npy"))  # the spooled pages are gone once XGBoost has its cache
    external = xgb.train(params, dtrain, 20)
    (xt, yt), (xv, yv) = shard_arrays(train.iterator()), shard_arrays(val.iterator())
    in_memory = xgb.train(params, xgb.DMatrix(xt, yt, feature_types=types, enable_categorical=True), 20)
    np.testing.assert_array_equal(labels, yv)  # in the validation matrix's row order
    assert external.get_dump() == in_memory.get_dump()
    np.testing.assert_allclose(
        external.predict(dval),
        in_memory.predict(xgb.DMatrix(xv, feature_types=types, enable_categorical=True)),
        rtol=1e-6,
    )

    # the choice: in memory while a worker's matrices fit its share; external memory (auto) or a clear error past it
    from tests.test_preprocess import _wide_table

    table = _wide_table()
    spec = table_spec(table.schema, DataSection(path="mem", label="y", id_column="id"), "classification", "mem")
    prep = fit_preprocessor(ray.data.from_arrow(table), spec, "classification")
    args = (prep, 10**7, 10**6, 2)
    assert not check_booster_matrix(*args, 64 * 2**30, "t.parquet", "auto")["external_memory"]
    assert check_booster_matrix(*args, 2**30, "t.parquet", "auto")["external_memory"]
    assert check_booster_matrix(*args, 64 * 2**30, "t.parquet", "always")["external_memory"]
    with pytest.raises(DataError, match=r"t.parquet: .*model.params.external_memory: auto \(now never\)"):
        check_booster_matrix(*args, 2**30, "t.parquet", "never")
    with pytest.raises(DataError, match="t.parquet: .*model.type xgboost, whose external-memory matrix"):
        check_booster_matrix(*args, 2**30, "t.parquet", None)

    # model.type auto is sized to the table and the cluster: LightGBM, whose matrices would not fit, is left out
    # with the reason (XGBoost goes external-memory, the network streams); a family the config names fails instead
    from trainflow.tasks.preprocess import size_families

    base = {
        "data": {"path": "t.parquet", "label": "y", "id_column": "id"},
        "task": "classification",
        "scaling": {"num_workers": 2},
    }
    budgets, _, left_out = size_families(config_from_dict(base), prep, 10**7, 10**6, 2**30, "t.parquet")
    assert list(budgets) == ["mlp", "xgboost"] and budgets["xgboost"].external_memory
    assert list(left_out) == ["lightgbm", "catboost"]  # CatBoost's one process would hold every training row
    assert "model.type xgboost, whose external-memory matrix" in left_out["lightgbm"]
    secret_uri = "s3://AKIAUSER:pa55-s3cret@bucket/t.parquet"  # a credential in data.path is never echoed
    assert (
        "pa55-s3cret" not in size_families(config_from_dict(base), prep, 10**7, 10**6, 2**30, secret_uri)[2]["lightgbm"]
    )
    assert list(size_families(config_from_dict(base), prep, 10**5, 10**4, 64 * 2**30, "t.parquet")[0]) == [
        "mlp",
        "xgboost",
        "lightgbm",
        "catboost",
    ]
    with pytest.raises(DataError, match="t.parquet: a boosted-trees worker holds"):
        size_families(
            config_from_dict({**base, "model": {"type": ["mlp", "lightgbm"]}}), prep, 10**7, 10**6, 2**30, "t.parquet"
        )


def _round_trip(family: str):
    """A train function whose first attempt boosts 12 rounds, then (rank 1) is SIGKILLed once that
    checkpoint is registered; the next attempt resumes with the whole budget."""

    def train_fn(loop_config):
        from trainflow.trainer.families import REGISTRY

        rank = ray.train.get_context().get_world_rank()
        marker = Path(loop_config["run_dir"]).parent / f"attempt-{rank}"
        if marker.exists():
            return REGISTRY[family].train_fn(loop_config)
        marker.touch()
        first = trial_config(loop_config["config"].to_dict(), {"model.params.num_boost_round": 12})
        REGISTRY[family].train_fn({**loop_config, "config": first})
        if rank == 1:
            wait_registered(loop_config["run_dir"], 11)
            os.kill(os.getpid(), signal.SIGKILL)
        ray.train.report({"epoch": 11, "waiting": 1.0})  # blocks until the group is torn down

    return train_fn


@pytest.mark.e2e
@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("family", ["xgboost"])  # LightGBM's resume passed the same test (22 s); not kept for time
def test_a_killed_booster_worker_resumes_at_a_later_round(tmp_path, family):
    """On XGBoost's external-memory matrices (the families flow test trains the in-memory ones)."""
    cfg, prep, train, val = small_run(tmp_path, hang_timeout_s=60.0)
    cfg = trial_config(
        cfg.to_dict(),
        {
            "model.type": family,
            "model.params.num_boost_round": 30,
            "model.params.early_stopping_rounds": "off",
            "checkpoint.min_interval_s": 0.0,
        },
    )
    external = family == "xgboost"
    result = build_trainer(
        cfg, prep, train, val, "boost-kill", train_fn=_round_trip(family), external_memory=external
    ).fit()
    with result.checkpoint.as_directory() as d:
        history = read_metrics(d)["history"]
        served = load_servable(d)
    # every round ran exactly once: the second attempt started at round 12, not 0
    assert [h["epoch"] for h in history] == list(range(30))
    events = read_events(run_dir(cfg, "boost-kill"))
    assert [e["epoch"] for e in events if e["event"] == "resume"] == [12]
    starts = [e for e in events if e["event"] == "worker_start"]
    assert len(starts) == 4 and all(e["external_memory"] is external for e in starts)
    (killed,) = recoveries(events)
    assert killed["resumed_from_epoch"] == 12 and ("died" in killed["error"] or "dead" in killed["error"])
    booster = served.predict.booster
    assert (booster.num_boosted_rounds() if family == "xgboost" else booster.current_iteration()) == 30
    assert history[-1]["val_loss"] < history[0]["val_loss"]
    # the trees learned y = 3*x1 - 2*x2^2 + offset (the metrics are on the label's own scale)
    assert served.family == family and result.metrics["val_r2"] > 0.8


# several families in one run replacing a champion of another family: the second half of
# tests/test_e2e_retrain.py's classification test (its weak network is the champion)


def test_a_sweep_can_search_family_keys_and_the_family_itself():
    base = {"data": {"path": "x.parquet", "label": "y"}, "task": "classification", "tune": {"num_samples": 2}}
    cfg = config_from_dict(
        {
            **base,
            "model": {"type": "xgboost"},
            "tune": {"search_space": {"model.params.max_depth": {"randint": [3, 10]}}},
        }
    )
    assert cfg.tune.search_space["model.params.max_depth"] == {"randint": [3, 10]}
    cfg = config_from_dict({**base, "tune": {"search_space": {"model.type": {"choice": ["mlp", "lightgbm"]}}}})
    from trainflow.config import trial_config

    assert trial_config(cfg.to_dict(), {"model.type": "lightgbm"}).model.families == ["lightgbm"]
    with pytest.raises(ConfigError, match="model.params.num_leaves: applies to lightgbm"):
        config_from_dict(
            {
                **base,
                "model": {"type": "xgboost"},
                "tune": {"search_space": {"model.params.num_leaves": {"choice": [15, 31]}}},
            }
        )
    listed = config_from_dict(
        {
            **base,
            "model": {"type": ["mlp", "xgboost"]},
            "tune": {"search_space": {"model.params.mlp.learning_rate": {"choice": [0.001]}}},
        }
    )
    from trainflow.trainer.tune import sweep_space

    # a sweep over a list of families searches the family too (one family per trial)
    assert sweep_space(listed)["model.type"] == {"choice": ["mlp", "xgboost"]}


def _catboost_killed_once():
    """CatBoost's worker: the first attempt snapshots every second, takes at least 5 ms a round (a fast machine's whole
    fit fits between two snapshots otherwise) and SIGKILLs its own process once a stored snapshot holds 150 rounds
    (right after storing it); the next attempt continues from that snapshot."""

    def train_fn(loop_config):
        import json
        import time

        from trainflow.run.storage import list_dir, read_text
        from trainflow.trainer.families import catboost_family as catboost_fit

        marker = Path(loop_config["run_dir"]).parent / "catboost-attempt"
        if marker.exists():
            return catboost_fit.train_fn(loop_config)
        marker.touch()
        catboost_fit.SNAPSHOT_S = 1

        copy = catboost_fit.Progress.copy_snapshot

        def copy_then_die(progress):  # killed right after storing a snapshot of 150 rounds or more, however fast
            copy(progress)
            stored = [n for n, _ in list_dir(loop_config["run_dir"]) if n.endswith(".snapshot.json")]
            if stored and len(json.loads(read_text(f"{loop_config['run_dir']}/{stored[0]}"))) >= 150:
                os.kill(os.getpid(), signal.SIGKILL)

        catboost_fit.Progress.copy_snapshot = copy_then_die
        after = catboost_fit.Progress.after_iteration

        def slowed(progress, info):  # 5 ms a round: CatBoost writes a snapshot each second however fast the machine
            time.sleep(0.005)
            return after(progress, info)

        catboost_fit.Progress.after_iteration = slowed
        catboost_fit.train_fn(loop_config)
        raise AssertionError("the fit ended before a snapshot of 150 rounds was stored")

    return train_fn


@pytest.mark.e2e
@pytest.mark.usefixtures("ray_local")
def test_catboost_is_one_worker_with_the_group_cpus_and_a_killed_fit_continues_from_its_snapshot(tmp_path):
    cfg, prep, train, val = small_run(tmp_path, hang_timeout_s=60.0)
    # its rounds and step from its own block, over shared values that would give 10 trees (the block reaches the worker)
    cfg = trial_config(
        cfg.to_dict(),
        {
            "model.type": "catboost",
            "model.params.num_boost_round": 10,
            "model.params.catboost.num_boost_round": 1500,
            "model.params.early_stopping_rounds": "off",
            "model.params.catboost.learning_rate": 0.02,
        },
    )
    from trainflow.trainer.families import REGISTRY

    scaling = REGISTRY["catboost"].worker_scaling(cfg.scaling)
    assert (scaling.num_workers, scaling.resources_per_worker["CPU"]) == (1, 2.0)  # the group's 2 CPUs, one process
    result = build_trainer(cfg, prep, train, val, "cb-kill", train_fn=_catboost_killed_once()).fit()
    with result.checkpoint.as_directory() as d:
        history = read_metrics(d)["history"]
        served = load_servable(d)
    # every round once: the second attempt continued the stored snapshot, it did not start again
    assert [h["epoch"] for h in history] == list(range(1500))
    starts = [e for e in read_events(run_dir(cfg, "cb-kill")) if e["event"] == "worker_start"]
    assert [e["from_epoch"] for e in starts][0] == 0 and starts[1]["from_epoch"] >= 150
    (killed,) = recoveries(read_events(run_dir(cfg, "cb-kill")))
    assert "died" in killed["error"] or "dead" in killed["error"]
    assert served.family == "catboost" and served.predict.model.tree_count_ == 1500
    assert result.metrics["val_r2"] > 0.8 and served.predict.native_importance().shape == (prep.num_features,)

    # train.warm_start: a fit that continues this model adds its trees after the source's 1,500 (its file shipped as
    # tasks/warm.py ships it), records the source's rounds, and serves the whole model
    from trainflow.trainer.serving.checkpoint import read_warm

    with result.checkpoint.as_directory() as d:
        files = {f.name: f.read_bytes() for f in Path(d).iterdir() if f.is_file()}
        source = json.loads((Path(d) / "train_state.json").read_text())
    warm = {"from": "models:/cb/1", "version": "1", "family": "catboost", "offset": source["epoch"] + 1, "files": files}
    more = trial_config(cfg.to_dict(), {"model.params.catboost.num_boost_round": 30})
    again = fit_here(more, prep, train, val, "cb-warm", warm_start=warm)
    with again.checkpoint.as_directory() as d:
        state = json.loads((Path(d) / "train_state.json").read_text())
        continued = load_servable(d).predict.model
        assert read_warm(d) == {"from": "models:/cb/1", "version": "1", "offset": 1500}
    assert state["warm_offset"] == 1500 and continued.tree_count_ == 1500 + state["epoch"] + 1
    assert np.isfinite(again.metrics["val_loss"]) and again.metrics["val_r2"] > 0.8


def test_extra_trees_trains_in_one_process_serves_from_arrays_through_pyfunc_and_a_finished_fit_returns(tmp_path):
    """The family that landed as one file (trainer/families/extra_trees_family.py): its block reaches the worker, one
    worker holds the group's CPUs, the forest is stored as arrays (no pickle) and serves the figures it reported, the
    registered pyfunc model predicts the same, and a rerun of the finished run name trains nothing."""
    import pyarrow as pa

    from trainflow.preprocessors.tabular import FEATURES, LABEL
    from trainflow.trainer.metrics import compute_metrics

    cfg, prep, train, val = small_run(tmp_path)
    cfg = trial_config(
        cfg.to_dict(),
        {
            "model.type": "extra_trees",
            "model.params.extra_trees.n_estimators": 40,
            "model.params.extra_trees.min_samples_leaf": 2,
            "mlflow.tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        },
    )
    from trainflow.trainer.families import REGISTRY

    scaling = REGISTRY["extra_trees"].worker_scaling(cfg.scaling)
    assert (scaling.num_workers, scaling.resources_per_worker["CPU"]) == (1, 2.0)
    result = fit_here(cfg, prep, train, val, "xt")  # in this process, as a small table's fit is
    with result.checkpoint.as_directory() as d:
        history = read_metrics(d)["history"]
        served = load_servable(d)
        stored = sorted(p.name for p in Path(d).iterdir())
    assert [h["epoch"] for h in history] == list(range(10)) and history[-1]["val_loss"] < history[0]["val_loss"]
    assert "forest.npz" in stored and not [s for s in stored if s.endswith((".pkl", ".pickle", ".joblib"))]
    assert served.family == "extra_trees" and len(served.predict.trees) == 40
    assert served.predict.native_importance().shape == (prep.num_features,)
    # the reported figures are the served forest's on the validation rows
    packed = pa.concat_tables(ray.get(val.to_arrow_refs()))
    x, y = np.stack(packed[FEATURES].to_numpy(zero_copy_only=False)), packed[LABEL].to_numpy()
    again = compute_metrics("regression", served.predict(x.astype(np.float32)), y.astype(np.float32), prep)
    assert again["val_r2"] == pytest.approx(result.metrics["val_r2"], rel=1e-6) and again["val_r2"] > 0.5
    # finished: a rerun under the same name returns at once with the same forest
    starts = len([e for e in read_events(run_dir(cfg, "xt")) if e["event"] == "worker_start"])
    rerun = fit_here(cfg, prep, train, val, "xt")
    assert rerun.checkpoint.path == result.checkpoint.path
    events = [e for e in read_events(run_dir(cfg, "xt")) if e["event"] == "worker_start"]
    assert len(events) == starts + 1 and events[-1]["from_epoch"] == 10
    # registered as every family is: MLflow's pyfunc model serves the same predictions (scikit-learn pinned)
    reqs = pyfunc_serves_as_the_checkpoint(result.checkpoint, served, "extra_trees", cfg.mlflow.tracking_uri)
    assert any(r.startswith("scikit-learn==") for r in reqs)


def test_a_catboost_refit_keeps_the_learning_rate_its_chosen_models_picked(tmp_path):
    """train.refit: CatBoost picks its learning rate from the rows and the iterations; its refit on more rows keeps
    the mean of its chosen models' (flows/refit.py), read from their checkpoints, and passes it to the library."""
    from catboost import CatBoostRegressor

    from trainflow.trainer.families import family_named

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(2000, 3)), rng.normal(size=2000)
    folders = []
    for rounds in (100, 300):  # two fold models, each with CatBoost's own choice for its rows and rounds
        folder = tmp_path / f"fold{rounds}"
        folder.mkdir()
        model = CatBoostRegressor(iterations=rounds, verbose=False, thread_count=1, allow_writing_files=False).fit(x, y)
        model.save_model(str(folder / "model.cbm"))
        folders.append(folder)
    picked = [CatBoostRegressor().load_model(str(f / "model.cbm")).get_all_params()["learning_rate"] for f in folders]
    assert picked[0] != picked[1]
    catboost = family_named("catboost")
    assert catboost.refits and family_named("xgboost").refits and not family_named("mlp").refits
    pinned = catboost.refit_params(folders)  # no state files: each model's own
    assert pinned == {"learning_rate": pytest.approx(np.mean(picked))}
    # the state file a fit writes beside its model is read instead of loading the model; one edited to a rate no fit
    # trains at (planted, or cut short) is not trusted: that model's own is read
    (folders[0] / "train_state.json").write_text(json.dumps({"epoch": 99, "learning_rate": 0.2}))
    (folders[1] / "train_state.json").write_text(json.dumps({"epoch": 299, "learning_rate": -1.0}))
    assert catboost.refit_params(folders) == {"learning_rate": pytest.approx(np.mean([0.2, picked[1]]))}
    (folders[0] / "train_state.json").write_text('{"learning_rate": "NaN"')
    assert catboost.refit_params(folders) == pinned
    config = config_from_dict(
        {"data": {"path": "x.parquet", "label": "y"}, "task": "regression", "storage_path": str(tmp_path)}
    )
    # the refit's config (flows/refit.py): rounds fixed, early stopping off, the rate pinned
    refit = catboost.refit_config(config.for_family("catboost"), 37, pinned)
    import pyarrow as pa

    table = pa.table({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "y": y})
    spec = table_spec(table.schema, DataSection(path="mem", label="y"), "regression", "mem")
    prep = fit_preprocessor(table, spec, "regression")
    params = catboost.library_params(prep, refit)
    assert params["iterations"] == 37 and "early_stopping_rounds" not in params
    assert params["learning_rate"] == pytest.approx(np.mean(picked))
