"""`trainflow champion` (and its short forms `trainflow history`, `trainflow rollback`): which version served as
@champion at a time, its history, or a rollback to an earlier version."""

from __future__ import annotations

import argparse
from typing import Any

from trainflow.errors import TrainflowError
from trainflow.flows.cli.parser import ANSWER_JSON

NAMES = ("champion", "history", "rollback")  # `trainflow rollback` is `trainflow champion rollback`
AT_HELP = "only the version that served at this time (ISO 8601, e.g. 2026-11-24T03:00; UTC when no offset is given)"


def add(sub) -> None:
    ch = sub.add_parser(
        "champion",
        help="which version served as @champion at a time (--at), its history, or a rollback to an earlier version",
    )
    # `trainflow champion --at TIME --config F`: `trainflow champion history --at TIME --config F`
    ch.add_argument("--at", help=AT_HELP)
    ch.add_argument(
        "--config",
        help="the config naming the registered model and tracking URI (with --at, or alone for the whole history)",
    )
    ch.add_argument("--summary-json", help=ANSWER_JSON)
    chsub = ch.add_subparsers(dest="champion_command")
    for holder in (chsub, sub):  # `trainflow history` and `trainflow rollback`: the same as `trainflow champion ...`
        short = " (trainflow champion {})" if holder is sub else ""
        cp = holder.add_parser(
            "history",
            help="every version that served as @champion: since, until, why, replaced by" + short.format("history"),
        )
        cp.add_argument("--at", help=AT_HELP)
        _model_config(cp)
        cp = holder.add_parser(
            "rollback",
            help="move @champion back to a version, through the gate's lock and records" + short.format("rollback"),
        )
        cp.add_argument(
            "--to",
            metavar="VERSION",
            help="the model version to serve again (default: the one the current champion replaced)",
        )
        cp.add_argument("--reason", required=True, help="why: recorded with the move")
        cp.add_argument(
            "--force",
            action="store_true",
            help="roll back even to a version whose recorded score misses promotion.min_score, that the gate "
            "rejected, or that never served",
        )
        _model_config(cp)


def _model_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="the config naming the registered model and tracking URI")
    parser.add_argument("--summary-json", help=ANSWER_JSON)


def parsed(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The short forms as `trainflow champion ...`; neither a command nor --config: argparse's usage error."""
    if args.command != "champion":  # `trainflow history` / `trainflow rollback`
        args.command, args.champion_command = "champion", args.command
    if args.champion_command is None:  # `trainflow champion --at T --config F`
        if not args.config:
            parser.error(
                "trainflow champion: give --config (with --at TIME: the version that served then), or a "
                "command: history, rollback"
            )
        args.champion_command = "history"


def run(args: argparse.Namespace) -> dict[str, Any]:
    import datetime as dt

    import mlflow

    from trainflow.champion import history, rollback, serving_at
    from trainflow.config import load_config

    config = load_config(args.config)
    uri, name = config.mlflow.tracking_uri, config.mlflow.registered_model
    if args.champion_command == "rollback":
        from trainflow.champion import previous_champion
        from trainflow.run.services import wait_for_prefect

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


def render(s: dict[str, Any]) -> str:
    """`trainflow champion`'s answer for a person (the JSON: --summary-json)."""
    if "moved" in s:
        return (
            f"{s['model']}@champion -> version {s['champion']} ({s['why']}; was {s.get('previous')}, {s.get('by')})"
            if s["moved"]
            else f"{s['model']}: {s['why']}; nothing moved"
        )
    rows = s["history"] if "history" in s else [s["period"]] if s.get("period") else []
    if not rows:
        return f"{s['model']}: no recorded @champion period" + (f" covers {s['at']}" if "at" in s else "")
    lines = [f"{'version':>7}  {'since':25}  {'until':25}  why"]
    for r in rows:
        replaced = f"; replaced by v{r['replaced_by']}: {r.get('replaced_why')}" if r.get("replaced_by") else ""
        lines.append(
            f"{r['version']:>7}  {r.get('since') or '?':25}  {r.get('until') or 'serving':25}  "
            f"{r.get('why')} ({r.get('by')}){replaced}"
        )
    return "\n".join(lines)
