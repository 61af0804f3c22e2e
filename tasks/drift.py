"""Drift of a scoring table from the serving model's baseline: where a person and an automation see it
(the run's log, a Prefect artifact with a table and a bar chart, MLflow metrics of the model's run, an event)."""

from __future__ import annotations

import math
import time
from typing import Any

from trainflow.tasks.common import chart_figure, in_prefect_run, md, md_code, png_data_uri, task_logger
from trainflow.preprocessors.baseline import drift_report
from trainflow.config import Config
from trainflow.run.redact import redact_text
from trainflow.run.tracking import MODEL_URI, mlflow_key

DRIFT_EVENT = "trainflow.drift.detected"


def measure(config: Config, baseline: dict[str, Any], counts: dict[str, list[int]], rows: int) -> dict[str, Any]:
    """The summary's `drift`: per feature a score, threshold and verdict, and drifted_columns."""
    if not baseline.get("columns"):
        return {"rows": rows, "columns": {}, "drifted_columns": [], "note": "the model has no training baseline"}
    d = config.inference.drift
    return drift_report(baseline, counts, rows, d.numeric_threshold, d.categorical_threshold, d.min_rows)


def bar_chart(drift: dict[str, Any]):
    """A PNG: one bar per feature (its score), its threshold marked, drifted bars red."""
    cols = list(drift["columns"])
    scores = [drift["columns"][c]["score"] or 0.0 for c in cols]
    colors = ["tab:red" if drift["columns"][c]["verdict"] == "drifted" else "tab:blue" for c in cols]
    fig = chart_figure(figsize=(6, 0.35 * len(cols) + 1.2), dpi=100)
    ax = fig.subplots()
    ax.barh(cols, scores, color=colors)
    for i, c in enumerate(cols):
        ax.plot([drift["columns"][c]["threshold"]] * 2, [i - 0.4, i + 0.4], color="black", linewidth=1)
    ax.invert_yaxis()
    ax.set_xlabel("drift (Jensen-Shannon for numbers, L-infinity for text); | threshold")
    fig.tight_layout()
    return fig


def markdown(drift: dict[str, Any], model: str, source: str) -> str:
    rows = "\n".join(
        f"| {md(c)} | {r['method']} | {r['score']} | {r['threshold']} | {r['verdict']} |"
        for c, r in drift["columns"].items()
    )
    png = png_data_uri(bar_chart(drift))[1] if drift["columns"] else ""
    drifted = ", ".join(md_code(c) for c in drift["drifted_columns"]) or "none"
    return (
        f"# Drift of {md_code(source)} from {md(model)}'s training data\n\n{drift['rows']} scoring rows; drifted: {drifted}\n\n"
        f"| column | measure | score | threshold | verdict |\n|---|---|---|---|---|\n{rows}\n\n"
        + (f"![drift per feature]({png})\n" if png else "")
    )


def metric_name(column: str) -> str:
    return mlflow_key(f"drift.{column}")


def publish(
    config: Config,
    model: str,
    source: str,
    drift: dict[str, Any],
    text: str | None = None,
    estimated_drop: dict[str, float] | None = None,
) -> None:
    """Log, artifact (text: markdown(drift, model, source) when drawn already), MLflow metrics on the model
    version's run, and one event when a column drifted or the estimated performance fell (estimated_drop, from
    publish_estimate): the automations that retrain on drift retrain on either."""
    from prefect.artifacts import create_markdown_artifact
    from prefect.events import emit_event

    from trainflow.tasks.common import artifact_key

    source = redact_text(source)  # the artifact and the event never carry a URI's credentials
    log = task_logger("drift")
    drifted = drift.get("drifted_columns", [])
    if drifted:
        log.warning(
            "drift from the training data in %s: %s",
            source,
            {c: round(drift["columns"][c]["score"], 3) for c in drifted},
        )
    if drift:
        _log_to_mlflow(config, model, drift)
    if not in_prefect_run():  # small work run without Prefect: the scores are in MLflow, the summary says the rest
        return
    if drift:
        create_markdown_artifact(
            markdown=text or markdown(drift, model, source),
            key=artifact_key(config.mlflow.registered_model, "drift"),
            description=f"Drift of {source} from the serving model's training data",
        )
    if drifted or estimated_drop:
        payload = {
            "model": model,
            "input": source,
            "drifted_columns": drifted,
            "scores": {c: drift["columns"][c]["score"] for c in drifted},
        }
        if estimated_drop:
            [(metric, drop)] = estimated_drop.items()
            payload.update(
                estimated_drop=estimated_drop,
                reason=f"the estimated {metric} (CBPE) fell by {drop:.4f} > monitor.max_drop {config.monitor.max_drop}",
            )
        emit_event(
            event=DRIFT_EVENT,
            resource={"prefect.resource.id": f"trainflow.model.{config.mlflow.registered_model}"},
            payload=payload,
        )


