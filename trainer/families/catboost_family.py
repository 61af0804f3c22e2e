"""CatBoost as a trainflow family: one Ray Train worker that holds the CPUs of the whole worker group.

CatBoost has no Ray trainer (ray#26687) and no data-parallel training from Python (catboost#2406): a fit is one
process with thread_count set to its CPUs, as AutoGluon runs it (whose parallelism comes from folds, as trainflow's
cross-fitting does). Text columns the preprocessor embeds reach CatBoost as native categorical features (their
integer codes); early stopping on the validation rows keeps the best iteration (use_best_model).

Resume: CatBoost writes a snapshot of the fit every few seconds; the worker copies it (with the rounds' history) to
the run's folder under a name made of the run's lineage, so a restarted worker, or a rerun of the same run name on
the same data and training config, continues that fit instead of starting again (the snapshot, not init_model
segments: catboost#2784 reports a continuation with categorical features freezing where a model's copy is passed).
The run reports progress (rounds, training and validation loss) every few seconds, and one checkpoint: the model at
its best iteration.

Warm start (train.warm_start): the fit's trees follow the source model's (init_model, its file as tasks/warm.py ships
it, never an in-memory copy), with the source's preprocessing; a resumed snapshot of it passes the same init_model
(CatBoost refuses the snapshot otherwise), and its checkpoint records the source's rounds (warm_offset).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainflow.trainer.families.base import (
    BUDGET_KEYS,
    booster_family,
    TreeParams,
    library_key,
    categorical_positions,
    loss_from_metric,
    one_process_trainer,
    outputs_from,
    whole_data_config,
)

if TYPE_CHECKING:
    from trainflow.config import Config
    from trainflow.preprocessors.tabular import TabularPreprocessor

NAME = "catboost"
CB_MODEL = "model.cbm"  # CatBoost's own binary model format (not a pickle)
SNAPSHOT_S = 5  # how often CatBoost writes its snapshot (and the worker copies a new one to storage)


class CatBoostParams(TreeParams):
    """CatBoost's keys (model.params.catboost): every booster's, three under CatBoost's own names."""

    max_depth: int | None = library_key(named="depth", ge=-1)
    reg_lambda: float | None = library_key(named="l2_leaf_reg", ge=0.0)
    max_bin: int | None = library_key(named="border_count", ge=2)


# its keys CatBoost takes, under CatBoost's names
CATBOOST_NAMES = {
    name: (field.json_schema_extra or {}).get("x-library-name", name)
    for name, field in CatBoostParams.model_fields.items()
    if name not in BUDGET_KEYS
}


def catboost_frame(prep: TabularPreprocessor, x: np.ndarray):
    """Packed features as the frame CatBoost reads: embedded text columns as integer categories, the rest numbers."""
    import pandas as pd

    frame = pd.DataFrame(np.asarray(x, dtype=np.float32), columns=[f"f{i}" for i in range(x.shape[1])])
    for pos in categorical_positions(prep):
        frame[f"f{pos}"] = np.nan_to_num(frame[f"f{pos}"].to_numpy(), nan=0.0).astype(np.int64)
    return frame


def catboost_outputs(model, prep: TabularPreprocessor, x: np.ndarray) -> np.ndarray:
    from catboost import Pool

    pool = Pool(catboost_frame(prep, x), cat_features=categorical_positions(prep) or None)
    kind = "Probability" if prep.task == "classification" else "RawFormulaVal"
    return outputs_from(prep.task, prep.num_outputs, model.predict(pool, prediction_type=kind))


def load_catboost(path: Path):
    from catboost import CatBoost

    model = CatBoost()
    model.load_model(str(path / CB_MODEL), format="cbm")
    return model


