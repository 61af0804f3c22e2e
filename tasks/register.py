"""Task: log the run to MLflow and register the selected checkpoint as a model version."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import tempfile
from typing import Any
from pathlib import Path

import mlflow
from mlflow.data.meta_dataset import MetaDataset
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from trainflow.preprocessors.tabular import TabularPreprocessor
from trainflow.tasks.common import md, md_code, retry_unless_user_error
from trainflow.tables.sources import SOURCES
from trainflow.tasks.values import Ingested, Selected, TrainOutcome, Registered
from trainflow.config import Config
from trainflow.roles.folds import FoldPlan
from trainflow.run.redact import redact_text, redact_value
from trainflow.tasks.mlflow_run import REGISTER_KEY, find_run, log_params, log_rows, parent_key, run_key
from trainflow.tasks.model_package import MODEL_CODE, example_input, requirements, serving_code, signature_for
from trainflow.run.tracking import CHECKPOINT_KEY, PUBLISHED_TAG, ensure_experiment, tracking
from trainflow.trainer.serving.servable import checkpoint_families


def _warm_tag(path: str) -> dict[str, str]:
    """A warm-started checkpoint's source (train.warm_start): the version it continued, as a lineage tag."""
    from trainflow.trainer.serving.checkpoint import read_warm

    warm = read_warm(path)
    if not warm:
        return {}
    rounds = f", {warm['offset']} rounds" if warm.get("offset") else ""
    return {"trainflow.warm_start_from": f"{warm['from']} (version {warm['version']}{rounds})"}


@task(
    name="register", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error, cache_policy=NO_CACHE
)
def register(
    config: Config, ingested: Ingested, outcome: TrainOutcome, selected: Selected, plan: FoldPlan | None = None
) -> Registered:
    """An MLflow run with params, per-epoch metrics and the checkpoint (with plan: its split.json, which rows it
    never trained or chose on); a new registered model version."""
    prep = TabularPreprocessor.load(selected.path)
    if plan is not None:
        plan.save(selected.path)
    lineage = {
        "trainflow.data_path": ingested.spec.path,
        "trainflow.data_fingerprint": ingested.spec.fingerprint,
        **(
            {"trainflow.data_snapshot": json.dumps(ingested.spec.snapshot, sort_keys=True)}
            if ingested.spec.snapshot
            else {}
        ),
        "trainflow.run_name": outcome.run_name,
        "trainflow.model_family": outcome.family,
        "trainflow.storage_path": config.storage_path,
        "trainflow.ray_run_path": outcome.run_path,
        "trainflow.checkpoint_path": selected.uri or selected.path,
        "trainflow.best_epoch": str(selected.epoch),
        "trainflow.prefect_flow_run_id": str(flow_run.get_id() or ""),
        "trainflow.config_hash": config.training_hash(outcome.family),
        **({"trainflow.split": plan.describe()[:5000]} if plan is not None else {}),  # roles, by time: their ranges
        **_warm_tag(selected.path),
    }
    # one version per selected checkpoint: the same checkpoint of the same data and training config, registered
    # by a start of this retrain that was killed before it finished, is found again (a digest: paths may hold quotes)
    lineage[CHECKPOINT_KEY] = hashlib.blake2b(
        "\x1f".join(
            [
                config.mlflow.registered_model,
                selected.uri or selected.path,
                ingested.spec.fingerprint,
                lineage["trainflow.config_hash"],
            ]
        ).encode(),
        digest_size=16,
    ).hexdigest()
    lineage = redact_value(lineage)
    # one MLflow run and one version per training run: a retried task (or flow run) finds its earlier attempt
    key = run_key(outcome.run_name, outcome.family)
    with tracking(config.mlflow.tracking_uri):
        exp_id = ensure_experiment(config.mlflow.tracking_uri, config.mlflow.experiment)
        run_id = find_run(mlflow.MlflowClient(), exp_id, key)  # the train task's, or an earlier attempt's
        versions = mlflow.MlflowClient().search_model_versions(f"run_id = '{run_id}'") if run_id else []
        if not versions:  # a rerun of a killed start: its run (and version, when it got that far)
            run_id, versions = registered_before(config, exp_id, lineage[CHECKPOINT_KEY]) or (run_id, [])
        version = str(versions[0].version) if versions else None
        if version is None:
            run_id, version = _log_and_register(
                config, ingested, outcome, selected, prep, lineage, exp_id, run_id, key, plan
            )
        else:
            get_run_logger().info("register: this training run is already version %s (run %s)", version, run_id)
        client = mlflow.MlflowClient()
        for k, value in lineage.items():
            client.set_model_version_tag(config.mlflow.registered_model, version, k, value)
    uri = f"models:/{config.mlflow.registered_model}/{version}"
    get_run_logger().info("MLflow run %s; registered %s", run_id, uri)
    return Registered(run_id=run_id, model_name=config.mlflow.registered_model, model_version=version, model_uri=uri)


