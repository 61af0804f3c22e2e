"""Task: the champion/challenger gate; @champion moves only to a model that beats it on the same holdout."""

from __future__ import annotations

import datetime as dt

import math
import time

import mlflow
from mlflow.entities import Metric, RunTag
from prefect import task
from prefect.events import emit_event
from prefect.runtime import flow_run
from prefect.cache_policies import NO_CACHE

from trainflow.data import Rows
from trainflow.preprocessors.tabular import SchemaDriftError
from trainflow.tasks.common import retry_unless_user_error, task_logger
from trainflow.trainer.resolve import allowed_class_paths, resolve_checkpoint
from trainflow.tasks.values import Registered, Selected, Promotion
from trainflow.trainer.evaluate import Scored, paired_bootstrap, score_checkpoint, slice_metrics
from trainflow.config import Config
from trainflow.errors import InfrastructureError
from trainflow.folds import FoldPlan, plan_mismatch
from trainflow.champion import record_missed_move, record_move
from trainflow.locks import exclusive
from trainflow.tracking import CHAMPION, DECISION_TAG, current_champion, mlflow_key

PROMOTED, NOT_PROMOTED = "promoted", "not_promoted"
AWAITING = "awaiting_approval"  # promotion.approval: required, the gate would promote, nobody has answered yet
DEADLINE_TAG = "trainflow.promotion.approval_deadline"  # when an awaiting version's request times out (UTC)


def decide(challenger: float | None, champion: float | None, mode: str, margin: float) -> tuple[bool, str]:
    """(promote?, reason): promote when the challenger beats the champion by more than margin."""
    if challenger is None or not math.isfinite(challenger):
        return False, "the challenger's score is missing or not finite"
    if champion is None or not math.isfinite(champion):
        return True, "the champion's score is missing or not finite"
    gain = challenger - champion if mode == "max" else champion - challenger
    if gain > margin:
        return True, f"improves on the champion by {gain:.6g} (> margin {margin:g})"
    return False, f"does not improve on the champion by more than {margin:g} (change {gain:+.6g})"


def below_floor(score: float | None, floor: float | None, mode: str) -> bool:
    """True when a floor is set and score misses it (a missing or non-finite score misses any floor)."""
    if floor is None:
        return False
    if score is None or not math.isfinite(score):
        return True
    return score < floor if mode == "max" else score > floor


def _before_alias_move(version: str) -> None:
    """Test hook: called under the lock, after both models are scored and before the alias is re-read and moved."""


def _score(path: str, holdout: Rows, slices: tuple[str, ...], plan: FoldPlan | None = None) -> Scored | None:
    try:
        return score_checkpoint(path, holdout, slices, held_out=plan)
    except SchemaDriftError as exc:
        task_logger("promote").warning("model %s cannot score this holdout: %s", path, exc)
        return None


def noise_check(challenger: Scored, champion: Scored, config: Config) -> tuple[dict | None, str | None]:
    """(the paired bootstrap, a reason to keep the champion or None) for promotion.confidence."""
    p = config.promotion
    if p.confidence is None:
        return None, None
    boot = paired_bootstrap(challenger, champion, p.metric, p.mode, p.margin)
    if boot["resamples"] and boot["share_not_better"] > 1.0 - p.confidence:
        return boot, (
            f"the gain {boot['gain']:+.6g} is within the holdout's noise: the challenger beats the champion by "
            f"more than {p.margin:g} in {1 - boot['share_not_better']:.0%} of {boot['resamples']} paired bootstrap "
            f"resamples, fewer than promotion.confidence {p.confidence:g}"
        )
    return boot, None


def slice_check(slices: dict, champion: Scored | None, config: Config) -> str | None:
    """Adds the champion's metric to every slice; a reason to reject when the challenger falls more than
    promotion.max_slice_drop below it on a judged slice (the worst such slice named)."""
    p = config.promotion
    if champion is None:
        return None
    theirs = slice_metrics(champion, p.min_slice_rows)
    worst = None
    for column, values in slices.items():
        for value, entry in values.items():
            other = theirs.get(column, {}).get(value, {}).get(p.metric)
            entry["champion_" + p.metric] = other
            mine = entry.get(p.metric)
            if (
                other is None
                or mine is None
                or not (math.isfinite(other) and math.isfinite(mine))
                or not entry["judged"]
            ):
                continue
            drop = (other - mine) if p.mode == "max" else (mine - other)
            if p.max_slice_drop is not None and drop > p.max_slice_drop and (worst is None or drop > worst[0]):
                worst = (drop, column, value, mine, other, entry["rows"])
    if worst is None:
        return None
    drop, column, value, mine, other, rows = worst
    return (
        f"on the slice {column}={value} ({rows} rows) its {p.metric} {mine:.6g} is {drop:.6g} worse than the "
        f"champion's {other:.6g}, more than promotion.max_slice_drop {p.max_slice_drop:g}"
    )


