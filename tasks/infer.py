"""Task: batch inference over a table with Ray Data actors, written atomically as Parquet."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from preprocessors.tabular import SchemaDriftError, TabularPreprocessor
from tasks.common import retry_unless_user_error
from trainer.predict import predict_dataset
from trainflow.config import Config, infer_format
from trainflow.data import (
    arrow_schema, check_unseen, check_writable, count_unseen, in_memory_bytes, read_table, should_materialize,
    write_parquet_atomic,
)
from trainflow.errors import CheckpointError, DataError
from trainflow.runtime import ensure_ray
from trainer.resources import check_fits


@dataclass
class Predictions:
    path: str
    input_rows: int
    output_rows: int
    unseen: dict[str, int] = field(default_factory=dict)  # text column -> rows with a value never seen in training


def resolve_checkpoint(model: str) -> str:
    """A local checkpoint folder for a checkpoint path or an MLflow model URI (models:/name@alias, runs:/...)."""
    if model.startswith(("models:/", "runs:/")):
        import mlflow

        try:
            local = mlflow.artifacts.download_artifacts(artifact_uri=model, dst_path=tempfile.mkdtemp(prefix="trainflow-model-"))
        except Exception as exc:  # noqa: BLE001 - MLflow raises MlflowException and REST errors alike
            raise CheckpointError(f"cannot load model {model}: {exc}") from None
        try:
            spec = mlflow.models.Model.load(local).flavors["python_function"]["artifacts"]["checkpoint"]
        except (KeyError, OSError, mlflow.exceptions.MlflowException):
            raise CheckpointError(f"model {model} is not a trainflow model (no checkpoint artifact)") from None
        path = Path(local) / spec["path"]
        if not path.is_dir():
            raise CheckpointError(f"model {model} has no trainflow checkpoint artifact")
        return str(path)
    if not Path(model).is_dir():
        raise CheckpointError(f"checkpoint folder not found: {model}")
    return model


@task(name="infer", retries=1, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error, cache_policy=NO_CACHE)
def infer(checkpoint_path: str, config: Config) -> Predictions:
    """Predict every row of inference.input with the checkpoint's own preprocessor; one output row per input row."""
    config.require_inference()
    inf, id_column = config.inference, config.data.id_column
    input_path, output_path = inf.input, inf.output
    ensure_ray(config.ray.address, config.ray.runtime_env)
    log = get_run_logger()
    check_writable(output_path)
    if inf.use_gpu:
        check_fits({"num_workers": inf.num_actors, "resources_per_worker": {"GPU": 1}, "use_gpu": True}, "inference")
    prep = TabularPreprocessor.load(checkpoint_path)
    fmt = infer_format(input_path)
    ds, files, fs = read_table(input_path, fmt)
    schema = arrow_schema(ds, input_path)
    try:
        prep.check_schema(schema, input_path)
    except SchemaDriftError as exc:
        raise DataError(str(exc)) from None
    if id_column is not None and id_column not in schema.names:
        raise DataError(f"{input_path}: id column {id_column!r} not found; columns are {list(schema.names)}")
    # one output row per input row, in input order (set on this dataset's own context, inherited by its
    # derived datasets, so no other dataset of the process is affected)
    ds.context.execution_options.preserve_order = True
    materialize, why = should_materialize(config.data.materialize, in_memory_bytes(fs, files, fmt))
    log.info("scoring table %s: %s", "materialized" if materialize else "streamed", why)
    if materialize:
        ds = ds.materialize()  # read once for the count, the unseen-value pass and the predictions
    input_rows = ds.count()
    if input_rows == 0:
        raise DataError(f"{input_path}: the table has no rows")
    unseen = count_unseen(ds, prep)
    if config.inference.on_unseen == "error":
        check_unseen(unseen, prep, input_path)
    for col, found in unseen.items():
        log.warning(
            "%s: column %r has %d row(s) with values never seen in training (e.g. %r); predicted with the unknown code",
            input_path, col, found["rows"], found["example"],
        )
    preds = predict_dataset(
        ds, checkpoint_path, id_column, prep.feature_order, inf.batch_size, inf.num_actors, inf.use_gpu
    )
    rows = write_parquet_atomic(preds, output_path, input_rows)
    log.info("wrote %d predictions for %d input rows to %s", rows, input_rows, output_path)
    return Predictions(
        path=output_path, input_rows=input_rows, output_rows=rows, unseen={c: f["rows"] for c, f in unseen.items()}
    )


@task(name="resolve-model", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error, cache_policy=NO_CACHE)
def resolve_checkpoint_task(model: str, tracking_uri: str) -> str:
    """Download (if needed) the checkpoint behind a model URI and return its local folder."""
    from trainflow.tracking import tracking

    with tracking(tracking_uri):
        return resolve_checkpoint(model)
