"""What every command that runs a flow shares: the config loaded and checked before anything starts, small work
answered in this process, otherwise Ray and Prefect's temporary server started while the flow imports, then the flow
run with the command's arguments."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainflow.flows.cli.parser import parse_overrides
from trainflow.run.runtime import stop_requested
from trainflow.run.storage import check_run_name


def check_approval(config, args: argparse.Namespace) -> None:
    """A required approval nobody here could answer: refused at once (the check's module imports torch and Prefect,
    seconds a run without approval starts its services in instead)."""
    if config.promotion.approval == "required":
        from trainflow.tasks.approval import check_answerable

        check_answerable(config, getattr(args, "approve", None) is not None)


@dataclass(frozen=True)
class FlowCommand:
    """name: the command; flow: "module:function" of its flow; named: the arguments passed to the flow besides
    config_path and overrides; check(config, args): refusals before anything starts; preflight: the columns the
    config names checked from the files' metadata first (unlabelled_ok: rows without a label are left out, not
    refused); prepare_store: a first run's MLflow tables made while the server starts; needs_ray(config): False
    when no step of the run reads through Ray."""

    name: str
    flow: str
    named: tuple[str, ...] = ()
    check: Callable[[Any, argparse.Namespace], None] | None = None
    preflight: bool = False
    unlabelled_ok: bool = False
    prepare_store: bool = False
    needs_ray: Callable[[Any], bool] = lambda config: True

    def run(self, args: argparse.Namespace) -> dict[str, Any] | None:
        from trainflow.config import load_config

        overrides = parse_overrides(getattr(args, "set", []))
        if getattr(args, "run_name", None) is not None:  # a name that cannot be a folder: refused before any work
            check_run_name(args.run_name)
        config = load_config(args.config, overrides)  # fail fast on a bad config, before Prefect and Ray start
        if config.task_inferred:
            print(f"trainflow: {config.task_inferred}", file=sys.stderr)
        if self.check is not None:
            self.check(config, args)
        if self.preflight:
            from trainflow.flows.local import preflight

            # the columns the config names, from the files' metadata: seconds, before anything starts
            preflight(config, getattr(args, "run_name", None), unlabelled_ok=self.unlabelled_ok)
        from trainflow.flows.local import run_here
        from trainflow.run.services import wait_for_prefect

        wait_for_prefect()  # a configured Prefect API that does not answer yet is waited for (services.prefect_wait_s)
        summary = run_here(self.name, config, args)  # small work with no Prefect API: answered here, in seconds
        if summary is not None:
            return summary
        return self._flow_run(config, args, overrides)

    def _flow_run(self, config, args: argparse.Namespace, overrides: dict[str, Any]) -> dict[str, Any] | None:
        from trainflow.run.runtime import (
            local_flow_settings,
            start_prefect_server_in_background,
            start_ray_in_background,
            temporary_server,
        )
        from trainflow.run.services import prefect_client_retries

        # Ray and Prefect's temporary server come up while this process imports the flow
        if self.needs_ray(config):
            start_ray_in_background(**config.ray_start)
        server = start_prefect_server_in_background()
        module, function = self.flow.split(":")
        flow = getattr(importlib.import_module(module), function)
        if self.prepare_store:
            from trainflow.run.tracking import prepare_store

            prepare_store(config.mlflow.tracking_uri)  # a first run's MLflow tables, while the server starts
        if server is not None:
            server.join()
        if stop_requested():  # a SIGTERM during start-up: no flow run starts (main() reports the stop)
            raise InterruptedError("stopped by SIGTERM before the flow started")
        if server is not None:
            temporary_server().start()  # a no-op once it answers; a background start that failed is tried again
        params = {"config_path": str(Path(args.config).resolve()), "overrides": overrides or None}
        extra = {name: getattr(args, name) for name in self.named}
        # the API gone mid-run is waited out as long (services.prefect_wait_s)
        with prefect_client_retries(), local_flow_settings():
            return flow(**params, **extra)