def log_datasets(
    config: Config, ingested: Ingested, plan: FoldPlan | None = None, prep: TabularPreprocessor | None = None
) -> None:
    """The training and validation tables as the active run's MLflow dataset inputs: source data.path, digest
    trainflow's fingerprint (the validation split's: with the split settings), the schema (every feature column and
    the label, as MLflow types) and a profile (rows of the table and of each role, the fitted training rows' missing
    values per column); nothing loaded."""
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.types import ColSpec, Schema

    snapshot = ingested.spec.snapshot  # a Delta or Iceberg table's snapshot, or a PostgreSQL source's copy
    path = redact_text(snapshot["location"] if snapshot else ingested.spec.path)  # a URI's credentials masked
    with warnings.catch_warnings():  # a local path reads as more than one kind of source; MLflow picks the local one
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(path)
    fp = ingested.spec.fingerprint.split(":", 1)[-1]
    split = hashlib.blake2b(
        f"{fp}:{json.dumps(config.split.model_dump(mode='json'), sort_keys=True)}".encode(), digest_size=16
    ).hexdigest()
    name = path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    if snapshot and getattr(SOURCES.get(snapshot.get("format")), "kind", None) == "query":  # a query's copy, by when
        name = f"{snapshot.get('table') or 'query'}@{snapshot['copied_at']}"
    elif snapshot:
        name = f"{ingested.spec.path.rstrip('/').rsplit('/', 1)[-1]}@{snapshot['snapshot']}"
    spec = ingested.spec
    schema = Schema([ColSpec(t, c) for c, t in spec.mlflow_types.items()]) if spec.mlflow_types else None
    counts = (plan.counts if plan is not None else None) or {}
    missing = (prep.baseline.get("columns") or {}) if prep is not None else {}  # the fitted training rows' counts
    profile = {
        "table_rows": spec.rows,
        "columns": len(spec.feature_order) + 1,
        "task": config.task,
        **{f"{role}_rows": n for role, n in counts.items() if " " not in role},
        "folds": plan.folds if plan is not None else 1,
        **({"snapshot": snapshot} if snapshot else {}),
        # the columns with any missing value, the most missing first, at most 200 (a wide table's profile stays small)
        "missing_rate": dict(
            sorted(
                ((c, round(b["nulls"] / b["rows"], 6)) for c, b in missing.items() if b.get("rows") and b.get("nulls")),
                key=lambda kv: -kv[1],
            )[:200]
        ),
    }
    for context, digest in (("training", fp), ("validation", split)):
        mlflow.log_input(
            _ProfiledDataset(source, name=f"{name} ({context})", digest=digest[:32], schema=schema, profile=profile),
            context=context,
        )


class _ProfiledDataset(MetaDataset):
    """MLflow's metadata-only dataset with a profile (MetaDataset keeps none): what MLflow shows beside the schema."""

    def __init__(self, *args: Any, profile: dict[str, Any] | None = None, **kwargs: Any):
        self._profile = profile
        super().__init__(*args, **kwargs)

    @property
    def profile(self) -> dict[str, Any] | None:
        return self._profile

    def to_dict(self) -> dict[str, str]:
        return {**super().to_dict(), **({"profile": json.dumps(self._profile)} if self._profile else {})}


def registered_before(config: Config, exp_id: str, checkpoint_key: str) -> tuple[str, list[Any]] | None:
    """(the MLflow run, its versions of the registered model) that an earlier start registered this checkpoint in
    (or began to: a run without a version is logged into again), or None."""
    client = mlflow.MlflowClient()
    runs = client.search_runs(
        [exp_id], filter_string=f"tags.`{CHECKPOINT_KEY}` = '{checkpoint_key}'", order_by=["attributes.start_time ASC"]
    )
    for run in runs:
        versions = [
            v
            for v in client.search_model_versions(f"run_id = '{run.info.run_id}'")
            if v.name == config.mlflow.registered_model
        ]
        if versions:
            return run.info.run_id, versions
    return (runs[-1].info.run_id, []) if runs else None


