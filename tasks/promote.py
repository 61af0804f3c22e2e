"""Task: the champion/challenger gate; @champion moves only to a model that beats it on the same holdout."""

from __future__ import annotations

import functools

import datetime as dt
import math
import time
from dataclasses import dataclass, field

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
from trainflow.trainer.evaluate import Scored, score_checkpoint
from trainflow.tasks.gate_rules import Case, annotated_slices, below_floor, decide, judge
from trainflow.config import Config
from trainflow.errors import InfrastructureError
from trainflow.roles.folds import FoldPlan, plan_mismatch
from trainflow.champion import record_missed_move, record_move
from trainflow.run.locks import exclusive
from trainflow.run.tracking import CHAMPION, DECISION_TAG, current_champion, mlflow_key

PROMOTED, NOT_PROMOTED = "promoted", "not_promoted"
AWAITING = "awaiting_approval"  # promotion.approval: required, the gate would promote, nobody has answered yet
DEADLINE_TAG = "trainflow.promotion.approval_deadline"  # when an awaiting version's request times out (UTC)


def _before_alias_move(version: str) -> None:
    """Test hook: called under the lock, after both models are scored and before the alias is re-read and moved."""


def _score(path: str, holdout: Rows, slices: tuple[str, ...], plan: FoldPlan | None = None) -> Scored | None:
    try:
        return score_checkpoint(path, holdout, slices, held_out=plan)
    except SchemaDriftError as exc:
        task_logger("promote").warning("model %s cannot score this holdout: %s", path, exc)
        return None


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


@dataclass
class _Judging:
    """One gate's inputs and what it learned of each champion version it scored (scored once each)."""

    config: Config
    holdout: Rows
    challenger_path: str
    version: str
    judged_on: str
    mine: Scored  # the challenger's outputs on every holdout row
    champions: dict = field(default_factory=dict)  # version -> (theirs, ours, path, plan, mask, problem)

    @functools.cached_property
    def mine_plan(self) -> FoldPlan | None:
        """The challenger's own split (read once, for every champion it meets and the judged rows' note)."""
        return stored_plan(self.challenger_path)

    def case(self, client, name: str, champion_version: str | None) -> tuple[Case, str | None]:
        """The comparison against champion_version (None: no champion) and its checkpoint folder."""
        config, mine = self.config, self.mine
        challenger = mine.metrics().get(config.promotion.metric) if len(mine.labels) else None
        slices_asked = tuple(config.promotion.slices)
        base = dict(config=config, version=self.version, champion_version=champion_version, challenger=challenger)
        if champion_version is None or champion_version == self.version:
            score = None if champion_version is None else challenger
            plain = annotated_slices(mine, None, config) if slices_asked else None
            judged = dict(challenger_judged=challenger, champion_score=score, judged_rows=len(mine.labels))
            path = None if champion_version is None else self.challenger_path
            return Case(**base, **judged, ours=mine, theirs=None, judged_on=self.judged_on, slices=plain), path
        if champion_version not in self.champions:
            self.champions[champion_version] = self._score_champion(client, name, champion_version, slices_asked)
        theirs, ours, path, plan, mask, problem = self.champions[champion_version]
        if mask is not None and theirs is not None:  # only the rows neither model trained or chose on
            theirs, ours = theirs.subset(theirs.held_out), ours.subset(ours.held_out)
        metric, rows = config.promotion.metric, len(ours.labels)
        judged = dict(
            challenger_judged=ours.metrics().get(metric) if rows else None,
            champion_score=theirs.metrics().get(metric) if theirs is not None and len(theirs.labels) else None,
            judged_rows=rows,
        )
        slices = annotated_slices(ours, theirs, config) if slices_asked else None
        return Case(**base, **judged, ours=ours, theirs=theirs, judged_on=self.judged_on, plan=plan, problem=problem,
                    slices=slices), path  # fmt: skip

    def _score_champion(self, client, name: str, champion_version: str, slices_asked: tuple[str, ...]) -> tuple:
        config, uri = self.config, self.config.mlflow.tracking_uri
        path = resolve_checkpoint(f"models:/{name}/{champion_version}", allowed_class_paths(config), uri)
        plan, mine_plan = stored_plan(path), self.mine_plan
        # the same split (the usual nightly case): every test row is held out from both, no row check
        same = plan is not None and mine_plan is not None and plan.holds_out_every_test_row_of(mine_plan)
        mask = None if same else plan
        theirs = _score(path, self.holdout, slices_asked, mask)
        ours = (
            self.mine
            if mask is None
            else score_checkpoint(self.challenger_path, self.holdout, slices_asked, held_out=mask)
        )
        return theirs, ours, path, plan, mask, plan_problem(client, name, champion_version, path, plan)


