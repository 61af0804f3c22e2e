"""Extremely randomized trees (model.type extra_trees): scikit-learn's ExtraTreesClassifier / ExtraTreesRegressor, as
AutoGluon's XT runs them (300 trees of at most 15,000 leaves, split thresholds drawn at random): cheap, and unlike the
boosters, so the ensemble may gain from it.

One Ray Train worker that holds the CPUs of the worker group (n_jobs), as CatBoost runs: scikit-learn's forests do not
train data-parallel. Trees grow in rounds (ROUNDS, warm_start); between rounds the fit reports progress and keeps the
run's deadline (a forest cut short is a smaller forest, still a model). Missing values go to the side scikit-learn
learnt for them. The fitted forest is stored as data: each tree's node table and leaf values (scikit-learn's own tree
state, the arrays its pickling carries) in one .npz, never a pickle, and served by rebuilding scikit-learn's trees from
them. Resume: a fit that reported its model is finished (a restarted worker returns at once); a fit killed before it
grows its forest again.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from trainflow.trainer.families.base import (
    Family,
    Params,
    describe_booster,
    library_key,
    one_process_trainer,
    outputs_from,
    whole_data_config,
)

if TYPE_CHECKING:
    from trainflow.config import Config
    from trainflow.preprocessors.tabular import TabularPreprocessor

NAME = "extra_trees"
FOREST = "forest.npz"  # every tree's node table and values (numpy arrays, loaded with allow_pickle=False)
ROUNDS = 10  # the forest grows in this many rounds: a progress report and a deadline check between them
LOSS_ROWS = 20_000  # the training rows whose loss each round records (a forest nearly fits the rows it grew on)


class ExtraTreesParams(Params):
    """ExtraTrees' keys (model.params.extra_trees)."""

    n_estimators: int = Field(300, description="extra_trees: the trees in the forest (AutoGluon's XT: 300)", ge=1)
    max_leaf_nodes: int | None = Field(
        15000, description="extra_trees: the most leaves a tree grows (AutoGluon's XT: 15,000); `null`: unbounded", ge=2
    )
    min_samples_leaf: int | None = library_key(ge=1)
    max_features: float | Literal["sqrt", "log2"] | None = library_key()


def _estimator(task: str, params: dict[str, Any], seed: int, threads: int):
    from sklearn.ensemble import ExtraTreesClassifier, ExtraTreesRegressor

    kind = ExtraTreesClassifier if task == "classification" else ExtraTreesRegressor
    return kind(n_jobs=threads, random_state=seed, warm_start=True, **params)


def save_forest(model, directory: Path) -> None:
    """Each tree's state (scikit-learn's Tree.__getstate__: depth, node table, values) as arrays, and which classes
    the forest saw."""
    arrays: dict[str, np.ndarray] = {"n_features": np.array(model.n_features_in_)}
    if hasattr(model, "classes_"):
        arrays["classes"] = np.asarray(model.classes_, dtype=np.int64)
    for i, tree in enumerate(model.estimators_):
        state = tree.tree_.__getstate__()
        arrays[f"depth_{i}"] = np.array(state["max_depth"])
        arrays[f"nodes_{i}"] = state["nodes"]
        arrays[f"values_{i}"] = state["values"]
    np.savez_compressed(directory / FOREST, **arrays)


class ExtraTreesPredictor:
    """The stored forest rebuilt as scikit-learn trees; a prediction is their mean, as the forest's own."""

    def __init__(self, directory: Path, prep: TabularPreprocessor, config: dict[str, Any], device: str = "cpu"):
        from sklearn.tree._tree import Tree

        self.prep = prep
        with np.load(Path(directory) / FOREST, allow_pickle=False) as stored:
            n_features = int(stored["n_features"])
            self.classes = stored["classes"] if "classes" in stored else None
            width = np.array([len(self.classes) if self.classes is not None else 1], dtype=np.intp)
            self.trees = []
            for i in range(sum(1 for k in stored.files if k.startswith("nodes_"))):
                tree = Tree(n_features, width, 1)
                nodes = stored[f"nodes_{i}"]
                values = stored[f"values_{i}"]
                tree.__setstate__(
                    {"max_depth": int(stored[f"depth_{i}"]), "node_count": len(nodes), "nodes": nodes, "values": values}
                )
                self.trees.append(tree)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self.classes is None:
            pred = np.mean([tree.predict(x)[:, 0] for tree in self.trees], axis=0)
            return outputs_from(self.prep.task, self.prep.num_outputs, pred)
        seen = np.zeros((len(x), len(self.classes)))
        for tree in self.trees:
            votes = tree.predict(x)
            seen += votes / np.maximum(votes.sum(axis=1, keepdims=True), 1e-12)
        proba = np.zeros((len(x), self.prep.num_outputs))
        proba[:, self.classes] = seen / len(self.trees)  # a class no training row had keeps probability 0
        return outputs_from(self.prep.task, self.prep.num_outputs, proba)

    def native_importance(self) -> np.ndarray:
        """The mean impurity decrease per packed feature, as the forest's feature_importances_."""
        return np.mean([tree.compute_feature_importances(normalize=True) for tree in self.trees], axis=0)


