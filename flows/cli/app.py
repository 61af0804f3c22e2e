"""`trainflow`'s entry point: parse, run the command, print its summary, exit with its code."""

from __future__ import annotations

import gc
import json
import os
import sys

from trainflow.flows.cli.commands import run_command, write_out
from trainflow.flows.cli.errors import exit_code, short_failure_logs
from trainflow.flows.cli.parser import build_parser
from trainflow.flows.cli.render import render
from trainflow.runtime import stop_ray


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in ("history", "rollback"):  # `trainflow rollback` is `trainflow champion rollback`
        args.command, args.champion_command = "champion", args.command
    if args.command == "champion" and args.champion_command is None:  # `trainflow champion --at T --config F`
        if not args.config:
            parser.error(
                "trainflow champion: give --config (with --at TIME: the version that served then), or a "
                "command: history, rollback"
            )
        args.champion_command = "history"
    # Prefect's temporary server would try to send usage telemetry (an ERROR line offline); a user's setting wins
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # MLflow's transfer bars in a terminal only (trainflow.runtime.plain_progress, which imports Ray: not here)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "true" if sys.stderr.isatty() else "false")
    try:
        with short_failure_logs(not args.debug):
            summary = run_command(args)
    except BaseException as exc:  # noqa: BLE001 - the CLI's last line of defence
        return exit_code(exc, args.debug)
    if summary is not None:
        print(render(args.command, summary))
        if args.summary_json:
            write_out(args.summary_json, json.dumps(summary, indent=2, default=str))
    return 0


def entry() -> None:
    """The `trainflow` command: main(), then Ray stopped and an exit without the interpreter's final garbage
    collection over every object torch, Ray, Prefect and MLflow created (the objects are frozen with gc.freeze; the
    process's memory goes back to the system as a whole). Tests call main()."""
    code = main()
    stop_ray()  # now rather than at exit, where Ray first sleeps 0.5 s for late log lines
    gc.freeze()
    sys.exit(code)
