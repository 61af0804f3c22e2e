"""Serve the deployments declared in deployments/prefect.yaml from one process: no work pool, no worker."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import yaml
from prefect import serve
from prefect.deployments.runner import EntrypointType, RunnerDeployment
from prefect.client.schemas.schedules import construct_schedule
from prefect.events import DeploymentEventTrigger

from trainflow.errors import ConfigError
from trainflow.run.services import WAITS, prefect_retries

PREFECT_FILE = Path(__file__).resolve().parents[1] / "deployments" / "prefect.yaml"


def _schedule(spec: dict[str, Any], where: str) -> dict[str, Any]:
    """A prefect.yaml schedule entry as `to_deployment` takes it, built by Prefect's own constructor."""
    fields = {k: spec[k] for k in ("interval", "anchor_date", "cron", "rrule", "timezone") if k in spec}
    try:
        return {"schedule": construct_schedule(**fields), "active": spec.get("active", True)}
    except ValueError as exc:
        raise ConfigError(f"{where}: schedule {spec}: {exc}") from None


def runner_deployments(
    prefect_file: str | Path = PREFECT_FILE, parameters: dict[str, Any] | None = None
) -> list[RunnerDeployment]:
    """The prefect.yaml deployments as in-process runner deployments, with parameters layered on top."""
    prefect_file = Path(prefect_file).resolve()
    root = prefect_file.parents[1]  # deployments/prefect.yaml sits one level under the repository root
    try:
        spec = yaml.safe_load(prefect_file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"deployment file not found: {prefect_file}") from None
    out = []
    for dep in spec.get("deployments") or []:
        where = f"{prefect_file}: deployment {dep.get('name')!r}"
        module, _, attr = dep["entrypoint"].partition(":")
        params = {**(dep.get("parameters") or {}), **(parameters or {})}
        if params.get("config_path") and not Path(params["config_path"]).is_absolute():
            params["config_path"] = str(root / params["config_path"])
        # entrypoints are files relative to the repository root; the same files are installed as packages
        flow_obj = getattr(importlib.import_module("trainflow." + module.removesuffix(".py").replace("/", ".")), attr)
        out.append(
            flow_obj.to_deployment(
                name=dep["name"],
                description=dep.get("description"),
                parameters=params,
                schedules=[_schedule(s, where) for s in dep.get("schedules") or []],
                concurrency_limit=dep.get("concurrency_limit"),
                triggers=[
                    DeploymentEventTrigger(**{k: v for k, v in t.items() if k != "type"})
                    for t in dep.get("triggers") or []
                ],
                tags=dep.get("tags"),
                # by module (trainflow is installed): a run loads the flow without a working-directory path, which a
                # deployment of the same name made earlier by `prefect deploy` would otherwise leave unset
                entrypoint_type=EntrypointType.MODULE_PATH,
            )
        )
    if not out:
        raise ConfigError(f"{prefect_file}: no deployments declared")
    return out


def serve_all(
    prefect_file: str | Path = PREFECT_FILE, config_path: str | None = None, limit: int | None = None
) -> None:
    """Register and run the deployments until interrupted (Ctrl-C pauses their schedules)."""
    params = {"config_path": str(Path(config_path).resolve())} if config_path else None
    # the runs it starts inherit this process's environment: their Prefect client waits out an API away as long as
    # the deployed runs do (deployments/prefect.yaml's job variables), unless the user set it
    os.environ.setdefault("PREFECT_CLIENT_MAX_RETRIES", str(prefect_retries(WAITS.prefect)))
    serve(*runner_deployments(prefect_file, params), limit=limit)