def _log_to_mlflow(config: Config, model: str, drift: dict[str, Any]) -> None:
    """Scores as metrics of the serving version's MLflow run, one point per scoring run (step: its time)."""
    scored = {metric_name(c): r["score"] for c, r in drift["columns"].items() if r["score"] is not None}
    log_to_version_run(config, model, scored)


def publish_estimate(
    config: Config, model: str, source: str, estimated: dict[str, float], rows: int
) -> dict[str, float] | None:
    """A classifier's performance on a scoring table estimated from its calibrated probabilities (CBPE, no labels),
    recorded beside the drift scores: logged, and `estimated_<metric>` on the serving version's MLflow run, one point
    per scoring run (`trainflow monitor` later puts the labels' figures beside them). An estimated `promotion.metric`
    worse than the version's held-out score by more than `monitor.max_drop` (on at least `monitor.min_rows` rows)
    is news before any label: a warning, and {metric: drop} returned for the drift event (publish)."""
    log = task_logger("drift")
    log.info(
        "estimated without labels on %s (CBPE, from the calibrated probabilities): %s",
        source,
        ", ".join(f"{k.removeprefix('val_')} {v:.4f}" for k, v in estimated.items()),
    )
    logged = log_to_version_run(config, model, {f"estimated_{k}": v for k, v in estimated.items()})
    metric = config.promotion.metric
    baseline, _ = held_out_score(logged or {}, metric)
    drop = score_drop(config, baseline, estimated.get(metric))
    if drop is None or drop <= config.monitor.max_drop or rows < config.monitor.min_rows:
        return None
    log.warning(
        "estimated %s on %s is %.4f, worse by %.4f than the version's held-out %.4f (monitor.max_drop %s)",
        metric.removeprefix("val_"),
        source,
        estimated[metric],
        drop,
        baseline,
        config.monitor.max_drop,
    )
    return {metric: drop}


def held_out_score(logged: dict[str, float], metric: str) -> tuple[float | None, str]:
    """A registered version's figure of metric on rows no choice touched (its test rows) when its run logged one,
    else its best validation score; and which of the two it is."""
    test = metric.replace("val_", "test_", 1)
    if test in logged:
        return logged[test], "test"
    return logged.get(f"best_{metric}"), "validation"


def score_drop(config: Config, baseline: float | None, score: float | None) -> float | None:
    """How much worse score is than baseline in `promotion.metric`'s direction (negative: better); None without both."""
    if baseline is None or score is None or not math.isfinite(score):
        return None
    return (baseline - score) if config.promotion.mode == "max" else (score - baseline)


def log_to_version_run(config: Config, model: str, values: dict[str, float]) -> dict[str, float] | None:
    """values as metrics of the MLflow run behind a registered version's URI (models:/name/N); returns that run's
    metrics (the latest value of each, these included), or None for another URI."""
    import mlflow
    from mlflow.entities import Metric

    m = MODEL_URI.match(model or "")
    if m is None or m["version"] is None:
        return None
    scored = {k: v for k, v in values.items() if v is not None and math.isfinite(v)}
    uri = config.mlflow.tracking_uri
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    run_id = client.get_model_version(m["name"], m["version"]).run_id
    now = int(time.time())
    if scored:
        client.log_batch(run_id, metrics=[Metric(k, float(v), now * 1000, now) for k, v in scored.items()])
    return client.get_run(run_id).data.metrics
