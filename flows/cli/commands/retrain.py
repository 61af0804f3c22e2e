"""`trainflow retrain`: train, select, register and predict from a config (the retrain flow)."""

from __future__ import annotations

from trainflow.flows.cli.flow_command import FlowCommand, check_approval
from trainflow.flows.cli.parser import CONFIG, NO_WAIT, OVERRIDES, SUMMARY_JSON
from trainflow.flows.cli.render import format_summary as render


def _needs_ray(config) -> bool:
    """Ray not for a retrain whose every step runs in this process (a small table: flows/local.py)."""
    from trainflow.flows.local import trained_in_process

    return not trained_in_process(config)


COMMAND = FlowCommand(
    "retrain",
    "trainflow.flows.retrain:retrain",
    ("run_name", "force", "wait", "approve"),
    check=check_approval,
    preflight=True,
    prepare_store=True,
    needs_ray=_needs_ray,
)
run = COMMAND.run
__all__ = ["add", "render", "run"]


def add(sub) -> None:
    r = sub.add_parser(
        "retrain",
        help="train, select, register and predict from a config",
        parents=[CONFIG, OVERRIDES, SUMMARY_JSON, NO_WAIT],
    )
    r.add_argument("--run-name", help="Ray Train run name; an existing name resumes that run")
    r.add_argument(
        "--force",
        action="store_true",
        help="retrain even when the data and training config are those of the current champion",
    )
    r.add_argument(
        "--approve",
        metavar="REASON",
        help="with promotion.approval: required, approve this run's promotion now (recorded with REASON and you); "
        "the gate still decides whether to promote",
    )
