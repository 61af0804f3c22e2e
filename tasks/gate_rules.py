"""The champion/challenger gate's rules (tasks/promote.py gate loops over RULES, in order).

The gate first compares the two scores (`decide`: the challenger must beat the champion by more than
promotion.margin); each rule then reads the comparison (a Case) and may keep the challenger from @champion, saying
why. A rule is its name, the config keys it reads, its check and, where it has something to report, its line in the
summary (the summary JSON's promotion.checks, printed by the CLI). A new rule is one Rule here and its keys in
trainflow/config/operations.py PromotionSection; nothing else changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from trainflow.config import Config
from trainflow.roles.folds import FoldPlan
from trainflow.trainer.evaluate import Scored, paired_bootstrap, slice_metrics


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


@dataclass
class Case:
    """One comparison the rules judge: the challenger (version) against @champion (champion_version, None when there
    is none) on the judged rows (with a champion: the rows held out from both)."""

    config: Config
    version: str
    champion_version: str | None
    challenger: float | None  # the challenger's promotion.metric on all its test rows
    challenger_judged: float | None  # ... on the judged rows
    champion_score: float | None  # the champion's on the judged rows (None: it cannot score them, or none)
    ours: Scored  # the challenger's outputs on the judged rows
    theirs: Scored | None  # the champion's (None: no champion, or it cannot score this holdout)
    judged_rows: int
    judged_on: str
    plan: FoldPlan | None = None  # the champion's stored split plan
    problem: str | None = None  # why that plan is not to be trusted
    slices: dict | None = None  # the challenger's slices, each with the champion's metric beside it
    confidence: dict | None = None  # the paired bootstrap of the gain, once the confidence rule ran

    @property
    def against_champion(self) -> bool:
        """A champion other than the challenger itself (not a retried gate whose alias already moved)."""
        return self.champion_version is not None and self.champion_version != self.version


@dataclass(frozen=True)
class Rule:
    """name; keys: the config keys it reads; check(case, promoted so far) -> why the challenger is not promoted,
    or None; line(case) -> its line in the summary, or None (nothing to report)."""

    name: str
    keys: tuple[str, ...]
    check: Callable[[Case, bool], str | None]
    line: Callable[[Case], str | None] = lambda case: None


def _worst_slice(case: Case, promoted: bool) -> str | None:
    """The worst judged slice on which the challenger falls more than promotion.max_slice_drop below the champion."""
    p = case.config.promotion
    if not promoted or case.theirs is None or not case.slices or p.max_slice_drop is None:
        return None
    worst = None
    for column, values in case.slices.items():
        for value, entry in values.items():
            mine, other = entry.get(p.metric), entry.get("champion_" + p.metric)
            if other is None or mine is None or not (math.isfinite(other) and math.isfinite(mine)):
                continue
            drop = (other - mine) if p.mode == "max" else (mine - other)
            if entry["judged"] and drop > p.max_slice_drop and (worst is None or drop > worst[0]):
                worst = (drop, column, value, mine, other, entry["rows"])
    if worst is None:
        return None
    drop, column, value, mine, other, rows = worst
    return (
        f"on the slice {column}={value} ({rows} rows) its {p.metric} {mine:.6g} is {drop:.6g} worse than the "
        f"champion's {other:.6g}, more than promotion.max_slice_drop {p.max_slice_drop:g}"
    )


def _noise(case: Case, promoted: bool) -> str | None:
    """promotion.confidence: the paired bootstrap of the gain (kept on the case for the record); a reason when the
    gain is within the judged rows' noise."""
    p = case.config.promotion
    if not promoted or case.theirs is None or case.champion_score is None or p.confidence is None:
        return None
    boot = paired_bootstrap(case.ours, case.theirs, p.metric, p.mode, p.margin)
    case.confidence = boot
    if boot["resamples"] and boot["share_not_better"] > 1.0 - p.confidence:
        return (
            f"the gain {boot['gain']:+.6g} is within the holdout's noise: the challenger beats the champion by "
            f"more than {p.margin:g} in {1 - boot['share_not_better']:.0%} of {boot['resamples']} paired bootstrap "
            f"resamples, fewer than promotion.confidence {p.confidence:g}"
        )
    return None


