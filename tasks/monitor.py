"""Task: how the deployed model did once the true labels of its predictions arrive."""

from __future__ import annotations

import math
import time
from typing import Any

import mlflow
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from mlflow.entities import Metric
from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event

from trainflow.tables.sinks import SINK_FORMATS, Sink
from trainflow.preprocessors.tabular import SchemaDriftError, TabularPreprocessor
from trainflow.tasks.common import retry_unless_user_error, artifact_key
from trainflow.tasks.drift import held_out_score, publish, score_drop
from trainflow.trainer.resolve import allowed_class_paths, resolve_checkpoint
from trainflow.trainer.metrics import compute_metrics
from trainflow.config import Config, infer_format
from trainflow.errors import DataError
from trainflow.tables.outputs import output_files, read_manifest
from trainflow.run.storage import filesystem_for
from trainflow.tables.files import is_string_type, list_files, read_arrow
from trainflow.run.tracking import MODEL_URI
from trainflow.trainer.evaluate import estimate_metrics, model_outputs

DEGRADED_EVENT = "trainflow.model.degraded"


def join_labels(predictions: pa.Table, truth: pa.Table, id_col: str, label: str, source: str) -> pa.Table:
    """The predictions with their true labels, one row per labelled prediction. Refused with a DataError naming the
    file, the column and the count: no rows, missing or null ids or labels, an id given more than once (in the
    labels or the predictions: the join would count a prediction several times), ids of another type."""
    if truth.num_rows == 0:
        raise DataError(f"{source}: the label file has no rows")
    for col in (id_col, label):
        if col not in truth.column_names:
            raise DataError(f"{source}: column {col!r} not found; columns are {truth.column_names}")
        nulls = truth[col].null_count
        if nulls:
            raise DataError(
                f"{source}: column {col!r} has {nulls} empty value(s) of {truth.num_rows} rows; give every "
                "row an id and a label (or leave the unlabelled rows out)"
            )
    for table, what in ((truth, source), (predictions, "the predictions")):
        counts = pc.value_counts(table[id_col]).flatten()
        repeated = pc.filter(counts[1], pc.greater(counts[1], 1))
        if len(repeated):
            raise DataError(
                f"{what}: {len(repeated)} {id_col!r} value(s) appear more than once "
                f"({pc.sum(repeated).as_py()} rows, e.g. {pc.filter(counts[0], pc.greater(counts[1], 1))[0].as_py()!r}); "
                "each prediction takes exactly one label: de-duplicate the file"
            )
    want = predictions.schema.field(id_col).type
    have = truth.schema.field(id_col).type
    if want != have:
        same_kind = (pa.types.is_integer(want) and pa.types.is_integer(have)) or (
            is_string_type(want) and is_string_type(have)
        )
        if not same_kind:
            raise DataError(
                f"{source}: column {id_col!r} holds {have} values, the predictions' ids are {want}; "
                "write the ids as they were in the scoring table"
            )
        truth = truth.set_column(truth.schema.get_field_index(id_col), id_col, pc.cast(truth[id_col], want))
    joined = predictions.join(truth.select([id_col, label]), keys=id_col, join_type="inner")
    if joined.num_rows == 0:
        raise DataError(f"{source}: none of its {id_col!r} values is among the {predictions.num_rows} predictions")
    return joined


@task(
    name="monitor", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error, cache_policy=NO_CACHE
)
def measure_live(config: Config, labels_path: str | None) -> dict[str, Any]:
    """Join later-arriving labels (id column + label) with the predictions under inference.output, score the model
    version that wrote them with the training metric code, and compare with that version's validation score.
    labels_path None: a classifier's performance estimated from its probabilities alone (estimate_metrics), with
    the same comparison and verdict, marked estimated."""
    log = get_run_logger()
    if labels_path is not None and not config.data.id_column:
        raise DataError("monitor joins labels to predictions by data.id_column; set it in the config")
    name, version, predictions = _predictions(config)
    uri = config.mlflow.tracking_uri
    prep = TabularPreprocessor.load(resolve_checkpoint(f"models:/{name}/{version}", allowed_class_paths(config), uri))
    joined, truth, live = _live_metrics(config, prep, predictions, labels_path, f"{name} v{version}")
    # beside the labels' figures, what the probabilities alone said of the same rows (CBPE): how far to trust the
    # estimate a scoring run made before these labels came
    estimate = estimate_metrics(prep, joined) if labels_path is not None and prep.task == "classification" else {}
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    run_id = client.get_model_version(name, version).run_id
    result = _verdict(config, client.get_run(run_id).data.metrics, live, joined.num_rows, predictions.num_rows)
    estimated = labels_path is None
    result = {
        "model_version": version,
        "model_uri": f"models:/{name}/{version}",
        "rows": joined.num_rows,
        "predictions": predictions.num_rows,
        "labels": truth.num_rows if truth is not None else 0,
        "estimated": estimated,
        "method": "CBPE: expected metrics from the calibrated probabilities, no labels"
        if estimated
        else "the true labels joined by id",
        **result,
        "estimated_metrics": estimate,
    }
    if not result["judged"]:
        log.warning("monitor: no verdict for %s v%s: %s", name, version, result["verdict"])
    now = int(time.time())
    prefix = "estimated_" if estimated else "live_"
    client.log_batch(
        run_id,
        metrics=[
            Metric(f"{prefix}{k}", float(v), now * 1000, now)
            for k, v in live.items()
            if isinstance(v, float) and math.isfinite(v)
        ],
    )
    _tell(config, result, name)
    return result