def _compared(case: Case) -> tuple[bool, str]:
    """The scores' comparison alone (promotion.margin), before the rules."""
    if case.champion_version is None:
        return True, "first model: there is no champion yet"
    if case.champion_version == case.version:  # a retry of this task after the alias moved
        return True, "already the champion (its earlier gate moved the alias: a retried task or a rerun)"
    p = case.config.promotion
    promote_it, reason = decide(case.challenger_judged, case.champion_score, p.mode, p.margin)
    if case.champion_score is None and promote_it:
        reason = "the champion cannot score the current holdout (its schema or classes differ)"
    return promote_it, reason


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
    is read again right before it moves; a champion that changed meanwhile is scored in its turn. The scores'
    comparison first, then each of tasks/gate_rules.py's RULES. scored: the challenger's outputs on holdout with the
    slice columns, as it serves them (calibrate's), else scored here.
    alias: another alias than @champion (a replay policy's, flows/replay.py): the same decision moves that alias
    alone, and records nothing else (no decision tags on the challenger's run, no event, no @champion history).
    With promotion.approval required, a promotion moves the alias only with a person's answer (answer: approve,
    reason, by; tasks/approval.py): none yet, the decision is AWAITING and nothing moves; a rejection is not
    promoted."""
    recorded = alias == CHAMPION
    asks = recorded and (config.promotion.approval == "required" or answer is not None)
    log = task_logger("promote")
    name, version = registered.model_name, registered.model_version
    mine = scored if scored is not None else score_checkpoint(challenger_path, holdout, tuple(config.promotion.slices))
    judging = _Judging(config, holdout, challenger_path, version, judged_on, mine)
    uri = config.mlflow.tracking_uri
    # an explicit client, not MLflow's process-wide tracking URI: gates of two models may run at once in one process
    with exclusive("champion", name, uri):
        client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
        if recorded:
            expire_requests(client, name, version)
        champion_version = current_champion(client, name, alias)
        decision = None
        for _ in range(5):  # a champion moved by a run outside the lock: score the new one
            case, champion_path = judging.case(client, name, champion_version)
            promote_it, reason, checks = judge(case, *_compared(case))
            if promote_it and asks and champion_version != version:  # the first model too
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
            _record_history(client, registered, champion_version, reason)
        theirs_plan = judging.champions[champion_version][3] if champion_version in judging.champions else None
        result = _promotion(
            case, decision or (PROMOTED if promote_it else NOT_PROMOTED), reason, checks, registered, mine,
            serving_checkpoint=challenger_path if promote_it else champion_path,
            judged_rows_note=judged_note(
                judging.mine_plan, theirs_plan, champion_version if case.against_champion else None,
                case.judged_rows,
            ),
        )  # fmt: skip
        if recorded:
            record_decision(client, result, registered.run_id, _tags(result, case, len(mine.labels)))
    if recorded:
        _announce(result)
    return result


def _record_history(client, registered: Registered, champion_version: str | None, reason: str) -> None:
    """The alias's move in its history (trainflow/champion.py); a history MLflow refuses is a warning."""
    name, version = registered.model_name, registered.model_version
    by = f"the gate (MLflow run {registered.run_id}, Prefect flow run {flow_run.get_id() or 'none'})"
    try:
        if champion_version != version:
            record_move(client, name, champion_version, version, reason, by)
        else:  # moved by this version's earlier gate, which may have died before recording it
            record_missed_move(client, name, version, reason, by)
    except Exception as exc:  # noqa: BLE001 - the alias moved
        task_logger("promote").warning(
            "promotion: v%s is @%s; the move was not added to its history: %s: %s",
            version,
            CHAMPION,
            type(exc).__name__,
            exc,
        )


def _promotion(
    case: Case, decision: str, reason: str, checks: list, registered: Registered, mine: Scored, **where: str | None
) -> Promotion:
    """The gate's result; mine: the challenger's outputs on every holdout row; where: serving_checkpoint (the
    @champion's checkpoint folder after the gate) and judged_rows_note."""
    p, promoted = case.config.promotion, decision == PROMOTED
    return Promotion(
        decision=decision,
        reason=reason,
        metric=p.metric,
        mode=p.mode,
        margin=p.margin,
        min_score=p.min_score,
        below_floor=below_floor(case.challenger, p.min_score, p.mode),
        model_name=registered.model_name,
        challenger_version=case.version,
        challenger_score=case.challenger_judged,
        champion_version=case.champion_version,
        champion_score=case.champion_score,
        serving_version=case.version if promoted else case.champion_version,
        confidence=case.confidence,
        slices=case.slices,
        calibration=mine.calibration() if len(mine.labels) else None,
        judged_on=case.judged_on,
        rows=case.judged_rows,
        checks=checks,
        **where,
    )


def _tags(result: Promotion, case: Case, all_rows: int) -> dict[str, str]:
    """The decision's tags on the version and its run."""
    metric, mode, margin, floor = result.metric, result.mode, result.margin, result.min_score
    tags = {
        DECISION_TAG: result.decision,
        "trainflow.promotion.reason": result.reason,
        "trainflow.promotion.metric": f"{metric} ({mode}, margin {margin:g})",
        # both on the judged rows (those held out from both); the challenger's on all its test rows beside them
        "trainflow.promotion.challenger_score": str(result.challenger_score),
        "trainflow.promotion.judged_rows": str(result.rows),
        "trainflow.promotion.challenger_score_all_test_rows": f"{case.challenger} ({all_rows} rows)",
        "trainflow.promotion.champion_score": str(result.champion_score),
        "trainflow.promotion.champion_version": str(result.champion_version),
        "trainflow.promotion.floor": "none"
        if floor is None
        else f"{'missed' if result.below_floor else 'met'} ({metric} {floor:g})",
    }
    if result.decision == AWAITING:
        deadline = time.time() + case.config.promotion.approval_timeout_h * 3600
        tags[DEADLINE_TAG] = dt.datetime.fromtimestamp(deadline, dt.timezone.utc).isoformat(timespec="seconds")
    return tags


def _announce(result: Promotion) -> None:
    """The decision as a Prefect event (trainflow.model.<decision>) and a log line."""
    log, name = task_logger("promote"), result.model_name
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
    champion = result.champion_version
    against = "no champion" if champion is None else f"champion v{champion} {_fmt(result.champion_score)}"
    # the figures are the judged rows' (test rows), not the validation split's that the metric's name says
    log.info(
        "promotion: %s v%s on %d %s rows (%s on them %s vs %s; %s is better): %s",
        result.decision,
        result.challenger_version,
        result.rows,
        result.judged_on,
        result.metric.removeprefix("val_"),
        _fmt(result.challenger_score),
        against,
        "higher" if result.mode == "max" else "lower",
        result.reason,
    )


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
