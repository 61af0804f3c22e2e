"""`trainflow serve`: deployments/prefect.yaml's deployments served in this process (flow.serve)."""

from __future__ import annotations

import argparse


def add(sub) -> None:
    sv = sub.add_parser("serve", help="serve deployments/prefect.yaml's deployments in this process (flow.serve)")
    sv.add_argument("--config", help="config_path for every served deployment (default: each one's own)")
    sv.add_argument("--prefect-file", help="deployment file (default: the checkout's deployments/prefect.yaml)")
    sv.add_argument("--limit", type=int, help="at most this many flow runs at once")


def run(args: argparse.Namespace) -> None:
    from trainflow.config import load_config
    from trainflow.flows.serve import PREFECT_FILE, serve_all

    if args.config:
        load_config(args.config)
    serve_all(args.prefect_file or PREFECT_FILE, args.config, args.limit)
