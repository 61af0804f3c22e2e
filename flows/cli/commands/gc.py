"""`trainflow gc`: the config's retention applied now."""

from __future__ import annotations

import argparse
from typing import Any

from trainflow.errors import TrainflowError
from trainflow.flows.cli.parser import CONFIG, OVERRIDES, SUMMARY_JSON, parse_overrides
from trainflow.flows.cli.render import format_gc_summary as render

__all__ = ["add", "render", "run"]


def add(sub) -> None:
    g = sub.add_parser(
        "gc",
        help="apply the config's retention now: remove the run folders of earlier retrains that nothing needs",
        parents=[CONFIG, OVERRIDES, SUMMARY_JSON],
    )
    g.add_argument(
        "--dry-run", action="store_true", help="list what would be removed and kept, and why; remove nothing"
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    from trainflow.config import load_config
    from trainflow.retention import collect
    from trainflow.tasks.retention import output_version
    from trainflow.run.services import wait_for_prefect

    config = load_config(args.config, parse_overrides(args.set))
    if not config.retention.limited:
        raise TrainflowError(
            f"trainflow gc: {args.config} sets neither retention.keep_runs nor retention.max_age_days, so every run "
            "is kept; set one (or pass --set retention.keep_runs=N)"
        )
    wait_for_prefect()  # the run-name and champion locks are the Prefect server's when one is configured
    return collect(config, dry_run=args.dry_run, needed=output_version(config))
