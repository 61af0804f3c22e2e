"""Task: which columns the new model relies on (permutation importance on a bounded validation sample), beside the
champion's, logged to the model version's MLflow run as data (JSON) for the next run to compare with."""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trainflow.data import Rows, first_rows
from trainflow.config import Config
from trainflow.tasks.values import Promotion, Registered
from trainflow.run.tracking import mlflow_key
from trainflow.trainer.importance import feature_importance
from trainflow.trainer.serving.servable import load_servable

IMPORTANCE_ROWS = 2000  # validation rows permuted: enough to rank columns, a few seconds for any family
IMPORTANCE_FILE = "feature_importance.json"


def champion_importance(client: mlflow.MlflowClient, name: str, version: str | None) -> dict[str, float]:
    """column -> importance recorded by a version's own run ({} when it has none: older versions, a failed log)."""
    if version is None:
        return {}
    try:
        run_id = client.get_model_version(name, version).run_id
        with tempfile.TemporaryDirectory() as tmp:
            path = client.download_artifacts(run_id, IMPORTANCE_FILE, tmp)
            rows = json.loads(Path(path).read_text())["columns"]
        return {str(r["column"]): float(r["importance"]) for r in rows}
    except Exception:  # noqa: BLE001 - a missing comparison is reported as such, never fails the run
        return {}


@task(name="explain", retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE)
def explain(
    config: Config, holdout: Rows, checkpoint_path: str, promotion: Promotion, registered: Registered
) -> list[dict[str, Any]]:
    """Permutation importance of every feature column on up to IMPORTANCE_ROWS validation rows (seeded by
    split.seed), on promotion.metric; for tree families their gain share too; with the change against the champion
    the gate compared with."""
    servable = load_servable(checkpoint_path)
    prep = servable.preprocessor
    sample = first_rows(holdout, list(dict.fromkeys([*prep.feature_order, prep.label])), IMPORTANCE_ROWS)
    metric, mode = config.promotion.metric, config.promotion.mode
    rows = feature_importance(servable, sample, metric, mode, seed=config.split.seed)
    uri = config.mlflow.tracking_uri
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    compared = promotion.champion_version if promotion.champion_version != registered.model_version else None
    theirs = champion_importance(client, registered.model_name, compared)
    for row in rows:
        if row["column"] in theirs:
            row["champion_importance"] = theirs[row["column"]]
            row["change"] = row["importance"] - theirs[row["column"]]
    client.log_dict(
        registered.run_id, {"metric": metric, "mode": mode, "rows": sample.num_rows, "columns": rows}, IMPORTANCE_FILE
    )
    now = int(time.time() * 1000)
    client.log_batch(
        registered.run_id,
        metrics=[
            Metric(mlflow_key(f"importance.{r['column']}"), r["importance"], now, 0)
            for r in rows[:900]
            if math.isfinite(r["importance"])
        ],
    )
    get_run_logger().info(
        "feature importance (%s, %d rows): %s",
        metric,
        sample.num_rows,
        ", ".join(f"{r['column']} {r['importance']:.4g}" for r in rows[:10]),
    )
    return rows
