"""`trainflow validate`: every check a retrain makes before training, nothing trained (the validate flow, or this
process with no Prefect API configured)."""

from __future__ import annotations

from typing import Any

from trainflow.flows.cli.flow_command import FlowCommand
from trainflow.flows.cli.parser import CONFIG, OVERRIDES, SUMMARY_JSON

COMMAND = FlowCommand("validate", "trainflow.flows.validate:validate", preflight=True)
run = COMMAND.run


def add(sub) -> None:
    sub.add_parser(
        "validate",
        help="every check a retrain makes before training (table, scoring table, output, "
        "memory, champion baseline); exit 0 or 2",
        parents=[CONFIG, OVERRIDES, SUMMARY_JSON],
    )


def render(s: dict[str, Any]) -> str:
    """`trainflow validate`'s summary: what a retrain would train on (the JSON: --summary-json)."""
    feats = s.get("features") or {}
    lines = [
        "",
        "trainflow summary",
        "  valid             yes: every check a retrain makes before training passed",
        f"  data              {s.get('data_path')} ({s.get('rows')} rows, task {s.get('task')})",
        f"  split             {s.get('train_rows')} training, {s.get('validation_rows')} validation, "
        f"{s.get('test_rows')} test rows" + (f", {s['folds']} folds" if (s.get("folds") or 1) > 1 else ""),
        *([f"  roles             {s['split']}"] if s.get("split") else []),
        *([f"  note              {s['split_note']}"] if s.get("split_note") else []),
        f"  features          {len(feats.get('numeric') or [])} numeric, {len(feats.get('text') or [])} text, "
        f"{len(feats.get('dates') or [])} date -> {s.get('packed_features')} packed",
        f"  families          {', '.join(s.get('families') or {}) or '-'}",
    ]
    for family, why in (s.get("families_left_out") or {}).items():
        lines.append(f"    {family:<10} left out: {why}")
    if s.get("inference_input"):
        lines.append(f"  scoring           {s['inference_input']} -> {s.get('inference_output')}")
    return "\n".join(lines)
