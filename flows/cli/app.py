"""`trainflow`'s entry point: the commands (one module each in flows/cli/commands/), parse, run the command, print
its summary, exit with its code."""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from types import ModuleType
from typing import Any

from trainflow.flows.cli.commands import (
    champion,
    config,
    gc as gc_command,
    init,
    monitor,
    predict,
    replay,
    retrain,
    sample,
    serve,
    tune,
    validate,
)
from trainflow.flows.cli.errors import exit_code, short_failure_logs
from trainflow.flows.cli.output import write_out
from trainflow.run.runtime import stop_ray

# in the order `trainflow --help` lists them
COMMANDS: tuple[ModuleType, ...] = (
    retrain,
    tune,
    predict,
    monitor,
    serve,
    replay,
    validate,
    init,
    config,
    champion,
    gc_command,
    sample,
)
DESCRIPTION = (
    "The `trainflow` command: each work command is a Prefect flow run (on a configured Prefect server, or Prefect's "
    "temporary one); with no Prefect API configured, a small predict, a skipped retrain and validate run in this process."
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trainflow")
    except PackageNotFoundError:  # a checkout run without installing it
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainflow", description=DESCRIPTION)
    p.add_argument("--debug", action="store_true", help="show full tracebacks")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}", help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add(sub)
    return p


def command_named(name: str) -> ModuleType:
    """The module of the command called name (a command module with NAMES answers to each of them)."""
    [command] = [c for c in COMMANDS if name in getattr(c, "NAMES", (c.__name__.rsplit(".", 1)[-1],))]
    return command


def run_command(args: argparse.Namespace) -> dict[str, Any] | None:
    return command_named(args.command).run(args)


def render(command: str, summary: dict[str, Any]) -> str:
    """The summary of command as a person reads it (the JSON where the command has no render)."""
    formatter = getattr(command_named(command), "render", None)
    return formatter(summary) if formatter else json.dumps(summary, indent=2, default=str)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    parsed = getattr(command_named(args.command), "parsed", None)
    if parsed is not None:  # a command's own checks of its arguments (argparse's usage errors)
        parsed(parser, args)
    # Prefect's temporary server would try to send usage telemetry (an ERROR line offline); a user's setting wins
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # MLflow's transfer bars in a terminal only (trainflow.run.runtime.plain_progress, which imports Ray: not here)
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
