"""The Python API: the flows the `trainflow` command runs, called from a notebook or another pipeline.

    import trainflow
    summary = trainflow.retrain("configs/demo.yaml", train__time_limit=60)  # a path, a dict or a Config
    summary = trainflow.retrain(cfg, data=df)                              # a DataFrame (or Ray Dataset) as the table
    summary = trainflow.replay("dated.yaml", every="month")                # the retraining policies over its history
    trainflow.leaderboard(summary)                                         # every candidate's scores and time
    model = trainflow.load_model("models:/churn-model@champion", tracking_uri="sqlite:///mlflow.db")
    model.predict(df)                                                      # prediction (+ proba_<class>) per row
    model.predict_proba(df); model.evaluate(labelled_df)                   # class probabilities; metrics on your rows

Each call is a local Prefect flow run (Prefect's temporary server and a local Ray start when none is configured),
returning the summary dict that `--summary-json` writes; a bad config or table raises a TrainflowError subclass.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from trainflow.config import Config, apply_overrides, config_from_dict, load_config, storage_path_of
from trainflow.flows.handover import forget, hand_over
from trainflow.tables.snapshots import snapshot

ConfigLike = str | os.PathLike | dict | Config


def _dotted(overrides: dict[str, Any]) -> dict[str, Any] | None:
    """Keyword overrides as dotted config keys: train__time_limit=60 is --set train.time_limit=60."""
    return {k.replace("__", "."): v for k, v in overrides.items()} or None


def _with_data(config: ConfigLike, overrides: dict[str, Any] | None, data: Any) -> dict[str, Any] | None:
    """overrides with data.path naming data's snapshot, under the config's storage_path."""
    if data is None:
        return overrides
    where = config.storage_path if isinstance(config, Config) else storage_path_of(config, overrides)
    return {**(overrides or {}), "data.path": snapshot(data, where)}


def _call(flow, config: ConfigLike, overrides: dict[str, Any], data: Any = None, **params) -> dict[str, Any]:
    from trainflow.run.runtime import local_flow_settings

    overrides = _with_data(config, _dotted(overrides), data)
    if isinstance(config, (str, os.PathLike)):
        path = str(Path(config).resolve())
        load_config(path, overrides)  # a bad config fails here, before Prefect and Ray start
        with local_flow_settings():
            return flow(config_path=path, overrides=overrides, **params)
    if isinstance(config, Config):
        config = config.as_given()
    if not isinstance(config, dict):
        raise TypeError(f"config: expected a path, a dict or a trainflow Config, got {type(config).__name__}")
    # relative paths in a dict resolve against the working directory, as a config file's do against its folder
    key = hand_over(config_from_dict(apply_overrides(config, overrides), base_dir=Path.cwd(), source="<dict>"))
    try:
        with local_flow_settings():
            return flow(config_path=key, **params)
    finally:
        forget(key)


def retrain(
    config: ConfigLike, *, data: Any = None, run_name: str | None = None, force: bool = False, **overrides: Any
) -> dict[str, Any]:
    """Train, select, register, gate and predict, as `trainflow retrain`; the run's summary (leaderboard(summary):
    its candidates as a table). data: the table itself (a pandas DataFrame, pyarrow Table or Ray Dataset) instead of
    data.path, kept as a Parquet snapshot under storage_path/snapshots (snapshot())."""
    from trainflow.flows.retrain import retrain as flow

    return _call(flow, config, overrides, data, run_name=run_name, force=force)


def replay(
    config: ConfigLike,
    *,
    every: str,
    start: str | None = None,
    end: str | None = None,
    policies: str | list[str] | None = None,
    run_name: str | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """The retraining policies replayed over the table's history, as `trainflow replay` (start and end: --from and
    --to); the summary, whose `replay` section has every period's score per policy and the recommendation."""
    from trainflow.flows.replay import check_request, replay as flow

    if isinstance(config, (str, os.PathLike)):
        check_request(load_config(str(Path(config).resolve()), _dotted(overrides)), every, policies, start, end)
    return _call(flow, config, overrides, every=every, start=start, end=end, policies=policies, run_name=run_name)


def leaderboard(summary: dict[str, Any]) -> pd.DataFrame:
    """A retrain's candidates, best first: each family (and the ensemble) with its validation (or out-of-fold) and
    test scores, the epoch or round kept, the epochs or rounds run and the training seconds (the parent MLflow run's
    leaderboard.json)."""
    from trainflow.tasks.mlflow_run import leaderboard_table

    if not summary.get("candidates"):
        raise ValueError("this summary has one model and no candidates to compare: model.type named a single family")
    return pd.DataFrame(leaderboard_table(summary))