class CatBoostPredictor:
    def __init__(self, directory: Path, prep: TabularPreprocessor, config: dict[str, Any], device: str = "cpu"):
        self.model, self.prep = load_catboost(Path(directory)), prep

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return catboost_outputs(self.model, self.prep, x)

    def native_importance(self) -> np.ndarray:
        """CatBoost's prediction-value change per packed feature (its default importance, gain-like)."""
        return np.asarray(self.model.get_feature_importance(), dtype=np.float64)


def library_params(
    prep: TabularPreprocessor, cfg: Config, threads: int = 1, work: Path | None = None
) -> dict[str, Any]:
    """CatBoost's parameters: loss for the task, model.params under CatBoost's names, seed, threads. An unset
    learning rate is left to CatBoost, which picks it from the rows and the iterations (its strength as a default)."""
    from trainflow.trainer.families._trees import boost_budget

    params_cfg, budget = cfg.model.params, boost_budget(cfg.model)
    chosen = {CATBOOST_NAMES[k]: v for k, v in params_cfg.for_family(NAME).items() if k in CATBOOST_NAMES}
    lr_default = type(params_cfg).model_fields["learning_rate"].default
    if "learning_rate" not in params_cfg.model_fields_set or params_cfg.learning_rate == lr_default:
        chosen.pop("learning_rate", None)
    if prep.task == "regression":
        loss = "RMSE"
    elif prep.num_outputs == 2:
        loss = "Logloss"
    else:
        loss = "MultiClass"
    params = {
        "loss_function": loss,
        "eval_metric": loss,
        "iterations": budget.limit,
        "random_seed": cfg.split.seed,
        "thread_count": threads,
        "verbose": False,
        "use_best_model": True,
        **chosen,
    }
    if prep.task == "classification":
        params["class_names"] = list(range(prep.num_outputs))  # every class a column, even one absent from a fold
    if budget.patience:
        params["early_stopping_rounds"] = budget.patience
    if work is not None:
        params["train_dir"] = str(work)
    return params


def refit_params(checkpoints: list[Path]) -> dict[str, Any]:
    """A refit's learning rate: the mean of its chosen models' (train.refit). CatBoost picks its own from the rows
    and the iterations otherwise, and a refit with its own choice scored worse than the fold models it replaces (with
    theirs, better: docs/families.md#refit)."""
    return {"learning_rate": float(np.mean([_learning_rate(path) for path in checkpoints]))}


def _learning_rate(checkpoint: Path) -> float:
    """The learning rate a checkpoint's model trained at: from its state file (written beside the model), else (a
    state file missing, edited or unreadable, or a rate no fit trains at) from the model itself."""
    from trainflow.trainer.families._trees import STATE_JSON

    try:
        rate = float(json.loads((checkpoint / STATE_JSON).read_text())["learning_rate"])
    except (OSError, ValueError, KeyError, TypeError):
        rate = float("nan")
    return (
        rate if math.isfinite(rate) and rate > 0 else float(load_catboost(checkpoint).get_all_params()["learning_rate"])
    )


def snapshot_uri(run_dir: str, lineage: dict[str, str] | None) -> str:
    """The run's snapshot in storage, named by its data and training config (another config never continues it)."""
    from trainflow.run.storage import join

    digest = hashlib.blake2b(json.dumps(lineage or {}, sort_keys=True).encode(), digest_size=8).hexdigest()
    return join(run_dir, f"catboost-{digest}.snapshot")


