"""A person's approval before a promotion (promotion.approval: required), through Prefect's own suspension.

Once the gate decides to promote and nobody has answered, the flow run shows the person the gate's evidence (a
Prefect artifact) and suspends (`suspend_flow_run` with an `Approval` RunInput, which Prefect's UI renders as a form;
`resume_flow_run(id, run_input=...)` or the API answers it). Suspension ends the process: its worker is free and no
lock is held (the gate's champion lock and the run-name lock are released as the flow run's process exits). Resumed,
Prefect runs the flow again from its start: the retrain finds its fits finished and its version registered, the gate
judges again under its lock, and `suspend_flow_run` with the same key now returns the answer instead of suspending.
Unanswered by promotion.approval_timeout_h, Prefect fails the suspended run; the next gate of the model records the
version not promoted (tasks/promote.py expire_requests).

On the command line nobody can answer a temporary server: `trainflow retrain --approve TEXT` is the approval, given
before training and recorded with its author (`user@host`); without it the run is refused before anything starts.
"""

from __future__ import annotations

import getpass
import socket
from typing import Any

from prefect.input import RunInput

from trainflow.config import Config
from trainflow.errors import ConfigError
from trainflow.run.redact import redact_text
from trainflow.tasks.values import Promotion, Registered

APPROVAL_ARTIFACT = "approval-request"


class Approval(RunInput):
    """The form a person answers in Prefect's UI: approve (true) or reject (false), why, and who answers."""

    approve: bool
    reason: str
    by: str = ""


def command_line_approval(text: str) -> dict[str, Any]:
    """`--approve TEXT`: the approval given on the command line, with its author."""
    return {"approve": True, "reason": text.strip() or "approved on the command line", "by": f"{_who()} (--approve)"}


def _who() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


def check_answerable(config: Config, approved: bool = False) -> None:
    """promotion.approval: required needs someone who can answer: a deployment's flow run (Prefect suspends it and
    a person resumes it), or an approval given up front (--approve); otherwise refused before anything starts."""
    if config.promotion.approval != "required" or approved:
        return
    from prefect.runtime import deployment, flow_run

    if flow_run.get_id() and deployment.get_id():
        return
    raise ConfigError(
        "promotion.approval: required: a promotion waits for a person's answer in Prefect, which only a "
        "deployment's flow run can suspend for (prefect deployment run retrain/manual ...); here nobody could "
        "answer, so nothing was trained. Approve on the command line with --approve 'why' (recorded as your "
        "approval), or set promotion.approval: none"
    )


def evidence(config: Config, promotion: Promotion, registered: Registered, model: list[str]) -> str:
    """The gate's evidence as a person reads it before answering (a Markdown artifact); model: lines about the model
    (its family, data and test figures)."""
    p = promotion
    lines = [
        f"# Approve {p.model_name} version {p.challenger_version} as @champion?",
        "",
        f"The gate would promote it: {p.reason.split('; awaiting', 1)[0]}",
        "",
        "| | version | score |",
        "|---|---|---|",
        f"| challenger | {p.challenger_version} | {_num(p.challenger_score)} |",
        f"| champion | {p.champion_version or 'none'} | {_num(p.champion_score)} |",
        "",
        f"Judged on {p.rows} {p.judged_on} rows by `{p.metric}` ({p.mode}, margin {p.margin:g})"
        + (f"; {p.judged_rows_note}" if p.judged_rows_note else "")
        + ".",
    ]
    if p.confidence:
        lines.append(f"Paired bootstrap of the gain: {p.confidence}.")
    lines += [
        "",
        "## The model",
        *[f"- {line}" for line in model],
        f"- MLflow run `{registered.run_id}`, model `models:/{p.model_name}/{p.challenger_version}` (its full model "
        "card is written when the run ends, approved or not)",
        "",
        f"Answer with the flow run's Resume form (approve, reason, by) within {config.promotion.approval_timeout_h:g} "
        "hours; unanswered, it is not promoted.",
    ]
    return "\n".join(lines)


def figures(metrics: dict[str, Any]) -> str:
    """A model's figures as the evidence shows them: `name value`, the numbers only."""
    return ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if isinstance(v, (int, float)))


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.6g}"


def await_approval(config: Config, promotion: Promotion, registered: Registered, model: list[str]) -> dict[str, Any]:
    """The person's answer to promoting promotion's challenger: the evidence shown, then the flow run suspended
    (this process ends; Prefect runs the flow again once it is resumed), or, on that run, the answer."""
    from prefect.artifacts import create_markdown_artifact
    from prefect.flow_runs import suspend_flow_run

    key = f"approval-{promotion.model_name}-v{promotion.challenger_version}"
    create_markdown_artifact(
        markdown=redact_text(evidence(config, promotion, registered, model)),  # a URI's credentials never shown
        key=APPROVAL_ARTIFACT,
        description=f"{promotion.model_name} v{promotion.challenger_version} awaits approval",
    )
    answer = suspend_flow_run(
        wait_for_input=Approval, timeout=max(1, int(config.promotion.approval_timeout_h * 3600)), key=key
    )
    return {"approve": bool(answer.approve), "reason": answer.reason, "by": answer.by or "a Prefect user"}
