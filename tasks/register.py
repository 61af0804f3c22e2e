"""Task: log the run to MLflow and register the selected checkpoint as a model version."""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlflow
from mlflow.entities import Metric
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from preprocessors.tabular import TabularPreprocessor
from tasks.common import retry_unless_user_error
from tasks.ingest import Ingested
from tasks.select import Selected
from tasks.train import TrainOutcome
from trainflow.config import Config
from trainflow.tracking import MODEL_CODE, ensure_experiment, example_input, flatten, signature_for, tracking


@dataclass
class Registered:
    run_id: str
    model_name: str
    model_version: str
    model_uri: str


def requirements(family: str) -> list[str]:
    """What the registered model needs to load: torch (trainflow's checkpoint code) and the family's library."""
    reqs = ["torch==2.13.0", "pyarrow", "pandas", "numpy", "scikit-learn"]
    if family == "xgboost":
        import xgboost

        reqs.append(f"xgboost-cpu=={xgboost.__version__}")
    elif family == "lightgbm":
        import lightgbm

        reqs.append(f"lightgbm=={lightgbm.__version__}")
    return reqs


def _run(config: Config, run_name: str):
    exp_id = ensure_experiment(config.mlflow.tracking_uri, config.mlflow.experiment)
    return mlflow.start_run(experiment_id=exp_id, run_name=run_name)


@task(name="register", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error, cache_policy=NO_CACHE)
def register(config: Config, ingested: Ingested, outcome: TrainOutcome, selected: Selected) -> Registered:
    """An MLflow run with params, per-epoch metrics and the checkpoint; a new registered model version."""
    prep = TabularPreprocessor.load(selected.path)
    lineage = {
        "trainflow.data_path": ingested.spec.path,
        "trainflow.data_fingerprint": ingested.spec.fingerprint,
        "trainflow.run_name": outcome.run_name,
        "trainflow.model_family": outcome.family,
        "trainflow.storage_path": config.storage_path,
        "trainflow.ray_run_path": outcome.run_path,
        "trainflow.checkpoint_path": selected.uri or selected.path,
        "trainflow.best_epoch": str(selected.epoch),
        "trainflow.prefect_flow_run_id": str(flow_run.get_id() or ""),
    }
    with tracking(config.mlflow.tracking_uri), _run(config, outcome.run_name) as run:
        mlflow.log_params({k: str(v)[:500] for k, v in flatten(config.for_family(outcome.family)).items()})
        mlflow.set_tags(lineage)
        # per epoch (boosting round), in batches: a booster's hundreds of rounds as one request each would take seconds
        now = int(time.time() * 1000)
        series = [Metric(k, float(v), now, int(row["epoch"])) for row in outcome.history for k, v in row.items() if k != "epoch"]
        for i in range(0, len(series), 1000):  # MLflow's limit per batch
            mlflow.MlflowClient().log_batch(run.info.run_id, metrics=series[i : i + 1000])
        mlflow.log_metrics({f"best_{k}": float(v) for k, v in selected.metrics.items() if isinstance(v, (int, float))})
        mlflow.log_artifacts(selected.path, artifact_path="checkpoint")
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=MODEL_CODE,
            artifacts={"checkpoint": selected.path},
            signature=signature_for(prep, ingested.spec.mlflow_types),
            input_example=example_input(prep, ingested.spec.mlflow_types),
            pip_requirements=requirements(outcome.family),
            registered_model_name=config.mlflow.registered_model,
        )
        version = str(info.registered_model_version)
        client = mlflow.MlflowClient()
        for key, value in lineage.items():
            client.set_model_version_tag(config.mlflow.registered_model, version, key, value)
    uri = f"models:/{config.mlflow.registered_model}/{version}"
    get_run_logger().info("MLflow run %s; registered %s", run.info.run_id, uri)
    return Registered(run_id=run.info.run_id, model_name=config.mlflow.registered_model, model_version=version, model_uri=uri)