class Progress:
    """CatBoost's callback on the shared step runner (trainer/steps.py): the history per round, the watchdog's
    heartbeat, progress reports when the runner says (checkpoint.min_interval_s), a copy of each new snapshot in
    storage, and the run's deadline (False stops the fit; CatBoost then keeps its best iteration). CatBoost stops early
    itself: the runner has no stopper, and the model is reported once, at the end."""

    def __init__(
        self,
        task: str,
        history: list[dict[str, float]],
        local: Path,
        remote: str,
        loop_config: dict[str, Any],
        rounds: int,
    ):
        self.task, self.history, self.local, self.remote = task, history, local, remote
        from trainflow.trainer.steps import Steps
        from trainflow.trainer.watchdog import heartbeat

        # the training imports once per fit, not per round (this module also serves, where none of them exists)
        self.heartbeat = heartbeat
        self.steps = Steps(loop_config, "round", len(history), rounds, history)
        self.last_copy = 0.0
        self.copied_mtime = 0.0

    def after_iteration(self, info) -> bool:
        rnd = int(info.iteration) - 1  # CatBoost counts from 1, trainflow's rounds from 0
        self.heartbeat(f"boosting round {rnd}")
        del self.history[rnd:]  # rounds after the snapshot a restarted fit continues from are trained again
        learn, val = info.metrics["learn"], info.metrics["validation"]
        row = {
            "epoch": rnd,
            "train_loss": loss_from_metric(self.task, next(iter(learn.values()))[-1]),
            "val_loss": loss_from_metric(self.task, next(iter(val.values()))[-1]),
            "epoch_time_s": self.steps.step_time(),
        }
        if time.perf_counter() - self.last_copy >= SNAPSHOT_S:
            self.copy_snapshot()
        return not self.steps.after(rnd, row)

    def copy_snapshot(self) -> None:
        """The latest snapshot CatBoost wrote, and the history, to storage (written whole: temp + rename locally)."""
        self.last_copy = time.perf_counter()
        if not self.local.exists() or self.local.stat().st_mtime <= self.copied_mtime:
            return
        from trainflow.run.storage import replace_bytes

        self.copied_mtime = self.local.stat().st_mtime
        replace_bytes(self.remote, self.local.read_bytes())  # the snapshot first: a history never older than it
        replace_bytes(self.remote + ".json", json.dumps(self.history).encode())


def fetch_snapshot(remote: str, local: Path) -> list[dict[str, float]]:
    """The stored snapshot copied to local (CatBoost continues from it) and its history; [] when there is none."""
    from trainflow.run.storage import read_bytes

    try:
        data, history = read_bytes(remote), json.loads(read_bytes(remote + ".json"))
    except (OSError, ValueError):
        return []
    local.write_bytes(data)
    return [h for h in history if isinstance(h, dict)]


def warm_model_bytes(warm: dict[str, Any]) -> bytes:
    """The source model's file a warm start continues (tasks/warm.py ships its checkpoint's files)."""
    data = warm.get("files", {}).get(CB_MODEL)
    if not isinstance(data, bytes):
        raise ValueError(
            f"train.warm_start from {warm.get('from')}: its checkpoint's {CB_MODEL} did not reach the worker (a "
            "file over 256 MiB is not shipped); set train.warm_start: none for a fresh fit"
        )
    return data


def _write_checkpoint(out: Path, model, loop_config: dict[str, Any], best: int, metrics: dict, history: list) -> Path:
    """The fit's checkpoint folder: the model (CatBoost's own format), its state and trainflow's common files."""
    from trainflow.trainer.serving.checkpoint import warm_record, write_common
    from trainflow.trainer.families._trees import STATE_JSON

    cfg, warm = loop_config["config"], loop_config.get("warm_start")
    out.mkdir()
    model.save_model(str(out / CB_MODEL), format="cbm")
    state = {
        "epoch": best,
        "seed": cfg.split.seed,
        "family": NAME,
        "rounds_run": len(history),
        "learning_rate": float(model.get_all_params().get("learning_rate", float("nan"))),
        # a warm start's source rounds: this fit's round r is the model's tree warm_offset + r
        **({"warm_offset": int(warm["offset"])} if warm else {}),
    }
    (out / STATE_JSON).write_text(json.dumps(state))
    lineage = loop_config.get("lineage")
    write_common(
        out, best, metrics, history, loop_config["preprocessor"], cfg.to_dict(), lineage, warm_record(loop_config)
    )
    return out


