"""`trainflow predict`: batch inference with a registered model or a checkpoint (the batch-inference flow; a small
table is scored in this process)."""

from __future__ import annotations

from typing import Any

from trainflow.flows.cli.flow_command import FlowCommand
from trainflow.flows.cli.parser import CONFIG, OVERRIDES, SUMMARY_JSON
from trainflow.flows.cli.render import scoring_lines


def _needs_ray(config) -> bool:
    """Ray not for a predict that scores its table in this process: no step of it needs Ray."""
    from trainflow.flows.local import scored_in_process

    return not scored_in_process(config)


def _check(config, args) -> None:
    """inference.input, when set, is there: a missing table answered in a second, before the flow starts."""
    if config.inference.input:
        from trainflow.config import infer_format
        from trainflow.tables.files import INFERENCE_INPUT, list_files

        list_files(config.inference.input, infer_format(config.inference.input), INFERENCE_INPUT)


COMMAND = FlowCommand(
    "predict", "trainflow.flows.predict:batch_inference", ("model",), check=_check, needs_ray=_needs_ray
)
run = COMMAND.run


def add(sub) -> None:
    pr = sub.add_parser(
        "predict",
        help="batch inference with a registered model or a checkpoint",
        parents=[CONFIG, OVERRIDES, SUMMARY_JSON],
    )
    pr.add_argument("--model", help="models:/name@alias, models:/name/version, runs:/... or a checkpoint folder")


def render(s: dict[str, Any]) -> str:
    """The model that scored, where the predictions went, drift (the JSON behind it: --summary-json)."""
    lines = [
        "",
        "trainflow summary",
        f"  model             {s.get('model')}"
        + (f" ({s['model_version_uri']})" if s.get("model_version_uri") not in (None, s.get("model")) else ""),
    ]
    return "\n".join(lines + scoring_lines({**s, "predictions_model_version": None}))
