"""`trainflow init`: a commented config for a table and its label."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainflow.errors import TrainflowError
from trainflow.flows.cli.output import write_out


def add(sub) -> None:
    i = sub.add_parser("init", help="write a commented config for a table and its label")
    i.add_argument("--data", required=True, help="the table: file, folder, glob or URI")
    i.add_argument("--label", required=True, help="the column to predict")
    i.add_argument("--out", default="trainflow.yaml", help="the config file to write (default: trainflow.yaml)")
    i.add_argument("--force", action="store_true", help="replace an existing --out")


def run(args: argparse.Namespace) -> None:
    from trainflow.scaffold import scaffold

    if Path(args.out).exists() and not args.force:
        raise TrainflowError(f"--out {args.out} exists; choose another file or add --force to replace it")
    text = scaffold(args.data, args.label, args.out)
    write_out(args.out, text, replace=args.force)  # a file that appeared meanwhile is not replaced
    print(f"wrote {args.out}; next: trainflow validate --config {args.out}, then trainflow retrain --config {args.out}")
