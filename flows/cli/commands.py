"""What each command does once its arguments are parsed: the work commands run their flow (or answer here when
small), init, config, champion and sample answer in this process."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from trainflow.errors import TrainflowError
from trainflow.flows.cli.parser import parse_overrides
from trainflow.runtime import stop_requested
from trainflow.storage import replace_bytes, write_new


def write_out(path: str, text: str, replace: bool = True) -> None:
    """Write a file the user named, whole (storage.replace_bytes); replace=False: never over a file that exists,
    even one that appeared while it was written (storage.write_new)."""
    target = str(Path(path).resolve())
    if replace:
        replace_bytes(target, text.encode())
        return
    try:
        write_new(target, text.encode())
    except FileExistsError:
        raise TrainflowError(f"{path} exists; choose another file or add --force to replace it") from None


def run_command(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.command == "sample":
        from trainflow.sample import write_sample

        paths = write_sample(args.out, rows=args.rows, score_rows=args.score_rows, seed=args.seed, force=args.force)
        for p in paths:
            print(p)
        return None
    if args.command == "init":
        return _init(args)
    if args.command == "config":
        return _config_command(args)
    if args.command == "champion":
        return _champion_command(args)
    if args.command == "gc":
        return _gc(args)
    from trainflow.config import load_config

    if args.command == "serve":
        from trainflow.flows.serve import PREFECT_FILE, serve_all

        if args.config:
            load_config(args.config)
        serve_all(args.prefect_file or PREFECT_FILE, args.config, args.limit)
        return None
    overrides = parse_overrides(getattr(args, "set", []))
    config = load_config(args.config, overrides)  # fail fast on a bad config, before Prefect and Ray start
    if config.task_inferred:
        print(f"trainflow: {config.task_inferred}", file=sys.stderr)
    if args.command == "tune":
        config.require_tune()
        if args.resume and not args.run_name:
            raise TrainflowError("tune --resume needs the --run-name of the sweep to restore")
    # a required approval nobody here could answer: refused at once (the check's module imports torch and Prefect,
    # seconds a run without approval starts its services in instead)
    if args.command in ("retrain", "tune") and config.promotion.approval == "required":
        from trainflow.tasks.approval import check_answerable

        check_answerable(config, getattr(args, "approve", None) is not None)
    if args.command == "replay":  # refused before anything starts: the key, the period, the policies
        from trainflow.flows.replay import check_request

        check_request(config, args.every, args.policies, args.start, args.end)
    if args.command in ("retrain", "tune", "validate", "replay"):
        from trainflow.flows.local import preflight

        # the columns the config names, from the files' metadata: seconds, before anything starts (a replay leaves
        # out and counts the rows whose label is missing)
        preflight(config, getattr(args, "run_name", None), unlabelled_ok=args.command == "replay")
    from trainflow.flows.local import run_here
    from trainflow.runtime import local_flow_settings
    from trainflow.services import prefect_client_retries, wait_for_prefect

    wait_for_prefect()  # a configured Prefect API that does not answer yet is waited for (services.prefect_wait_s)
    summary = run_here(args.command, config, args)  # small work with no Prefect API: answered here, in seconds
    if summary is not None:
        return summary
    from trainflow.flows.local import scored_in_process
    from trainflow.runtime import start_prefect_server_in_background, start_ray_in_background, temporary_server

    # Ray and Prefect's temporary server come up while this process imports the flow (Ray not for a predict that
    # scores its table in this process: no step of it needs Ray)
    if not (args.command == "predict" and scored_in_process(config)):
        start_ray_in_background(**config.ray_start)
    server = start_prefect_server_in_background()
    flow = _flow(args.command)
    if args.command in ("retrain", "tune", "replay"):
        from trainflow.tracking import prepare_store

        prepare_store(config.mlflow.tracking_uri)  # a first run's MLflow tables, while the server starts
    if server is not None:
        server.join()
    if stop_requested():  # a SIGTERM during start-up: no flow run starts (main() reports the stop)
        raise InterruptedError("stopped by SIGTERM before the flow started")
    if server is not None:
        temporary_server().start()  # a no-op once it answers; a background start that failed is tried again, and raises
    params = {"config_path": str(Path(args.config).resolve()), "overrides": overrides or None}
    named = {
        "retrain": ("run_name", "force", "wait", "approve"),
        "tune": ("run_name", "resume", "wait"),
        "monitor": ("labels",),
        "validate": (),
        "predict": ("model",),
        "replay": ("every", "start", "end", "policies", "run_name"),
    }[args.command]
    extra = {name: getattr(args, name) for name in named}
    # the API gone mid-run is waited out as long (services.prefect_wait_s)
    with prefect_client_retries(), local_flow_settings():
        return flow(**params, **extra)


def _init(args: argparse.Namespace) -> None:
    from trainflow.scaffold import scaffold

    if Path(args.out).exists() and not args.force:
        raise TrainflowError(f"--out {args.out} exists; choose another file or add --force to replace it")
    text = scaffold(args.data, args.label, args.out)
    write_out(args.out, text, replace=args.force)  # a file that appeared meanwhile is not replaced
    print(f"wrote {args.out}; next: trainflow validate --config {args.out}, then trainflow retrain --config {args.out}")


def _config_command(args: argparse.Namespace) -> None:
    if args.config_command == "schema":
        from trainflow.config.schema import config_schema

        print(json.dumps(config_schema(), indent=2))
        return
    import yaml

    from trainflow.config import load_config
    from trainflow.redact import redact_config

    config = load_config(args.config, parse_overrides(args.set))
    if config.task_inferred:
        print(f"# {config.task_inferred}")
    print(yaml.safe_dump(redact_config(config.to_dict()), sort_keys=False, allow_unicode=True), end="")


def _champion_command(args: argparse.Namespace) -> dict[str, Any]:
    import datetime as dt

    import mlflow

    from trainflow.champion import history, rollback, serving_at
    from trainflow.config import load_config

    config = load_config(args.config)
    uri, name = config.mlflow.tracking_uri, config.mlflow.registered_model
    if args.champion_command == "rollback":
        from trainflow.champion import previous_champion
        from trainflow.services import wait_for_prefect

        wait_for_prefect()  # the champion lock is the Prefect server's when one is configured
        if args.to is None:
            args.to = previous_champion(mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri), name)
        return rollback(uri, name, args.to, args.reason, config.promotion.min_score, config.promotion.mode, args.force)
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    if args.at:
        try:
            when = dt.datetime.fromisoformat(args.at)
        except ValueError:
            raise TrainflowError(f"--at {args.at!r}: expected an ISO 8601 time, e.g. 2026-11-24T03:00") from None
        when = when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)
        return {"model": name, "at": when.isoformat(), "period": serving_at(client, name, when)}
    return {"model": name, "history": history(client, name)}


def _gc(args: argparse.Namespace) -> dict[str, Any]:
    from trainflow.config import load_config
    from trainflow.retention import collect
    from trainflow.tasks.retention import output_version
    from trainflow.services import wait_for_prefect

    config = load_config(args.config, parse_overrides(args.set))
    if not config.retention.limited:
        raise TrainflowError(
            f"trainflow gc: {args.config} sets neither retention.keep_runs nor retention.max_age_days, so every run "
            "is kept; set one (or pass --set retention.keep_runs=N)"
        )
    wait_for_prefect()  # the run-name and champion locks are the Prefect server's when one is configured
    return collect(config, dry_run=args.dry_run, needed=output_version(config))


def _flow(command: str):
    if command == "retrain":
        from trainflow.flows.retrain import retrain

        return retrain
    if command == "tune":
        from trainflow.flows.tune import tune

        return tune
    if command == "monitor":
        from trainflow.flows.monitor import monitor

        return monitor
    if command == "validate":
        from trainflow.flows.validate import validate

        return validate
    if command == "replay":
        from trainflow.flows.replay import replay

        return replay
    from trainflow.flows.predict import batch_inference

    return batch_inference
