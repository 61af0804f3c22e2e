"""One MLflow run per trained family, opened when its fit starts: params at once, metrics as each report arrives,
the rest of the per-epoch history after the fit; register finds the same run (by its key) and adds the model."""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import mlflow
from mlflow.entities import Metric, Param
from prefect.runtime import flow_run

from trainflow.config import Config
from trainflow.run.redact import redact_config
from trainflow.run.storage import process_alive
from trainflow.tasks.common import task_logger
from trainflow.run.tracking import RETRAIN_TAG, ensure_experiment, flatten, mlflow_key, tracking

REGISTER_KEY = "trainflow.register_key"


def run_key(run_name: str, family: str) -> str:
    """The key a flow run's training of one family is found by (empty outside a flow run)."""
    flow_run_id = str(flow_run.get_id() or "")
    return f"{flow_run_id}:{run_name}:{family}" if flow_run_id else ""


def find_run(client: mlflow.MlflowClient, exp_id: str, key: str) -> str | None:
    if not key:
        return None
    runs = client.search_runs([exp_id], filter_string=f"tags.`{REGISTER_KEY}` = '{key}'", max_results=1)
    return runs[0].info.run_id if runs else None


PARENT = "retrain"  # the family name of a flow run's parent run, in its key


def open_run(config: Config, run_name: str, family: str) -> str:
    """The family's MLflow run in this flow run (a retried task finds its own), with the config's params; nested
    under the flow run's parent run (open_parent) when it has one."""
    uri = config.mlflow.tracking_uri
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    with tracking(uri):
        exp_id = ensure_experiment(uri, config.mlflow.experiment)
    key = run_key(run_name, family)
    run_id = find_run(client, exp_id, key)
    if run_id is None:
        parent = find_run(client, exp_id, parent_key())
        tags = {**({REGISTER_KEY: key} if key else {}), **({"mlflow.parentRunId": parent} if parent else {})}
        run_id = client.create_run(exp_id, run_name=run_name, tags=tags or None).info.run_id
        log_params(uri, run_id, config, family)
    return run_id


def parent_key() -> str:
    """The key of this flow run's parent run (empty outside a flow run: no parent)."""
    flow_run_id = str(flow_run.get_id() or "")
    return f"{flow_run_id}:{PARENT}" if flow_run_id else ""


def open_parent(config: Config, run_name: str) -> str | None:
    """One MLflow run for the whole retrain (the flow run), found again by a retried flow run: every family's run
    and the ensemble's nest under it; the summary ends up on it (end_parent). None outside a flow run."""
    key = parent_key()
    if not key:
        return None
    uri = config.mlflow.tracking_uri
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    with tracking(uri):
        exp_id = ensure_experiment(uri, config.mlflow.experiment)
    run_id = find_run(client, exp_id, key)
    if run_id is None:
        run_id = client.create_run(
            exp_id,
            run_name=run_name,
            tags={
                REGISTER_KEY: key,
                "trainflow.prefect_flow_run_id": key.split(":")[0],
                RETRAIN_TAG: run_name,
                PROCESS_TAG: f"{socket.gethostname()}:{os.getpid()}",
                "mlflow.note.content": f"trainflow retrain {run_name}: one nested run per model family (and the ensemble)",
            },
        ).info.run_id
    end_earlier_starts(client, exp_id, run_name, run_id)
    return run_id


def end_earlier_starts(
    client: mlflow.MlflowClient | None, exp_id: str | None, run_name: str, own: str | None, config: Config | None = None
) -> None:
    """end_stale_runs as housekeeping: an error is a warning, and the run goes on. Without a client (a rerun that
    finds nothing to train, after a start killed once the champion's gate had recorded): config's experiment."""
    try:
        if client is None and config is not None:
            uri = config.mlflow.tracking_uri
            client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
            experiment = client.get_experiment_by_name(config.mlflow.experiment)
            exp_id = experiment.experiment_id if experiment else None
        if client is None or exp_id is None:
            return
        end_stale_runs(client, exp_id, run_name, own)
    except Exception as exc:  # noqa: BLE001 - those runs stay as they are
        task_logger("mlflow").warning(
            "the MLflow runs of earlier starts of %s were not checked (%s: %s); a killed start's runs may stay RUNNING",
            run_name,
            type(exc).__name__,
            exc,
        )