def _log_and_register(
    config: Config,
    ingested: Ingested,
    outcome: TrainOutcome,
    selected: Selected,
    prep: TabularPreprocessor,
    lineage: dict[str, str],
    exp_id: str,
    run_id: str | None,
    key: str,
    plan: FoldPlan | None = None,
) -> tuple[str, str]:
    """Log params, metrics and the checkpoint into the run (a new one, or the earlier attempt's) and register it."""
    parent = find_run(mlflow.MlflowClient(), exp_id, parent_key()) if not run_id else None  # the retrain's run
    tags = {**({REGISTER_KEY: key} if key else {}), **({"mlflow.parentRunId": parent} if parent else {})}
    with mlflow.start_run(
        run_id=run_id,
        experiment_id=None if run_id else exp_id,
        run_name=None if run_id else outcome.run_name,
        tags=tags if tags and not run_id else None,
    ) as run:
        if run_id is None:  # no train task opened it (outside a flow run): params and history now
            log_params(config.mlflow.tracking_uri, run.info.run_id, config, outcome.family)
            log_rows(config.mlflow.tracking_uri, run.info.run_id, outcome.history)
        mlflow.set_tags(lineage)
        log_datasets(config, ingested, plan, prep)
        chose = "oof_" if outcome.budget.get("folds") else "val_"  # the rows that chose it, in the metric's name
        mlflow.log_metrics(
            {
                f"best_{chose}{k[4:]}" if k.startswith("val_") else f"best_{k}": float(v)
                for k, v in selected.metrics.items()
                if isinstance(v, (int, float))
            }
        )
        mlflow.log_artifacts(selected.path, artifact_path="checkpoint")
        with tempfile.TemporaryDirectory(prefix="trainflow-code-") as code:
            info = mlflow.pyfunc.log_model(
                name="model",
                python_model=MODEL_CODE,
                artifacts={"checkpoint": selected.path},
                code_paths=serving_code(
                    Path(code), config.for_family(outcome.family).model.class_path
                ),  # served where trainflow is not installed
                signature=signature_for(prep, ingested.spec.mlflow_types),
                input_example=example_input(prep, ingested.spec.mlflow_types),
                pip_requirements=requirements(checkpoint_families(selected.path)),
                registered_model_name=config.mlflow.registered_model,
            )
        return run.info.run_id, str(info.registered_model_version)


def _note(summary: dict[str, Any]) -> str:
    """Why the test figures read fewer rows than the test role holds (a warm start's), as the description says it."""
    return f"; {md(summary['test_rows_note'])}" if summary.get("test_rows_note") else ""


def describe_version(config: Config, summary: dict[str, Any]) -> None:
    """The registered version's description, as a reviewer reads it in MLflow: the family, the data, the scores on
    rows no choice touched and the gate's decision. Best effort: the version and its tags are what count."""
    version, promotion = summary.get("model_version"), summary.get("promotion") or {}
    if version is None:
        return
    test = ", ".join(
        f"{k} {v:.4g}" for k, v in (summary.get("test_metrics") or {}).items() if isinstance(v, (int, float))
    )
    text = (
        # Markdown, as MLflow renders it: names from storage in code spans (a path's underscores are no emphasis),
        # text from the data (a slice's value in the gate's reason) escaped: MLflow shows raw HTML
        f"trainflow {md(summary.get('model_family'))} trained on {md_code(redact_text(str(summary.get('data_path'))))} "
        f"({summary.get('training_rows')} rows, fingerprint {md_code(summary.get('data_fingerprint'))}), run "
        f"{md_code(summary.get('run_name'))}. "
        + (f"Test ({summary.get('test_rows')} rows no choice touched{_note(summary)}): {test}. " if test else "")
        + f"Gate: {md(promotion.get('decision'))}: {md(promotion.get('reason'))}"
    )
    uri = config.mlflow.tracking_uri
    try:
        client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
        client.update_model_version(config.mlflow.registered_model, str(version), description=text[:5000])
        # the last record of a retrain: until it is there, a rerun on the same data finishes the publishing
        client.set_model_version_tag(
            config.mlflow.registered_model,
            str(version),
            PUBLISHED_TAG,
            dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        )
    except Exception as exc:  # noqa: BLE001 - a tracking blip must not fail a registered, gated model
        get_run_logger().warning("could not describe %s version %s: %s", config.mlflow.registered_model, version, exc)