def tune(config: ConfigLike, *, run_name: str | None = None, resume: bool = False, **overrides: Any) -> dict[str, Any]:
    """A Ray Tune sweep over tune.search_space, its best trial published as a retrain's, as `trainflow tune`."""
    from trainflow.flows.tune import tune as flow

    return _call(flow, config, overrides, run_name=run_name, resume=resume)


def predict(config: ConfigLike, *, model: str | None = None, **overrides: Any) -> dict[str, Any]:
    """Batch inference of inference.input into inference.output, as `trainflow predict` (default model: the
    registered model's @champion); the summary (rows, output path, drift)."""
    from trainflow.flows.predict import batch_inference as flow

    return _call(flow, config, overrides, model=model)


class Model:
    """A trained trainflow model in this process: predict() gives the batch output's columns for every row."""

    def __init__(self, servable, uri: str):
        self.servable, self.uri = servable, uri

    @property
    def family(self) -> str:
        return self.servable.family

    @property
    def features(self) -> list[str]:
        """The input columns the model reads (others in a frame are ignored)."""
        return list(self.servable.preprocessor.feature_order)

    def predict(self, data: pd.DataFrame, batch_size: int = 65_536) -> pd.DataFrame:
        """`prediction` (and `proba_<class>` for classification) for every row of data, in its order and index."""
        import pyarrow as pa

        from trainflow.trainer.serving.predict import predict_table

        table = pa.Table.from_pandas(pd.DataFrame(data), preserve_index=False)
        parts = [
            predict_table(self.servable, table.slice(i, batch_size)) for i in range(0, max(len(table), 1), batch_size)
        ]
        out = pa.concat_tables(parts).to_pandas()
        out.index = data.index
        return out

    @property
    def classes(self) -> list | None:
        """A classifier's classes, in the order of predict_proba's columns (None for regression)."""
        prep = self.servable.preprocessor
        return list(prep.classes) if prep.task == "classification" else None

    def predict_proba(self, data: pd.DataFrame, batch_size: int = 65_536) -> pd.DataFrame:
        """A classifier's class probabilities for every row of data (calibrated when the model holds a calibration):
        one column per class (Model.classes), rows summing to 1, in data's order and index."""
        if self.classes is None:
            raise ValueError(
                f"{self.uri}: predict_proba is for classification; this model predicts a quantity (use predict)"
            )
        out = self.predict(data, batch_size)
        probs = out[[f"proba_{c}" for c in self.classes]]
        probs.columns = self.classes
        return probs

    def evaluate(self, data: pd.DataFrame, batch_size: int = 65_536) -> dict[str, float]:
        """The model's metrics (those of the summary's test_metrics, without the prefix: loss, accuracy, roc_auc, ...,
        or rmse, mae, r2) on your own labelled rows: data holds the feature columns and the label column."""
        import numpy as np
        import pyarrow as pa

        from trainflow.trainer.metrics import compute_metrics

        prep = self.servable.preprocessor
        if prep.label not in data.columns:
            raise ValueError(f"evaluate: the frame has no label column {prep.label!r} (columns: {list(data.columns)})")
        table = pa.Table.from_pandas(pd.DataFrame(data), preserve_index=False)
        if len(table) == 0:
            raise ValueError("evaluate: the frame has no rows")
        outs, labels = [], []
        for i in range(0, len(table), batch_size):
            part = table.slice(i, batch_size)
            outs.append(self.servable.predict(prep.transform_features(part, strict=False)))
            labels.append(prep.transform_label(part))
        metrics = compute_metrics(prep.task, np.concatenate(outs), np.concatenate(labels), prep)
        return {k.removeprefix("val_"): v for k, v in metrics.items()}

    def __repr__(self) -> str:
        return f"trainflow.Model({self.uri!r}, family={self.family!r})"


def load_model(
    uri: str | os.PathLike, tracking_uri: str | None = None, allowed_class_paths: tuple[str, ...] = ()
) -> Model:
    """The model behind models:/name@alias, models:/name/version, runs:/... or a checkpoint folder.

    tracking_uri: the MLflow registry (default: MLFLOW_TRACKING_URI / MLflow's default). A checkpoint of your own
    nn.Module imports its class only when it is listed in allowed_class_paths (nothing is imported because a stored
    model names it)."""
    from trainflow.trainer.resolve import resolve_checkpoint
    from trainflow.trainer.serving.servable import load_servable

    uri = str(uri)
    return Model(load_servable(resolve_checkpoint(uri, set(allowed_class_paths), tracking_uri)), uri)


def evaluate(model: Model | str | os.PathLike, data: pd.DataFrame, tracking_uri: str | None = None) -> dict[str, float]:
    """A model's metrics on your own labelled rows (Model.evaluate); model: a Model or a URI load_model reads."""
    if not isinstance(model, Model):
        model = load_model(model, tracking_uri=tracking_uri)
    return model.evaluate(data)
