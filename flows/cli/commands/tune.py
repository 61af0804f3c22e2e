"""`trainflow tune`: a Ray Tune sweep over the config's tune.search_space, then the best registered (the tune flow)."""

from __future__ import annotations

from trainflow.errors import TrainflowError
from trainflow.flows.cli.flow_command import FlowCommand, check_approval
from trainflow.flows.cli.parser import CONFIG, NO_WAIT, OVERRIDES, SUMMARY_JSON
from trainflow.flows.cli.render import format_summary as render


def _check(config, args) -> None:
    config.require_tune()
    if args.resume and not args.run_name:
        raise TrainflowError("tune --resume needs the --run-name of the sweep to restore")
    check_approval(config, args)


COMMAND = FlowCommand(
    "tune",
    "trainflow.flows.tune:tune",
    ("run_name", "resume", "wait"),
    check=_check,
    preflight=True,
    prepare_store=True,
)
run = COMMAND.run
__all__ = ["add", "render", "run"]


def add(sub) -> None:
    t = sub.add_parser(
        "tune",
        help="Ray Tune sweep over the config's tune.search_space, then register the best",
        parents=[CONFIG, OVERRIDES, SUMMARY_JSON, NO_WAIT],
    )
    t.add_argument("--run-name", help="sweep name")
    t.add_argument(
        "--resume",
        action="store_true",
        help="restore the sweep --run-name names from its folder (unpickles Ray Tune's state: only your own)",
    )