def train_fn(loop_config: dict[str, Any]) -> None:
    """The worker's loop: continue the stored snapshot (or start; under train.warm_start from the source model's
    trees), boost with early stopping, report the best iteration's model as the run's checkpoint."""
    import ray.train
    from catboost import CatBoost, Pool

    from trainflow.preprocessors.tabular import TabularPreprocessor
    from trainflow.trainer import session
    from trainflow.trainer.deadline import TIME_LIMITED
    from trainflow.trainer.families._trees import boost_budget, shard_arrays
    from trainflow.trainer.metrics import compute_metrics
    from trainflow.trainer.reporting import record_start

    cfg: Config = loop_config["config"]
    prep = TabularPreprocessor.from_dict(loop_config["preprocessor"])
    if session.get_checkpoint() is not None:  # the fit finished and reported its model: nothing left
        record_start(loop_config, 0, boost_budget(cfg.model).limit, True)
        return
    threads = session.worker_cpus()
    work = Path(tempfile.mkdtemp(prefix="trainflow-catboost-"))
    try:
        local, remote = work / "snapshot", snapshot_uri(loop_config["run_dir"], loop_config.get("lineage"))
        history = fetch_snapshot(remote, local)
        record_start(loop_config, 0, len(history), bool(history))
        x, y = shard_arrays(session.dataset_shard("train"))
        x_val, y_val = shard_arrays(session.dataset_shard("val"))
        cats = categorical_positions(prep)
        label = (lambda v: v.astype(np.int64)) if prep.task == "classification" else (lambda v: v.astype(np.float64))
        train_pool = Pool(catboost_frame(prep, x), label=label(y), cat_features=cats or None)
        val_pool = Pool(catboost_frame(prep, x_val), label=label(y_val), cat_features=cats or None)
        params = library_params(prep, cfg, threads, work)
        warm, init_model = loop_config.get("warm_start"), None
        if warm:  # train.warm_start: this fit's trees follow the source model's (a resumed snapshot needs it again)
            init_model = work / "warm.cbm"
            init_model.write_bytes(warm_model_bytes(warm))
        if not history:
            print(
                f"trainflow budget: up to {params['iterations']} boosting round(s) over {len(y)} training rows, "
                f"{threads} thread(s), learning rate {params.get('learning_rate', 'chosen by CatBoost')}"
            )
        progress = Progress(prep.task, history, local, remote, loop_config, params["iterations"])
        model = CatBoost(params)
        model.fit(
            train_pool,
            eval_set=val_pool,
            callbacks=[progress],
            save_snapshot=True,
            snapshot_file=str(local),
            snapshot_interval=SNAPSHOT_S,
            init_model=None if init_model is None else str(init_model),
        )
        best = int(model.get_best_iteration() if model.get_best_iteration() is not None else len(history) - 1)
        metrics: dict[str, Any] = {
            "epoch": best,
            **compute_metrics(prep.task, catboost_outputs(model, prep, x_val), y_val.astype(np.float32), prep),
        }
        metrics["train_loss"] = float(history[min(best, len(history) - 1)]["train_loss"]) if history else float("nan")
        if progress.steps.limited_at is not None:  # the result says where the time ran out
            metrics[TIME_LIMITED] = len(history) - 1
        out = _write_checkpoint(work / "checkpoint", model, loop_config, best, metrics, history)
        if best < len(history) - 1:
            print(
                f"trainflow early stopping at round {len(history) - 1}: best validation loss "
                f"{history[best]['val_loss']:.6g} at round {best}"
            )
        session.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(str(out)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


FAMILY = booster_family(
    NAME,
    one_process_trainer,
    train_fn,
    whole_data_config,
    CatBoostPredictor,
    package="catboost",
    params=CatBoostParams,
    library_params=library_params,
    one_process=True,
    refit_params=refit_params,
    refit_pins=("learning_rate",),
    # cross-fitting: first, the strongest default; one split: third, strong but one process a fit (over 380 s on 4M rows)
    auto_rank=(0, 2),
    listed=5,
)
