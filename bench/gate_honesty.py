"""gate-honesty: how often trainflow's champion gate promotes a challenger that is no better, how often it promotes one
that truly is, and how optimistic the reported figure is, judged on test rows (trainflow) against the single split
that also chose the model (the baseline: the rows that early-stopped and picked the challenger also judge it).

Each run draws a fresh table of the same synthetic population (logistic, 20 features) and does what a retrain does
with it: the fold plan's roles by trainflow's seeded hash (test 0.2, validation 0.2 of the rest), four candidates
(logistic regressions of several strengths, as the families are) fitted on the training rows and the best kept by
validation accuracy; then trainflow's own gate statistics (trainer/evaluate.paired_bootstrap and the decision rules
of tasks/promote at the default promotion.confidence, margin 0) compare it with the champion, a run of the same procedure on an
earlier draw. Null: both draws of the same population, no challenger truly better. Lift: the champion lacks one
informative feature (worth about one accuracy point); the challenger has it; 5,000 test rows.

    python -m bench gate-honesty   (GATE_HONESTY_RUNS=200 by default)
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from bench.common import report

FEATURES = 20
CANDIDATE_C = (0.003, 0.03, 0.3, 3.0)
DROPPED = 5  # the feature the lift scenario's champion lacks: about 1.1 accuracy points


def _population(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features, labels, ids) of a fresh draw of the population."""
    w = np.linspace(1.0, 0.05, FEATURES) * 0.6
    x = rng.normal(size=(rows, FEATURES))
    y = (rng.random(rows) < 1 / (1 + np.exp(-(x @ w)))).astype(np.int64)
    return x, y, rng.integers(0, 2**62, rows)


class _Model:
    """A fitted candidate and the feature columns it reads (a champion without one informative feature)."""

    def __init__(self, fit, columns):
        self.fit, self.columns = fit, columns

    def predict_proba(self, x):
        return self.fit.predict_proba(x[:, self.columns])

    def score(self, x, y):
        return self.fit.score(x[:, self.columns], y)


def _roles(ids: np.ndarray, seed: int) -> np.ndarray:
    from trainflow.roles.folds import FoldPlan

    plan = FoldPlan(seed=seed, key_columns=("id",), test_fraction=0.2, validation_fraction=0.2)
    return plan.roles(pa.table({"id": ids}))


def _train(rng, rows: int, drop: int | None, seed: int):
    """One retrain: (chosen model, its validation rows, its test rows, its reported validation and test accuracy).
    drop: a feature the model does not get."""
    from sklearn.linear_model import LogisticRegression

    from trainflow.roles.folds import TEST, TRAIN, VALIDATION

    x, y, ids = _population(rng, rows)
    roles = _roles(ids, seed)
    tr, va, te = (roles == TRAIN), (roles == VALIDATION), (roles == TEST)
    columns = [i for i in range(FEATURES) if i != drop]
    fits = [_Model(LogisticRegression(C=c, max_iter=300).fit(x[tr][:, columns], y[tr]), columns) for c in CANDIDATE_C]
    scores = [m.score(x[va], y[va]) for m in fits]
    best = fits[int(np.argmax(scores))]
    return best, (x[va], y[va]), (x[te], y[te]), max(scores), best.score(x[te], y[te])


def _scored(model, x, y, prep):
    from trainflow.trainer.evaluate import Scored

    return Scored(prep, np.log(np.clip(model.predict_proba(x), 1e-12, 1)).astype(np.float32), y)


def _confidence() -> float:
    """promotion.confidence: the config's default unless GATE_HONESTY_CONFIDENCE says otherwise."""
    from trainflow.config import PromotionSection

    return float(os.environ.get("GATE_HONESTY_CONFIDENCE") or PromotionSection().confidence)


def _promotes(challenger, champion, rows, prep) -> bool:
    """trainflow's gate decision on these rows (tasks/promote: decide, then the paired bootstrap's confidence)."""
    from trainflow.tasks.gate_rules import decide
    from trainflow.trainer.evaluate import paired_bootstrap

    x, y = rows
    mine, theirs = _scored(challenger, x, y, prep), _scored(champion, x, y, prep)
    win, _ = decide(mine.metrics()["val_accuracy"], theirs.metrics()["val_accuracy"], "max", 0.0)
    if not win:
        return False
    boot = paired_bootstrap(mine, theirs, "val_accuracy", "max", 0.0)
    return not (boot["resamples"] and boot["share_not_better"] > 1.0 - _confidence())


def main() -> None:
    from trainflow.preprocessors.tabular import TabularPreprocessor

    runs = int(os.environ.get("GATE_HONESTY_RUNS", "200"))
    prep = TabularPreprocessor.from_stats("classification", "y", ["x"], {"x": (0.0, 1.0)}, {}, [0, 1], None, 1)
    rng = np.random.default_rng(0)
    fresh_x, fresh_y, _ = _population(rng, 50_000)
    null = {"test": 0, "single": 0}
    optimism = {"test": [], "single": []}
    for run in range(runs):  # small tables (1,000 rows: 200 test, 160 validation rows), nobody truly better
        champion, *_ = _train(rng, 1000, None, seed=run)
        challenger, val, test, val_acc, test_acc = _train(rng, 1000, None, seed=run)
        null["single"] += _promotes(challenger, champion, val, prep)
        null["test"] += _promotes(challenger, champion, test, prep)
        truth = challenger.score(fresh_x, fresh_y)
        optimism["single"].append(val_acc - truth)
        optimism["test"].append(test_acc - truth)
    lift = {"test": 0, "single": 0}
    lift_runs, gains = max(runs // 4, 10), []
    for run in range(lift_runs):  # 25,000 rows (5,000 test rows); the champion lacks one informative feature
        champion, *_ = _train(rng, 25_000, DROPPED, seed=run)
        challenger, val, test, _, _ = _train(rng, 25_000, None, seed=run)
        gains.append(challenger.score(*test) - champion.score(test[0], test[1]))
        lift["single"] += _promotes(challenger, champion, val, prep)
        lift["test"] += _promotes(challenger, champion, test, prep)
    rate = {k: 100.0 * v / runs for k, v in null.items()}
    report(
        "gate-honesty-false-promotions",
        rate["test"],
        rate["single"],
        "%",
        rate["test"] / rate["single"] if rate["single"] else float("nan"),
        f"{runs} challengers no better than the champion, 1,000-row tables; target <= 5% at confidence "
        f"{_confidence():g}",
    )
    power = {k: 100.0 * v / lift_runs for k, v in lift.items()}
    report(
        "gate-honesty-power",
        power["test"],
        power["single"],
        "%",
        power["test"] / power["single"] if power["single"] else float("nan"),
        f"{lift_runs} challengers {100 * float(np.mean(gains)):.2f} accuracy points better on 5,000 test rows; "
        "target >= 80%",
    )
    opt = {k: 100.0 * float(np.mean(v)) for k, v in optimism.items()}
    spread = 100.0 * float(np.std(optimism["test"]) / np.sqrt(runs))
    report(
        "gate-honesty-optimism",
        opt["test"],
        opt["single"],
        "accuracy points",
        opt["test"] / opt["single"] if opt["single"] else float("nan"),
        f"reported minus 50,000 fresh rows, mean of {runs}; the test figure's standard error {spread:.2f}",
    )


if __name__ == "__main__":
    main()
