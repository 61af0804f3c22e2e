"""`trainflow sample`: the bundled synthetic sample tables."""

from __future__ import annotations

import argparse


def add(sub) -> None:
    s = sub.add_parser("sample", help="write the bundled synthetic sample tables")
    s.add_argument("--out", default="data/sample", help="the folder to write train.parquet and score.parquet to")
    s.add_argument("--rows", type=int, default=100_000, help="training table rows")
    s.add_argument("--score-rows", type=int, default=20_000, help="scoring table rows")
    s.add_argument("--seed", type=int, default=7, help="the generator's seed")
    s.add_argument("--force", action="store_true", help="rewrite even if the files exist")


def run(args: argparse.Namespace) -> None:
    from trainflow.tables.sample import write_sample

    paths = write_sample(args.out, rows=args.rows, score_rows=args.score_rows, seed=args.seed, force=args.force)
    for p in paths:
        print(p)
