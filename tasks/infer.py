"""Task: batch inference over a table with Ray Data actors, written atomically as Parquet."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import ray
from prefect import task
from prefect.cache_policies import NO_CACHE

from trainflow.preprocessors.tabular import SchemaDriftError, TabularPreprocessor
from trainflow.tasks.common import in_prefect_run, retry_unless_user_error, task_logger, scored_here
from trainflow.tasks.drift import markdown, measure, publish, publish_estimate
from trainflow.trainer.evaluate import estimate_metrics
from trainflow.trainer.serving.predict import (
    CountCollector,
    NonFiniteOutput,
    predict_arrow,
    predict_dataset,
)
from trainflow.config import Config, infer_format
from trainflow.data import arrow_schema, read_table, should_materialize
from trainflow.preprocessors.fit import check_unseen, count_drift, count_unseen
from trainflow.tables.files import INFERENCE_INPUT, in_memory_bytes, list_files, read_arrow
from trainflow.tables.outputs import check_destination, write_output
from trainflow.tables.sinks import SINK_FORMATS, Sink, prediction_columns, scoring_run_id, write_sink
from trainflow.errors import CheckpointError, DataError
from trainflow.run.runtime import ensure_ray
from trainflow.run.tracking import MODEL_URI
from trainflow.trainer.resources import check_fits
from trainflow.trainer.resolve import allowed_class_paths, resolve_checkpoint
from trainflow.tasks.values import Predictions


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


def _scoring_table(config: Config, prep: TabularPreprocessor) -> tuple:
    """(inference.input as this process's Arrow table or a Ray dataset, read here, materialized): a small table is
    read, counted, predicted and written by this process, no Ray to start; its schema checked against the model's."""
    inf, input_path, id_column = config.inference, config.inference.input, config.data.id_column
    log = task_logger("infer")
    fmt = infer_format(input_path)
    fs, files = listed = list_files(input_path, fmt, INFERENCE_INPUT)
    table_bytes = in_memory_bytes(fs, files, fmt)
    here = scored_here(config, table_bytes)
    if here:
        ds = read_arrow(fs, files, fmt, config.data.csv, input_path)
        schema, materialize = ds.schema, True
        log.info("scoring table read in this process: %.1f MiB in memory", table_bytes / 2**20)
    else:
        ensure_ray(**config.ray_start)
        if inf.use_gpu:
            check_fits(
                {"num_workers": inf.num_actors, "resources_per_worker": {"GPU": 1}, "use_gpu": True}, "inference"
            )
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
    return ds, here, materialize


def _unseen(config: Config, ds, prep: TabularPreprocessor) -> dict[str, dict]:
    """The text values never seen in training, per column (a pass over the text columns only): refused with
    inference.on_unseen: error, else each column said."""
    input_path = config.inference.input
    unseen = count_unseen(ds, prep)
    if config.inference.on_unseen == "error":
        check_unseen(unseen, prep, input_path)
    for col, found in unseen.items():
        task_logger("infer").warning(
            "%s: column %r has %d row(s) with values never seen in training (e.g. %r); predicted with the unknown code",
            input_path,
            col,
            found["rows"],
            found["example"],
        )
    return unseen


@task(name="infer", retries=1, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error, cache_policy=NO_CACHE)
def infer(checkpoint_path: str, config: Config, model: str = "", run_id: str | None = None) -> Predictions:
    """Predict every row of inference.input with the checkpoint's own preprocessor; one output row per input row.
    model: what the manifest names as the predictions' model (a registry URI or version); run_id: the scoring run's
    id in a table the predictions are appended to (default: this flow run's id)."""
    config.require_inference()
    inf, id_column = config.inference, config.data.id_column
    input_path, output_path = inf.input, inf.output
    check_destination(config)
    log = task_logger("infer")
    prep = TabularPreprocessor.load(checkpoint_path)
    sink = Sink.of(config) if inf.output_format in SINK_FORMATS else None
    if sink is not None:  # an existing table of other columns is refused before anything is scored
        sink.check(prediction_columns(id_column, prep.classes if prep.task == "classification" else None))
    ds, here, materialize = _scoring_table(config, prep)
    input_rows = ds.num_rows if here else ds.count()
    if input_rows == 0:
        raise DataError(f"{input_path}: the table has no rows")
    unseen = _unseen(config, ds, prep)
    # drift: a table in memory is counted by Ray tasks; a streamed one by the predictors in the prediction pass itself
    # (read once; a collector actor sums their counts)
    drifting = inf.drift.enabled and bool(prep.baseline.get("columns"))
    drift, drawn = {}, None
    with ThreadPoolExecutor(1, thread_name_prefix="trainflow-drift-chart") as helper:
        if drifting and materialize:
            counts = count_drift(ds, prep.baseline)
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
            if sink is not None:
                rows = write_sink(preds, sink, input_rows, model, run_id or scoring_run_id())
            else:
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