def plan_problem(client, name: str, version: str, path: str, plan: FoldPlan | None) -> str | None:
    """Why the champion's stored split plan is not to be trusted (it disagrees with the same checkpoint's config or
    the version's logged params), else None."""
    if plan is None:
        return None
    try:
        params = client.get_run(client.get_model_version(name, version).run_id).data.params
    except Exception:  # noqa: BLE001 - the config.json check still runs
        params = None
    return plan_mismatch(plan, path, params)


def stored_plan(path: str) -> FoldPlan | None:
    """The split a registered checkpoint was trained under (its split.json, or what its config.json implies); None
    when neither says (then every holdout row counts, and the reason says so)."""
    try:
        return FoldPlan.load(path)
    except ValueError as exc:
        task_logger("promote").warning(
            "a checkpoint's split plan cannot be read (%s): judged on every holdout row", exc
        )
        return None


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def judged_note(mine: FoldPlan | None, theirs: FoldPlan | None, champion_version: str | None, rows: int) -> str | None:
    """By time: the judged rows' time range and that they are newer than everything the champion trained or chose on;
    by group: that they belong to groups neither model trained on. None for hash roles."""
    if mine is None:
        return None
    if mine.time_column is not None and (mine.time_ranges or {}).get("test"):
        first, last = mine.time_ranges["test"]
        older = (
            (theirs.time_ranges or {}).get("test")
            if theirs is not None and theirs.time_column == mine.time_column
            else None
        )
        if older is not None:
            first = max(first, older[0])
        against = (
            (
                f", all newer than what champion v{champion_version} trained or chose on (its rows before "
                f"{mine.time_text(older[0])})"
            )
            if older is not None
            else ""
        )
        return f"the {rows:,} newest rows, {mine.time_text(first)} to {mine.time_text(last)}{against}"
    if mine.group_column is not None:
        return (
            f"the {rows:,} test rows of groups ({mine.group_column!r}) neither model trained or chose on"
            if champion_version
            else f"the {rows:,} test rows of groups ({mine.group_column!r}) it never saw"
        )
    return None


def _plans_differ(plan: FoldPlan | None) -> str:
    return "its split is unknown" if plan is None else f"it was trained with {plan.describe()}"


