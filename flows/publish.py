"""What retrain and tune do once a checkpoint is selected: calibrate -> register -> promote -> explain -> infer ->
summarize -> report.

A function the flows call, not a subflow: its tasks stay in the calling flow run, whose id the MLflow run key
(tasks/mlflow_run.py) and the model version's lineage tags record.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger

from trainflow.config import Config
from trainflow.roles.folds import FoldPlan
from trainflow.tasks.calibrate import calibrate
from trainflow.flows.refit import REFITTED
from trainflow.tasks.values import EarlierFit, Ingested, Selected, Split, TrainOutcome
from trainflow.tasks.explain import explain
from trainflow.tasks.final_score import score_test
from trainflow.tasks.infer import infer
from trainflow.tasks.approval import await_approval, figures
from trainflow.tasks.promote import AWAITING, promote
from trainflow.tasks.register import describe_version, register
from trainflow.tasks.report import report
from trainflow.tasks.summary import summarize
from trainflow.trainer.evaluate import Scored


def _approval_lines(
    ingested: Ingested, outcome: TrainOutcome, selected: Selected, metrics: dict | None, rows: int | None
) -> list[str]:
    """What a person approving the promotion is shown of the model (metrics: its figures on the rows test rows; None
    where there are none)."""
    return [
        f"family {outcome.family}, checkpoint {selected.path}",
        f"data {ingested.spec.path} (fingerprint {ingested.spec.fingerprint})",
        *([f"test rows ({rows}): {figures(metrics or {})}"] if rows is not None else []),
    ]


def _predict(config: Config, promotion, run_name: str | None):
    """inference.input predicted by the version serving after the gate; None when there is no input or no champion."""
    if config.inference.input and promotion.serving_version is None:
        get_run_logger().warning(
            "nothing predicted: no version of %s is @champion (%s)", promotion.model_name, promotion.reason
        )
    elif config.inference.input:
        model = f"models:/{promotion.model_name}/{promotion.serving_version}"
        return infer(promotion.serving_checkpoint, config, model, run_name)
    return None


def _tested(config: Config, parts: Split, chosen: tuple[str, str, Selected], extra, selections, backtest, warm_plan):
    """The test rows' scores: every candidate's (each leaderboard row given its own), the served model's (chosen:
    the chosen family, the served model's key, its checkpoint); with a refit the chosen model's beside its refit's,
    both in the refit's record (extra['refit']). backtest: the earlier model and the out-of-fold rows by time."""
    family, served, selected = chosen
    refit = extra.get("refit") if served != family else None
    tested = score_test(
        config,
        parts.test,
        {**(selections or {}), served: selected} if refit or not selections else selections,
        served,
        parts.plan,
        *backtest,
        warm_plan,
    )
    for row in extra.get("candidates") or []:
        row.update(tested.metrics.get(row["family"], {}))
    if refit:  # both models' test figures: the chosen one's and its refit's (served)
        refit["test_metrics"] = {"chosen": tested.metrics.get(family), "refitted": tested.metrics[served]}
    return tested


def publish(
    config: Config,
    ingested: Ingested,
    parts: Split,
    outcome: TrainOutcome,
    selected: Selected,
    extra: dict[str, Any],
    selections: dict[str, Selected] | None = None,
    oof: Scored | None = None,
    earlier: EarlierFit | None = None,
    oof_by_time: Scored | None = None,
    curves: list[dict[str, Any]] | None = None,
    run_name: str | None = None,
    explained: bool = True,
    warm_plan: FoldPlan | None = None,
) -> dict[str, Any]:
    """Register the selected checkpoint, gate it against @champion, predict inference.input with whichever
    version serves after the gate (a rejected challenger never writes predictions), and report; the summary.
    selections: every candidate's selected checkpoint (scored on the test rows beside the chosen one); oof: the
    chosen checkpoint's out-of-fold outputs (cross-fitting), which calibration is fitted on instead of validation rows; earlier: the
    backtest's earlier model (flows/backtest.py), scored on the test rows beside the recent one; oof_by_time: by time,
    the chosen model's out-of-fold outputs with their rows' times (the backtest's out-of-fold rows); curves: the
    training histories of the models the served one is made of (default: outcome's own); run_name: the scoring run's
    id in a table the predictions are appended to (a rerun of the name appends nothing twice); explained=False: no
    feature importance and no report artifacts (a replay's cutoff retrains: only the replay reads their models);
    warm_plan: the split a warm start's source trained under (the test figures leave out the rows it trained on)."""
    # train.refit (flows/refit.py): selected is the chosen model refitted, scored beside it under its own key
    refit = extra.get("refit") if (extra.get("refit") or {}).get("refitted") else None
    served = f"{outcome.family}{REFITTED}" if refit else outcome.family
    # stored in the checkpoint before it is registered (fitted on the validation rows or the out-of-fold outputs; a
    # refit's: the chosen model's outputs on them, oof, as it trained on those rows)
    on = "validation" if refit and parts.fold_count == 1 else None
    fit, scored = calibrate(config, parts.val, selected, outcome.family, oof, on)
    holdout, judged_on, tested = parts.val, "validation", None
    if parts.test is not None:  # the test rows, read once every choice is made: the final scores and the gate's
        chosen = (outcome.family, served, selected)
        tested = _tested(config, parts, chosen, extra, selections, (earlier, oof_by_time), warm_plan)
        holdout, judged_on, scored = parts.test, "test", tested.chosen
    registered = register(config, ingested, outcome, selected, parts.plan)
    promotion = promote(config, holdout, selected, registered, scored, judged_on, answer=config.approved)
    if promotion.decision == AWAITING:  # promotion.approval: required: the flow run suspends for a person's answer
        lines = _approval_lines(
            ingested, outcome, selected, tested.metrics.get(served) if tested else None, tested.rows if tested else None
        )
        answer = await_approval(config, promotion, registered, lines)
        promotion = promote(config, holdout, selected, registered, scored, judged_on, answer=answer)
    importance = explain(config, holdout, selected.path, promotion, registered) if explained else None
    predictions = _predict(config, promotion, run_name)
    summary = summarize(
        ingested,
        parts,
        outcome,
        selected,
        registered,
        promotion,
        predictions,
        extra={
            "task": config.task,
            "feature_importance": importance,
            "calibration_fit": fit,
            "test_rows": tested.rows if tested else 0,
            "test_metrics": tested.metrics[served] if tested else None,
            **({"test_rows_note": tested.note} if tested and tested.note else {}),
            "backtest": tested.backtest if tested else None,
            "split": parts.plan.describe() if parts.plan else None,
            "split_path": parts.split_path,
            "split_note": parts.note,
            **extra,
        },
    )
    if curves is None:
        unit = outcome.budget.get("unit", "epoch")
        curves = [{"family": outcome.family, "label": outcome.family, "history": outcome.history, "unit": unit}]
    if explained:
        report(config, outcome.history, summary, curves, scored, judged_on)
    describe_version(config, summary)
    return summary