PROCESS_TAG = "trainflow.process"  # "host:pid" of the process that opened a parent run
ENDED_BY_TAG = "trainflow.ended_by"


def end_stale_runs(client: mlflow.MlflowClient, exp_id: str, run_name: str, own: str | None) -> list[str]:
    """An earlier start of this retrain (the same run name) killed without ending its MLflow runs (SIGKILL, a lost
    machine, a stop while a family trained): the RUNNING runs nested under its parent run, and that parent when still
    RUNNING, end KILLED, tagged with why, when this rerun starts. Only a process known gone counts: one on this host
    whose pid no longer exists. A run opened on another host, or by a live process (a run of the same name at the
    same time), is left as it is. The ids ended."""
    ended = []
    for parent in client.search_runs([exp_id], filter_string=f"tags.`{RETRAIN_TAG}` = '{run_name}'"):
        host, _, pid = parent.data.tags.get(PROCESS_TAG, "").rpartition(":")
        if parent.info.run_id == own or host != socket.gethostname() or not pid.isdigit() or process_alive(int(pid)):
            continue
        children = client.search_runs(
            [exp_id],
            filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}' and attributes.status = 'RUNNING'",
        )
        why = f"its process ({host}, pid {pid}) ended without ending this run; found by " + (
            f"the rerun's parent run {own}" if own else "a rerun that had nothing to train"
        )
        for run in [*children, *([parent] if parent.info.status == "RUNNING" else [])]:
            client.set_tag(run.info.run_id, ENDED_BY_TAG, why)
            client.set_terminated(run.info.run_id, "KILLED")
            ended.append(run.info.run_id)
    if ended:
        task_logger("mlflow").info(
            "ended %d MLflow run(s) of an earlier start of %s KILLED: its process is gone", len(ended), run_name
        )
    return ended


def parent_run(config: Config) -> str | None:
    """The id of this flow run's parent run (open_parent), or None (none opened, outside a flow run)."""
    uri = config.mlflow.tracking_uri
    with tracking(uri):
        exp_id = ensure_experiment(uri, config.mlflow.experiment)
    return find_run(mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri), exp_id, parent_key())


LEADERBOARD_FILE = "leaderboard.json"


def leaderboard_table(summary: dict[str, Any]) -> dict[str, list]:
    """The candidates (every family that trained, and the ensemble), best first, as columns: family, each
    validation (or out-of-fold) and test figure, the epochs or rounds kept and run, the training seconds."""
    rows = summary.get("candidates") or []
    skip = {"run_name", "checkpoint", "resumed", "recoveries"}
    columns = list(dict.fromkeys(k for r in rows for k in r if k not in skip))
    table = {c: [r.get(c) for r in rows] for c in columns}
    if any(r.get("resumed") or r.get("recoveries") for r in rows):  # what the fits went through, counted
        table["recovered"] = [
            f"{len(r.get('resumed') or [])} resume(s), {len(r.get('recoveries') or [])} recovery(ies)" for r in rows
        ]
    return table


