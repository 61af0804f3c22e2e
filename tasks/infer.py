"""Task: batch inference over a table with Ray Data actors, written atomically as Parquet."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

import ray
from prefect import task
from prefect.cache_policies import NO_CACHE

from trainflow.preprocessors.tabular import SchemaDriftError, TabularPreprocessor
from trainflow.tasks.common import in_prefect_run, retry_unless_user_error, task_logger
from trainflow.tasks.drift import markdown, measure, publish, publish_estimate
from trainflow.trainer.checkpoint import read_config
from trainflow.trainer.families.network import user_class_path
from trainflow.trainer.serving import member_dirs
from trainflow.trainer.predict import (
    CountCollector,
    NonFiniteOutput,
    predict_arrow,
    predict_dataset,
)
from trainflow.config import Config, infer_format
from trainflow.data import arrow_schema, read_table, should_materialize
from trainflow.preprocessors.fit import check_unseen, count_drift, count_drift_table, count_unseen, count_unseen_table
from trainflow.tables import check_writable, in_memory_bytes, list_files, read_arrow, scoring_in_process_bytes
from trainflow.outputs import guard_output, write_output
from trainflow.errors import CheckpointError, DataError, InfrastructureError
from trainflow.runtime import ensure_ray
from trainflow.storage import private_copy, private_dir
from trainflow.tracking import MODEL_URI
from trainflow.trainer.resources import check_fits


@dataclass
class Predictions:
    path: str
    input_rows: int
    output_rows: int
    unseen: dict[str, int] = field(default_factory=dict)  # text column -> rows with a value never seen in training
    drift: dict[str, Any] = field(default_factory=dict)  # per feature: score, threshold, verdict; drifted_columns
    model: str = ""  # the model that predicted (a registry URI or a checkpoint folder)
    # a classifier scored in this process: its metrics estimated from the calibrated probabilities (CBPE, no labels)
    estimated: dict[str, float] = field(default_factory=dict)


def non_finite_cause(exc: BaseException | None) -> NonFiniteOutput | None:
    """The NonFiniteOutput behind exc (raised here, or in a Ray actor and wrapped on its way back), if any."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, NonFiniteOutput):
            return exc
        cause = getattr(exc, "cause", None)  # a RayTaskError keeps the worker's exception here
        exc = cause if isinstance(cause, BaseException) else (exc.__cause__ or exc.__context__)
    return None


def allowed_class_paths(config: Config) -> set[str]:
    """The user module class paths a stored checkpoint may import: the config's own and model.allowed_class_paths."""
    return {p for p in [config.model.class_path, *config.model.allowed_class_paths] if p}


def check_class_path(checkpoint: str, allowed: set[str], source: str) -> None:
    """CheckpointError when the checkpoint's config names a user module outside allowed: its code is never imported."""
    try:
        model_cfgs = [
            read_config(d)["model"] for d in [checkpoint, *member_dirs(checkpoint)]
        ]  # an ensemble's members too
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{source}: the checkpoint (or an ensemble member) cannot be read: {type(exc).__name__}: {exc}"
        ) from None
    for class_path in {user_class_path(m) for m in model_cfgs} - allowed - {None}:
        raise CheckpointError(
            f"{source}: its checkpoint asks to import the module class {class_path!r}, which this config does not "
            f"name (model.class_path {sorted(allowed) or 'unset'}); trainflow imports no code a stored model names. "
            "If you trust it, list it under model.allowed_class_paths"
        )


def _artifact_uri(model: str, tracking_uri: str | None) -> str:
    """Where a models:/name/version or models:/name@alias URI's files are, asked of this registry explicitly
    (MLflow resolves models:/ through its process-wide registry URI, which another thread may have changed)."""
    m = MODEL_URI.match(model)
    if tracking_uri is None or m is None:
        return model
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    version = m["version"] or client.get_model_version_by_alias(m["name"], m["alias"]).version
    return client.get_model_version_download_uri(m["name"], str(version))