def gate(
    config: Config,
    holdout: Rows,
    challenger_path: str,
    registered: Registered,
    scored: Scored | None = None,
    judged_on: str = "test",
    alias: str = CHAMPION,
    answer: dict | None = None,
) -> Promotion:
    """Score the challenger and the current @champion on the same holdout and move the alias on a win, as one
    compare-and-set: under a lock per registered model (CLI, deployments and tune all take it), and the alias
    is read again right before it moves; a champion that changed meanwhile is scored in its turn. scored: the
    challenger's outputs on holdout with the slice columns, as it serves them (calibrate's), else scored here.
    alias: another alias than @champion (a replay policy's, flows/replay.py): the same decision moves that alias
    alone, and records nothing else (no decision tags on the challenger's run, no event, no @champion history).
    With promotion.approval required, a promotion moves the alias only with a person's answer (answer: approve,
    reason, by; tasks/approval.py): none yet, the decision is AWAITING and nothing moves; a rejection is not
    promoted."""
    recorded = alias == CHAMPION
    asks = recorded and (config.promotion.approval == "required" or answer is not None)
    log = task_logger("promote")
    metric, mode, margin = config.promotion.metric, config.promotion.mode, config.promotion.margin
    name, version = registered.model_name, registered.model_version
    slices_asked = tuple(config.promotion.slices)
    mine = scored if scored is not None else score_checkpoint(challenger_path, holdout, slices_asked)
    challenger = mine.metrics().get(metric) if len(mine.labels) else None
    slices = slice_metrics(mine, config.promotion.min_slice_rows) if slices_asked else None
    confidence = None
    floor = config.promotion.min_score
    missed = below_floor(challenger, floor, mode)
    scored: dict[str, tuple] = {}
    judged_rows, challenger_judged = len(mine.labels), challenger
    uri = config.mlflow.tracking_uri
    # an explicit client, not MLflow's process-wide tracking URI: gates of two models may run at once in one process
    with exclusive("champion", name, uri):
        client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
        if recorded:
            expire_requests(client, name, version)
        champion_version = current_champion(client, name, alias)
        decision = None
        for _ in range(5):  # a champion moved by a run outside the lock: score the new one
            champion_score, champion_path = None, None
            if champion_version is None:
                promote_it, reason = True, "first model: there is no champion yet"
            elif champion_version == version:  # a retry of this task after the alias moved
                champion_score, champion_path = challenger, challenger_path
                promote_it, reason = (
                    True,
                    "already the champion (its earlier gate moved the alias: a retried task or a rerun)",
                )
            else:
                if champion_version not in scored:
                    path = resolve_checkpoint(f"models:/{name}/{champion_version}", allowed_class_paths(config), uri)
                    plan = stored_plan(path)
                    mine_plan = stored_plan(challenger_path)
                    # the same split (the usual nightly case): every test row is held out from both, no row check
                    same = plan is not None and mine_plan is not None and plan.holds_out_every_test_row_of(mine_plan)
                    mask = None if same else plan
                    theirs_all = _score(path, holdout, slices_asked, mask)
                    ours_all = (
                        mine
                        if mask is None
                        else score_checkpoint(challenger_path, holdout, slices_asked, held_out=mask)
                    )
                    problem = plan_problem(client, name, champion_version, path, plan)
                    scored[champion_version] = (theirs_all, ours_all, path, plan, mask, problem)
                theirs, ours, champion_path, plan, mask, problem = scored[champion_version]
                if mask is not None and theirs is not None:  # only the rows neither model trained or chose on
                    theirs, ours = theirs.subset(theirs.held_out), ours.subset(ours.held_out)
                judged_rows = len(ours.labels)
                challenger_judged = ours.metrics().get(metric) if judged_rows else None
                champion_score = theirs.metrics().get(metric) if theirs is not None and len(theirs.labels) else None
                promote_it, reason = decide(challenger_judged, champion_score, mode, margin)
                if champion_score is None and promote_it:
                    reason = "the champion cannot score the current holdout (its schema or classes differ)"
                if theirs is not None and slices is not None:
                    slices = slice_metrics(ours, config.promotion.min_slice_rows)
                    rejected = slice_check(slices, theirs, config)
                    if promote_it and rejected:
                        promote_it, reason = False, rejected
                if promote_it and theirs is not None and champion_score is not None:
                    confidence, noisy = noise_check(ours, theirs, config)
                    if noisy:
                        promote_it, reason = False, noisy
                if problem:
                    promote_it, reason = (
                        False,
                        (
                            f"champion v{champion_version}'s stored split plan (split.json) does not match its own training "
                            f"({problem}): which rows it never trained on is unknown, so no promotion on that evidence"
                        ),
                    )
                elif (promote_it or not judged_rows) and judged_rows < config.promotion.min_test_rows:
                    promote_it, reason = (
                        False,
                        (
                            f"only {judged_rows} {judged_on} rows are held out from both the challenger and champion "
                            f"v{champion_version} ({_plans_differ(plan)}), fewer than promotion.min_test_rows "
                            f"{config.promotion.min_test_rows}: no promotion on that evidence"
                        ),
                    )
            if missed and champion_version != version:
                promote_it, reason = (
                    False,
                    (
                        f"{metric} {challenger:.6g} misses the floor promotion.min_score {floor:g}: registered, never "
                        "@champion"
                        if challenger is not None and math.isfinite(challenger)
                        else f"{metric} is missing or not finite, below the floor promotion.min_score {floor:g}"
                    ),
                )
            if promote_it and asks and champion_version != version:
                promote_it, reason, decision = judged_by_person(answer, reason)
            if not promote_it:
                break
            _before_alias_move(version)
            now = current_champion(client, name, alias)
            if now != champion_version:
                log.warning("@%s moved from v%s to v%s during the gate: comparing again", alias, champion_version, now)
                champion_version = now
                continue
            if champion_version != version:
                client.set_registered_model_alias(name, alias, version)
            break
        else:
            raise InfrastructureError(f"{name}@{alias} kept moving during the gate; the alias was left as it is")
        if promote_it and recorded:  # the alias's history (trainflow/champion.py), still locked
            by = f"the gate (MLflow run {registered.run_id}, Prefect flow run {flow_run.get_id() or 'none'})"
            try:
                if champion_version != version:
                    record_move(client, name, champion_version, version, reason, by)
                else:  # moved by this version's earlier gate, which may have died before recording it
                    record_missed_move(client, name, version, reason, by)
            except Exception as exc:  # noqa: BLE001 - the alias moved; a history MLflow refuses is a warning
                log.warning(
                    "promotion: v%s is @%s; the move was not added to its history: %s: %s",
                    version,
                    CHAMPION,
                    type(exc).__name__,
                    exc,
                )
        result = Promotion(
            decision=decision or (PROMOTED if promote_it else NOT_PROMOTED),
            reason=reason,
            metric=metric,
            mode=mode,
            margin=margin,
            min_score=floor,
            below_floor=missed,
            model_name=name,
            challenger_version=version,
            challenger_score=challenger_judged,
            champion_version=champion_version,
            champion_score=champion_score,
            serving_version=version if promote_it else champion_version,
            serving_checkpoint=challenger_path if promote_it else champion_path,
            confidence=confidence,
            slices=slices,
            calibration=mine.calibration() if len(mine.labels) else None,
            judged_on=judged_on,
            rows=judged_rows,
            judged_rows_note=judged_note(
                stored_plan(challenger_path),
                scored[champion_version][3] if champion_version in scored else None,
                champion_version if champion_version != version else None,
                judged_rows,
            ),
        )
        tags = {
            DECISION_TAG: result.decision,
            "trainflow.promotion.reason": reason,
            "trainflow.promotion.metric": f"{metric} ({mode}, margin {margin:g})",
            # both on the judged rows (those held out from both); the challenger's on all its test rows beside them
            "trainflow.promotion.challenger_score": str(challenger_judged),
            "trainflow.promotion.judged_rows": str(judged_rows),
            "trainflow.promotion.challenger_score_all_test_rows": f"{challenger} ({len(mine.labels)} rows)",
            "trainflow.promotion.champion_score": str(champion_score),
            "trainflow.promotion.champion_version": str(champion_version),
            "trainflow.promotion.floor": "none"
            if floor is None
            else f"{'missed' if missed else 'met'} ({metric} {floor:g})",
        }
        if decision == AWAITING:
            deadline = time.time() + config.promotion.approval_timeout_h * 3600
            tags[DEADLINE_TAG] = dt.datetime.fromtimestamp(deadline, dt.timezone.utc).isoformat(timespec="seconds")
        if recorded:
            record_decision(client, result, registered.run_id, tags)
    if not recorded:
        return result
    try:
        emit_event(
            event=f"trainflow.model.{result.decision}",
            resource={"prefect.resource.id": f"trainflow.model.{name}"},
            payload=result.record(),
        )
    except Exception as exc:  # noqa: BLE001 - the decision stands whatever the event bus says
        log.warning(
            "promotion: the decision stands; its Prefect event was not emitted (%s: %s)", type(exc).__name__, exc
        )
    against = "no champion" if champion_version is None else f"champion v{champion_version} {_fmt(champion_score)}"
    # the figures are the judged rows' (test rows), not the validation split's that the metric's name says
    log.info(
        "promotion: %s v%s on %d %s rows (%s on them %s vs %s; %s is better): %s",
        result.decision,
        version,
        judged_rows,
        judged_on,
        metric.removeprefix("val_"),
        _fmt(challenger_judged),
        against,
        "higher" if mode == "max" else "lower",
        reason,
    )
    return result