def _predictions(config: Config) -> tuple[str, str, pa.Table]:
    """(registered model, version, its predictions): the newest scoring run's rows under inference.output and the
    model version that wrote them."""
    if not config.inference.output:
        raise DataError("monitor reads the predictions under inference.output; set it in the config")
    sink = Sink.of(config) if config.inference.output_format in SINK_FORMATS else None
    if sink is not None:  # a table: its newest scoring run's rows
        model_uri, predictions = sink.latest()
        manifest = {"model": model_uri}
    else:
        manifest = read_manifest(config.inference.output)
        if manifest is None:
            raise DataError(f"{config.inference.output}: no trainflow predictions here to monitor")
    m = MODEL_URI.match(manifest.get("model") or "")
    if m is None or m["version"] is None:
        raise DataError(
            f"{config.inference.output}: its predictions name no registered model version "
            f"({manifest.get('model')!r}); monitor measures registered versions"
        )
    if sink is None:
        fs, _ = filesystem_for(config.inference.output)
        predictions = pq.read_table(output_files(config.inference.output), filesystem=fs)
    return m["name"], m["version"], predictions


LABELS = "labels table"  # how the errors name --labels' table


def _live_metrics(config: Config, prep, predictions: pa.Table, labels_path: str | None, model: str) -> tuple:
    """(the rows measured, the labels table or None, their metrics): the labels joined by id, or without them a
    classifier's metrics estimated from its probabilities."""
    label = config.data.label
    if labels_path is None:
        if prep.task != "classification":
            raise DataError(
                "monitor without --labels estimates a classifier's performance from its probabilities; "
                f"{model} predicts a quantity: give the true values with --labels"
            )
        return predictions, None, estimate_metrics(prep, predictions)
    fmt = infer_format(labels_path)
    truth = read_arrow(*list_files(labels_path, fmt, LABELS), fmt, config.data.csv, labels_path)
    joined = join_labels(predictions, truth, config.data.id_column, label, labels_path)
    try:
        y = prep.transform_label(joined)
    except (SchemaDriftError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise DataError(
            f"{labels_path}: column {label!r} ({joined.schema.field(label).type}) does not read as the "
            f"model's classes {prep.classes if prep.task == 'classification' else '(numbers)'}: "
            f"{str(exc).splitlines()[0]}"
        ) from None
    return joined, truth, compute_metrics(prep.task, model_outputs(prep, joined), y, prep)


def _verdict(config: Config, registered: dict, live: dict, rows: int, predictions: int) -> dict[str, Any]:
    """The live (or estimated) score against the version's held-out score at registration, and the verdict."""
    metric = config.promotion.metric
    validation, baseline_on = held_out_score(registered, metric)
    score = live.get(metric)
    drop = score_drop(config, validation, score)
    enough = rows >= config.monitor.min_rows
    degraded = enough and drop is not None and drop > config.monitor.max_drop
    verdict = (
        ("degraded" if degraded else "ok")
        if enough
        else (f"none: {rows} labelled predictions, fewer than monitor.min_rows {config.monitor.min_rows}")
    )
    return {
        "coverage": rows / predictions if predictions else 0.0,
        "metrics": live,
        "metric": metric,
        "validation_score": validation,
        "baseline_on": baseline_on,
        "live_score": score,
        "drop": drop,
        "max_drop": config.monitor.max_drop,
        "min_rows": config.monitor.min_rows,
        "verdict": verdict,
        "judged": enough,  # a verdict (ok or degraded) rests on at least monitor.min_rows labelled predictions
        "degraded": degraded,
    }


def _tell(config: Config, result: dict[str, Any], name: str) -> None:
    """The measurement as a Prefect artifact, a degradation as an event (an estimated drop also as drift's event),
    and the log lines."""
    log, version, metric, estimated = get_run_logger(), result["model_version"], result["metric"], result["estimated"]
    score, validation, drop, live = result["live_score"], result["validation_score"], result["drop"], result["metrics"]
    create_markdown_artifact(
        key=artifact_key(name, "monitor"),
        description=f"Live performance of {name} version {version}",
        markdown=(
            f"# {name} version {version} on {result['rows']} "
            f"{'predictions (estimated, no labels)' if estimated else 'labelled predictions'}\n\n"
            f"**{result['verdict']}**: {metric} live {score} vs validation {validation} "
            f"(coverage {result['coverage']:.1%} of {result['predictions']} predictions) "
            f"(drop {drop}, max_drop {config.monitor.max_drop})\n\n| metric | live |\n|---|---|\n"
            + "\n".join(f"| {k} | {v:.6g} |" for k, v in live.items())
        ),
    )
    if result["degraded"]:
        emit_event(event=DEGRADED_EVENT, resource={"prefect.resource.id": f"trainflow.model.{name}"}, payload=result)
        if estimated:  # an estimated drop is news before any label: the event drift raises, for the same automations
            publish(config, result["model_uri"], config.inference.output, {}, estimated_drop={metric: drop})
        log.warning("%s v%s degraded: %s %s live vs %s at validation", name, version, metric, score, validation)
    log.info(
        "monitor: %s v%s on %d %s: %s",
        name,
        version,
        result["rows"],
        "predictions, estimated without labels (CBPE)" if estimated else "labelled rows",
        live,
    )