def _budget(config: Config, train_rows: int, num_workers: int):
    """Its rounds of trees (the steps its history and reports count)."""
    from trainflow.trainer.budget import Budget

    return Budget("tree round", ROUNDS, None)


def _outputs(model, prep: TabularPreprocessor, x: np.ndarray) -> np.ndarray:
    """The fitted forest's model outputs (a class no training row had: probability 0)."""
    if prep.task == "regression":
        return outputs_from(prep.task, prep.num_outputs, model.predict(x))
    proba = np.zeros((len(x), prep.num_outputs))
    proba[:, np.asarray(model.classes_, dtype=np.int64)] = model.predict_proba(x)
    return outputs_from(prep.task, prep.num_outputs, proba)


def train_fn(loop_config: dict[str, Any]) -> None:
    """The worker's fit: grow the forest in rounds on the training rows (each round's validation loss, and the
    training loss on up to LOSS_ROWS of them, in the history), report the forest as the run's one checkpoint."""
    import time

    import ray.train

    from trainflow.trainer import session

    from trainflow.preprocessors.tabular import TabularPreprocessor
    from trainflow.trainer.serving.checkpoint import write_common
    from trainflow.trainer.deadline import TIME_LIMITED
    from trainflow.trainer.families._trees import shard_arrays
    from trainflow.trainer.metrics import compute_metrics
    from trainflow.trainer.reporting import record_start
    from trainflow.trainer.steps import Steps
    from trainflow.trainer.watchdog import heartbeat

    cfg: Config = loop_config["config"]
    prep = TabularPreprocessor.from_dict(loop_config["preprocessor"])
    params = ExtraTreesParams(**cfg.model.params.for_family(NAME)).model_dump(exclude_none=True)
    total = params.pop("n_estimators")
    if session.get_checkpoint() is not None:  # the forest was grown and reported: nothing left
        record_start(loop_config, 0, ROUNDS, True)
        return
    record_start(loop_config, 0, 0, False)
    threads = session.worker_cpus()
    x, y = shard_arrays(session.dataset_shard("train"))
    x_val, y_val = shard_arrays(session.dataset_shard("val"))
    y_fit = y.astype(np.int64) if prep.task == "classification" else y.astype(np.float64)
    print(f"trainflow budget: {total} trees in {ROUNDS} rounds over {len(y)} training rows, {threads} thread(s)")
    model = _estimator(prep.task, params, cfg.split.seed, threads)
    history: list[dict[str, float]] = []
    steps = Steps(loop_config, "tree round", 0, ROUNDS, history)  # progress reports; the forest's one at the end
    seen = slice(0, min(len(y), LOSS_ROWS))
    work = Path(tempfile.mkdtemp(prefix="trainflow-extra-trees-"))
    try:
        for rnd in range(ROUNDS):
            heartbeat(f"growing trees, round {rnd}")
            began = time.perf_counter()
            model.set_params(n_estimators=max(1, round(total * (rnd + 1) / ROUNDS)))
            model.fit(x, y_fit)
            val = compute_metrics(prep.task, _outputs(model, prep, x_val), y_val.astype(np.float32), prep)
            fit = compute_metrics(prep.task, _outputs(model, prep, x[seen]), y[seen].astype(np.float32), prep)
            round_s = time.perf_counter() - began
            row = {"epoch": rnd, "train_loss": fit["val_loss"], "val_loss": val["val_loss"], "epoch_time_s": round_s}
            if steps.after(rnd, row, next_step_s=round_s):
                break
        limited = steps.limited_at
        predictor = _fitted(model, prep, work)  # the figures come from the forest as it serves
        metrics: dict[str, Any] = {
            "epoch": len(history) - 1,
            **compute_metrics(prep.task, predictor(x_val), y_val.astype(np.float32), prep),
            "train_loss": history[-1]["train_loss"],
            **({TIME_LIMITED: limited} if limited is not None else {}),
        }
        out = work / "forest"
        (out / "train_state.json").write_text(json.dumps({"family": NAME, "trees": len(model.estimators_)}))
        write_common(
            out,
            len(history) - 1,
            metrics,
            history,
            loop_config["preprocessor"],
            cfg.to_dict(),
            loop_config.get("lineage"),
        )
        session.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(str(out)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _fitted(model, prep: TabularPreprocessor, work: Path) -> ExtraTreesPredictor:
    """The forest stored as it will serve, and its predictor (the validation figures come from what serves)."""
    folder = work / "forest"
    folder.mkdir()
    save_forest(model, folder)
    return ExtraTreesPredictor(folder, prep, {})


FAMILY = Family(
    NAME,
    one_process_trainer,
    train_fn,
    whole_data_config,
    _budget,
    ExtraTreesPredictor,
    serving_packages=("scikit-learn",),
    describe=describe_booster(NAME),
    calibration="platt",
    class_weights=False,
    one_process=True,
    search_space={
        "model.params.extra_trees.max_features": {"choice": ["sqrt", 0.5, 1.0]},
        "model.params.extra_trees.min_samples_leaf": {"choice": [1, 2, 5, 10]},
    },
    params=ExtraTreesParams,
    listed=6,
)