def resolve_checkpoint(model: str, allowed: set[str] | None = None, tracking_uri: str | None = None) -> str:
    """A local checkpoint folder for a checkpoint path or an MLflow model URI (models:/name@alias, runs:/...).

    allowed: the user module class paths the checkpoint may import (None: not checked, the caller vouches);
    tracking_uri: the registry to read (default: MLflow's current one).
    A registry error other than "no such model" is an InfrastructureError (retried); a missing model or a
    folder that is not a trainflow checkpoint is the user's CheckpointError."""
    if model.startswith(("models:/", "runs:/")):
        import mlflow

        dst = Path(private_dir("model-")).resolve()  # removed when this process exits
        try:
            local = mlflow.artifacts.download_artifacts(
                artifact_uri=_artifact_uri(model, tracking_uri), dst_path=str(dst), tracking_uri=tracking_uri
            )
        except mlflow.exceptions.MlflowException as exc:
            if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise CheckpointError(f"cannot load model {model}: {exc.message}") from None
            raise InfrastructureError(f"cannot load model {model} from the registry: {exc.message}") from None
        except OSError as exc:
            raise InfrastructureError(f"cannot download model {model}: {exc}") from None
        try:
            spec = mlflow.models.Model.load(local).flavors["python_function"]["artifacts"]["checkpoint"]
        except (KeyError, OSError, mlflow.exceptions.MlflowException):
            raise CheckpointError(f"model {model} is not a trainflow model (no checkpoint artifact)") from None
        path = (Path(local) / spec["path"]).resolve()
        if not path.is_relative_to(dst):
            raise CheckpointError(
                f"model {model}: its checkpoint artifact path {spec['path']!r} points outside the "
                "model's download folder; refused"
            )
        if not path.is_dir():
            raise CheckpointError(f"model {model} has no trainflow checkpoint artifact")
        path = str(path)
    elif not Path(model).is_dir():
        raise CheckpointError(f"checkpoint folder not found: {model}")
    else:
        path = private_copy(model)  # what is checked below is what is scored, whatever happens to the folder
    if allowed is not None:
        check_class_path(path, allowed, model)
    return path


def scored_here(config: Config, table_bytes: int) -> bool:
    """Whether a scoring table of table_bytes (decoded) is read, predicted and written by the calling process, with
    no Ray: a CPU scoring of a table under scoring_in_process_bytes() (512 MiB on a machine of 4 GiB or more),
    unless data.materialize is never."""
    return (
        not config.inference.use_gpu
        and table_bytes <= scoring_in_process_bytes()
        and config.data.materialize != "never"
    )


def scoring_table_bytes(config: Config) -> int:
    """inference.input's decoded size from its files' metadata (no read)."""
    fmt = infer_format(config.inference.input)
    return in_memory_bytes(*list_files(config.inference.input, fmt), fmt)