def judged_by_person(answer: dict | None, reason: str) -> tuple[bool, str, str]:
    """(promote it, the reason, the decision) once the gate would promote under promotion.approval: required."""
    if answer is None:
        return False, f"{reason}; awaiting a person's approval (promotion.approval: required)", AWAITING
    who = str(answer.get("by") or "someone").strip()[:200]
    said = str(answer.get("reason") or "no reason given").strip()[:1000]
    if answer.get("approve"):
        return True, f"{reason}; approved by {who}: {said}", PROMOTED
    return False, f"rejected by {who}: {said} (the gate would have promoted: {reason})", NOT_PROMOTED


def expire_requests(client, name: str, version: str) -> None:
    """Versions of name still awaiting approval past their deadline (Prefect failed their suspended run at it):
    recorded not promoted, with a trainflow.model.not_promoted event (the caller holds the champion lock)."""
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    try:
        waiting = client.search_model_versions(f"name = '{name}' and tags.`{DECISION_TAG}` = '{AWAITING}'")
    except Exception as exc:  # noqa: BLE001 - left for the next gate
        task_logger("promote").warning("promotion: requests awaiting approval not checked: %s", exc)
        return
    for mv in waiting:
        deadline = mv.tags.get(DEADLINE_TAG, "")
        if str(mv.version) == str(version) or not deadline or deadline > now:
            continue
        why = f"its approval was not answered by {deadline} (promotion.approval_timeout_h): not promoted"
        client.set_model_version_tag(name, mv.version, DECISION_TAG, NOT_PROMOTED)
        client.set_model_version_tag(name, mv.version, "trainflow.promotion.reason", why)
        _end_waiting_run(client, mv.run_id, why)
        task_logger("promote").warning("promotion: v%s %s", mv.version, why)
        try:
            emit_event(
                event=f"trainflow.model.{NOT_PROMOTED}",
                resource={"prefect.resource.id": f"trainflow.model.{name}"},
                payload={"model": name, "challenger_version": str(mv.version), "reason": why},
            )
        except Exception:  # noqa: BLE001 - recorded on the version whatever the event bus says
            pass