def _confidence_line(case: Case) -> str | None:
    boot, p = case.confidence, case.config.promotion
    if not boot or not boot.get("resamples"):
        return None
    return (
        f"confidence: beats the champion by more than {p.margin:g} in {1 - boot['share_not_better']:.0%} of "
        f"{boot['resamples']} paired bootstrap resamples (promotion.confidence {p.confidence:g})"
    )


def _plans_differ(plan: FoldPlan | None) -> str:
    return "its split is unknown" if plan is None else f"it was trained with {plan.describe()}"


def _too_few_rows(case: Case, promoted: bool) -> str | None:
    """Fewer judged rows than promotion.min_test_rows: no promotion on that evidence."""
    least = case.config.promotion.min_test_rows
    if not case.against_champion or not (promoted or not case.judged_rows) or case.judged_rows >= least:
        return None
    return (
        f"only {case.judged_rows} {case.judged_on} rows are held out from both the challenger and champion "
        f"v{case.champion_version} ({_plans_differ(case.plan)}), fewer than promotion.min_test_rows {least}: "
        "no promotion on that evidence"
    )


def _untrusted_plan(case: Case, promoted: bool) -> str | None:
    """The champion's stored split plan disagrees with its own training: which rows it never saw is unknown."""
    if not case.against_champion or not case.problem:
        return None
    return (
        f"champion v{case.champion_version}'s stored split plan (split.json) does not match its own training "
        f"({case.problem}): which rows it never trained on is unknown, so no promotion on that evidence"
    )


def _floor(case: Case, promoted: bool) -> str | None:
    """promotion.min_score: a challenger below the floor is registered, never @champion (the first one included)."""
    p = case.config.promotion
    if case.champion_version == case.version or not below_floor(case.challenger, p.min_score, p.mode):
        return None
    if case.challenger is not None and math.isfinite(case.challenger):
        return (
            f"{p.metric} {case.challenger:.6g} misses the floor promotion.min_score {p.min_score:g}: registered, "
            "never @champion"
        )
    return f"{p.metric} is missing or not finite, below the floor promotion.min_score {p.min_score:g}"


def _floor_line(case: Case) -> str | None:
    p = case.config.promotion
    if p.min_score is None:
        return None
    met = "missed" if below_floor(case.challenger, p.min_score, p.mode) else "met"
    return f"floor: {met} ({p.metric} at least as good as promotion.min_score {p.min_score:g})"


# in order: a later rule's reason replaces an earlier one's (the champion's untrusted plan and the floor are said
# whatever came before them)
RULES: tuple[Rule, ...] = (
    Rule("slices", ("promotion.slices", "promotion.max_slice_drop", "promotion.min_slice_rows"), _worst_slice),
    Rule("confidence", ("promotion.confidence", "promotion.margin"), _noise, _confidence_line),
    Rule("min_test_rows", ("promotion.min_test_rows",), _too_few_rows),
    Rule("champion_plan", (), _untrusted_plan),
    Rule("floor", ("promotion.min_score",), _floor, _floor_line),
)


def judge(case: Case, promoted: bool, reason: str) -> tuple[bool, str, list[dict[str, str]]]:
    """(promoted, reason, the rules' summary lines) once every rule has read the case."""
    for rule in RULES:
        why = rule.check(case, promoted)
        if why:
            promoted, reason = False, why
    lines = [{"rule": rule.name, "line": line} for rule in RULES if (line := rule.line(case))]
    return promoted, reason, lines


def annotated_slices(ours: Scored, theirs: Scored | None, config: Config) -> dict:
    """The challenger's slices of the judged rows, each with the champion's promotion.metric beside it (None where
    the champion has none)."""
    p = config.promotion
    slices = slice_metrics(ours, p.min_slice_rows)
    if theirs is not None:
        others = slice_metrics(theirs, p.min_slice_rows)
        for column, values in slices.items():
            for value, entry in values.items():
                entry["champion_" + p.metric] = others.get(column, {}).get(value, {}).get(p.metric)
    return slices