@task(name="infer", retries=1, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error, cache_policy=NO_CACHE)
def infer(checkpoint_path: str, config: Config, model: str = "") -> Predictions:
    """Predict every row of inference.input with the checkpoint's own preprocessor; one output row per input row.
    model: what the manifest names as the predictions' model (a registry URI or version)."""
    config.require_inference()
    inf, id_column = config.inference, config.data.id_column
    input_path, output_path = inf.input, inf.output
    guard_output(output_path, config)
    check_writable(output_path)
    log = task_logger("infer")
    prep = TabularPreprocessor.load(checkpoint_path)
    fmt = infer_format(input_path)
    fs, files = listed = list_files(input_path, fmt)
    table_bytes = in_memory_bytes(fs, files, fmt)
    # a small table is read, counted, predicted and written by this process: no Ray to start
    here = scored_here(config, table_bytes)
    if not here:
        ensure_ray(**config.ray_start)
        if inf.use_gpu:
            check_fits(
                {"num_workers": inf.num_actors, "resources_per_worker": {"GPU": 1}, "use_gpu": True}, "inference"
            )
    if here:
        ds = read_arrow(fs, files, fmt, config.data.csv, input_path)
        schema, materialize = ds.schema, True
        log.info("scoring table read in this process: %.1f MiB in memory", table_bytes / 2**20)
    else:
        ds, _, _ = read_table(input_path, fmt, listed=listed, csv=config.data.csv)
        schema = arrow_schema(ds, input_path)
        # one output row per input row, in input order (set on this dataset's own context, inherited by its
        # derived datasets, so no other dataset of the process is affected)
        ds.context.execution_options.preserve_order = True
        materialize, why = should_materialize(config.data.materialize, table_bytes)
        log.info("scoring table %s: %s", "materialized" if materialize else "streamed", why)
    try:
        prep.check_schema(schema, input_path)
    except SchemaDriftError as exc:
        raise DataError(str(exc)) from None
    if id_column is not None and id_column not in schema.names:
        raise DataError(f"{input_path}: id column {id_column!r} not found; columns are {list(schema.names)}")
    if materialize and not here:
        ds = ds.materialize()  # read once for the count, the unseen-value pass and the predictions
    input_rows = ds.num_rows if here else ds.count()
    if input_rows == 0:
        raise DataError(f"{input_path}: the table has no rows")
    unseen = count_unseen_table(ds, prep) if here else count_unseen(ds, prep)  # a pass over the text columns only
    if config.inference.on_unseen == "error":
        check_unseen(unseen, prep, input_path)
    for col, found in unseen.items():
        log.warning(
            "%s: column %r has %d row(s) with values never seen in training (e.g. %r); predicted with the unknown code",
            input_path,
            col,
            found["rows"],
            found["example"],
        )
    # drift: a table in memory is counted by Ray tasks; a streamed one by the predictors in the prediction pass itself
    # (read once; a collector actor sums their counts)
    drifting = inf.drift.enabled and bool(prep.baseline.get("columns"))
    drift, drawn = {}, None
    with ThreadPoolExecutor(1, thread_name_prefix="trainflow-drift-chart") as helper:
        if drifting and materialize:
            counts = count_drift_table(ds, prep.baseline) if here else count_drift(ds, prep.baseline)
            drift = measure(config, prep.baseline, counts, input_rows)
            if in_prefect_run():  # the artifact's chart, drawn while the rows are predicted (no artifact outside a run)
                drawn = helper.submit(markdown, drift, model, input_path)
        collector = ray.remote(num_cpus=0)(CountCollector).remote() if drifting and not materialize else None
        if here:
            preds = predict_arrow(ds, checkpoint_path, id_column, prep.feature_order, inf.batch_size)
        else:
            preds = predict_dataset(
                ds,
                checkpoint_path,
                id_column,
                prep.feature_order,
                inf.batch_size,
                inf.num_actors,
                inf.use_gpu,
                collector,
            )
        try:
            rows = write_output(preds, output_path, input_rows, {"model": model, "input": input_path}, config)
        except Exception as exc:  # noqa: BLE001 - a non-finite batch may come back wrapped by Ray
            bad = non_finite_cause(exc)
            if bad is None:
                raise
            raise CheckpointError(str(bad)) from None
        if collector is not None:
            drift = measure(config, prep.baseline, ray.get(collector.total.remote()), input_rows)
            ray.kill(collector)
        estimated, dropped = {}, None
        if here and prep.task == "classification":  # the predictions are in this process (larger tables: monitor)
            from trainflow.tasks.monitor import estimate_metrics

            estimated = estimate_metrics(prep, preds)
            dropped = publish_estimate(config, model, input_path, estimated, rows)
        if drifting or dropped:  # one drift event for the run, whether columns moved or the estimate fell
            publish(config, model, input_path, drift, drawn.result() if drawn else None, dropped)
    log.info("wrote %d predictions for %d input rows to %s", rows, input_rows, output_path)
    return Predictions(
        path=output_path,
        input_rows=input_rows,
        output_rows=rows,
        unseen={c: f["rows"] for c, f in unseen.items()},
        drift=drift,
        model=model,
        estimated=estimated,
    )


@task(
    name="resolve-model",
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=retry_unless_user_error,
    cache_policy=NO_CACHE,
)
def resolve_checkpoint_task(model: str, config: Config) -> tuple[str, str]:
    """Download (if needed) the checkpoint behind a model URI: (its local folder, the model as a versioned URI,
    e.g. models:/name/3 for models:/name@champion, which the predictions' manifest records)."""
    return (
        resolve_checkpoint(model, allowed_class_paths(config), config.mlflow.tracking_uri),
        pinned_uri(model, config.mlflow.tracking_uri),
    )


def pinned_uri(model: str, tracking_uri: str | None) -> str:
    """models:/name@alias as models:/name/<version> (the version the alias names now); other URIs unchanged."""
    m = MODEL_URI.match(model)
    if m is None or m["alias"] is None:
        return model
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    return f"models:/{m['name']}/{client.get_model_version_by_alias(m['name'], m['alias']).version}"