def _end_waiting_run(client, run_id: str, why: str) -> None:
    """The retrain's MLflow run that waited with its suspended flow run (left RUNNING for the resume that never
    came) ends KILLED, saying why."""
    from trainflow.tasks.mlflow_run import ENDED_BY_TAG

    try:
        parent = client.get_run(run_id).data.tags.get("mlflow.parentRunId") or run_id
        if client.get_run(parent).info.status == "RUNNING":
            client.set_tag(parent, ENDED_BY_TAG, why)
            client.set_terminated(parent, "KILLED")
    except Exception as exc:  # noqa: BLE001 - the decision is recorded on the version; the run's status is a record
        task_logger("promote").warning("promotion: the waiting MLflow run %s was not ended: %s", run_id, exc)


def record_decision(client, result: Promotion, run_id: str, tags: dict[str, str]) -> None:
    """The decision's tags on the model version and its run, and the evaluation's metrics. After the alias moved
    nothing may fail the gate: a record MLflow refuses or cannot take is a warning naming what is missing."""
    log = task_logger("promote")
    try:
        for key, value in tags.items():
            client.set_model_version_tag(result.model_name, result.challenger_version, key, value[:5000])
        client.log_batch(run_id, tags=[RunTag(key, value[:5000]) for key, value in tags.items()])
    except Exception as exc:  # noqa: BLE001
        log.warning(
            "promotion: the decision stands (%s); its tags were not recorded in MLflow: %s: %s",
            result.decision,
            type(exc).__name__,
            exc,
        )
    metrics = evaluation_metrics(result)
    try:
        client.log_batch(run_id, metrics=metrics)
    except Exception as exc:  # noqa: BLE001
        log.warning(
            "promotion: the decision stands (%s); %d evaluation metrics (calibration, bootstrap, slices) were "
            "not recorded in MLflow: %s: %s",
            result.decision,
            len(metrics),
            type(exc).__name__,
            exc,
        )


def evaluation_metrics(result: Promotion) -> list[Metric]:
    """The gate's evaluation as MLflow metrics: calibration (val_ece, val_brier), the bootstrap's gain and its
    band, and each judged slice's metrics (slice.<column>.<value>.<metric>)."""
    now, out = int(time.time() * 1000), []
    if result.calibration:  # named for the rows they come from (test_ece, or val_ece without a test role)
        prefix = "test" if result.judged_on == "test" else "val"
        out += [
            Metric(f"{prefix}_ece", result.calibration["ece"], now, 0),
            Metric(f"{prefix}_brier", result.calibration["brier"], now, 0),
        ]
    for key in ("gain", "gain_p05", "gain_p95"):
        value = (result.confidence or {}).get(key)
        if value is not None and math.isfinite(value):
            out.append(Metric(f"promotion.{key}", value, now, 0))
    for column, values in (result.slices or {}).items():
        for value, entry in values.items():
            for name, number in entry.items():
                if name.startswith("val_") and isinstance(number, float) and math.isfinite(number):
                    out.append(Metric(mlflow_key(f"slice.{column}.{value}.{name}"), number, now, 0))
    return out[:1000]  # MLflow takes at most 1000 metrics per batch


@task(
    name="promote", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error, cache_policy=NO_CACHE
)
def promote(
    config: Config,
    holdout: Rows,
    selected: Selected,
    registered: Registered,
    scored: Scored | None = None,
    judged_on: str = "test",
    answer: dict | None = None,
) -> Promotion:
    """Score the new version (or take its scored holdout) and the current @champion on the same holdout rows (with a
    champion: the ones neither trained or chose on); move the alias only on a win (and, with promotion.approval:
    required, a person's answer approving it)."""
    return gate(config, holdout, selected.path, registered, scored, judged_on, answer=answer)