def end_parent(config: Config, status: str, summary: dict[str, Any] | None = None) -> None:
    """End this flow run's parent run with status (FINISHED, FAILED, KILLED), with the summary (summary.json) and
    the candidates' leaderboard (leaderboard.json, a table MLflow shows) as its artifacts when given. Best effort,
    like end_runs."""
    uri = config.mlflow.tracking_uri
    try:
        client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
        run_id = parent_run(config)
    except Exception as exc:  # noqa: BLE001 - a tracking blip must not undo finished training
        task_logger("mlflow").warning("could not end the retrain's MLflow run %s: %s", status, exc)
        return
    if run_id is None:
        return
    try:
        if summary is not None:
            client.log_text(run_id, json.dumps(summary, indent=2, default=str), "summary.json")
            if summary.get("recovered"):  # which families resumed or recovered, searchable
                from trainflow.tasks.values import describe_recovered

                client.set_tag(run_id, "trainflow.recovered", describe_recovered(summary["recovered"])[:5000])
            if summary.get("candidates"):
                client.log_table(run_id, leaderboard_table(summary), LEADERBOARD_FILE)
    except Exception as exc:  # noqa: BLE001 - the record is best effort; the run still ends with its status below
        task_logger("mlflow").warning("could not record the retrain's summary in MLflow run %s: %s", run_id, exc)
    try:
        client.set_terminated(run_id, status)
    except Exception as exc:  # noqa: BLE001 - a tracking blip must not undo finished training
        task_logger("mlflow").warning("could not end the retrain's MLflow run %s: %s", status, exc)


def end_runs(config: Config, run_names: list[str], family: str, status: str) -> None:
    """Mark this flow run's MLflow runs of family under run_names ended with status (FINISHED, FAILED): runs nothing
    will log to again (fold models once bagged, a family left out). Best effort: the training already happened."""
    uri = config.mlflow.tracking_uri
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    try:
        with tracking(uri):
            exp_id = ensure_experiment(uri, config.mlflow.experiment)
        for name in run_names:
            run_id = find_run(client, exp_id, run_key(name, family))
            if run_id is not None:
                client.set_terminated(run_id, status)
    except Exception as exc:  # noqa: BLE001 - a tracking blip must not undo finished training
        task_logger("mlflow").warning("could not mark the MLflow runs of %s %s: %s", family, status, exc)


def log_params(uri: str, run_id: str, config: Config, family: str) -> None:
    """The family's resolved config as flat params, secrets masked (MLflow takes at most 100 per request)."""
    items = [
        (mlflow_key(k), str(v)[:500]) for k, v in flatten(redact_config(config.for_family(family).to_dict())).items()
    ]
    client = mlflow.MlflowClient(tracking_uri=uri)
    dropped = []
    for i in range(0, len(items), 100):
        batch = items[i : i + 100]
        try:
            client.log_batch(run_id, params=[Param(k, v) for k, v in batch])
        except mlflow.exceptions.MlflowException:
            # one refused param fails its whole batch: log them one by one, and say which were refused
            for k, v in batch:
                try:
                    client.log_param(run_id, k, v)
                except mlflow.exceptions.MlflowException as exc:
                    dropped.append(f"{k} ({exc.message.splitlines()[0][:120]})")
    if dropped:
        task_logger("mlflow").warning(
            "MLflow refused %d of %d config params of run %s: %s",
            len(dropped),
            len(items),
            run_id,
            "; ".join(dropped[:10]),
        )


def metrics_of(row: dict[str, Any], now_ms: int) -> list[Metric]:
    """A report's or history row's numbers as MLflow metrics at step = its epoch (boosting round)."""
    step = int(row.get("epoch", 0))
    return [
        Metric(k, float(v), now_ms, step)
        for k, v in row.items()
        if k not in ("epoch", "reported_at") and isinstance(v, (int, float)) and not isinstance(v, bool)
    ]


def tag_run(uri: str, run_id: str, key: str, value: str) -> None:
    """One tag on a run (MLflow keeps at most 8,000 characters of a tag's value)."""
    mlflow.MlflowClient(tracking_uri=uri).set_tag(run_id, key, value[:8000])


def log_rows(uri: str, run_id: str, rows: list[dict[str, Any]]) -> None:
    """Metrics of rows, in batches (MLflow takes at most 1,000 per request)."""
    client = mlflow.MlflowClient(tracking_uri=uri)
    now = int(time.time() * 1000)
    series = [m for row in rows for m in metrics_of(row, now)]
    for i in range(0, len(series), 1000):
        client.log_batch(run_id, metrics=series[i : i + 1000])
