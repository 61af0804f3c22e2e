"""cost-curve: what the default retrain costs as the table grows, beside HistGradientBoosting and AutoGluon-Tabular's
defaults on the same rows in the same run.

For each size (COST_CURVE_ROWS, default 150, 1,500, 15,000 and 150,000 rows) of the bundled generator's table
(trainflow.tables.sample: 12 columns of numbers and text, a binary label), a quarter is held out (the same rows for all
three). trainflow: `trainflow retrain` of the default config (the table, its label, storage and MLflow; nothing else)
as a whole process, which also predicts the held-out rows. Baselines: scikit-learn's HistGradientBoosting (fit and
predict in this process) and AutoGluon-Tabular 1.6 with its defaults (medium_quality, no time limit) as a whole process
in its own venv (`make autogluon`; skipped without it). The ratio is trainflow's seconds over AutoGluon's (HGB's
without it); accuracy on the held-out rows beside each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import yaml

from bench.model_quality import AUTOGLUON_PYTHON, ID, autogluon, baseline, holdout, score

REPO = Path(__file__).resolve().parents[1]
SIZES = [int(n) for n in os.environ.get("COST_CURVE_ROWS", "150,1500,15000,150000").split(",")]
LABEL = "churned"


def _trainflow(train, test, work: Path) -> tuple[float, object]:
    pq.write_table(_table(train), work / "train.parquet")
    pq.write_table(_table(test.drop(columns=[LABEL])), work / "score.parquet")
    config = {
        "data": {"path": "train.parquet", "label": LABEL, "id_column": ID},
        "storage_path": "runs",
        "mlflow": {"experiment": "cost-curve", "registered_model": f"cost-{work.name}"},
        "inference": {"input": "score.parquet", "output": "predictions"},
    }
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false")
    started = time.perf_counter()
    done = subprocess.run(
        [str(Path(sys.executable).with_name("trainflow")), "retrain", "--config", str(work / "config.yaml")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"trainflow retrain exited {done.returncode} on {work.name}: {done.stderr[-3000:]}")
    preds = pq.read_table(work / "predictions").to_pandas().set_index(ID).loc[test[ID]]
    return seconds, preds["prediction"].to_numpy()


def _table(frame):
    import pyarrow as pa

    return pa.Table.from_pandas(frame, preserve_index=False)


def main() -> None:
    from trainflow.tables.sample import make_churn_table

    for rows in SIZES:
        frame = make_churn_table(rows, seed=rows).to_pandas().drop(columns=["customer_id"])
        train, test = holdout(frame, LABEL, "classification")
        truth = test[LABEL].to_numpy()
        with tempfile.TemporaryDirectory(prefix=f"cost-curve-{rows}-") as tmp:
            work = Path(tmp) / f"rows{rows}"
            work.mkdir()
            ours, pred = _trainflow(train, test, work)
            started = time.perf_counter()
            hgb = score("classification", truth, baseline(train, test, LABEL, "classification"))
            hgb_s = time.perf_counter() - started
            started = time.perf_counter()
            ag = autogluon(train, test, LABEL, "classification", Path(tmp) / "autogluon", seconds=36_000, presets="")
            ag_s = time.perf_counter() - started
        mine = score("classification", truth, pred)
        if ag is None:
            base, what = hgb_s, f"HistGradientBoosting; no AutoGluon venv at {AUTOGLUON_PYTHON}: make autogluon"
        else:
            base, what = ag_s, f"AutoGluon defaults, accuracy {score('classification', truth, ag):.4f}"
        print(
            f"cost-curve-{rows}: trainflow {ours:.1f} s, baseline {base:.1f} s, ratio {ours / base:.2f}  ({what}; "
            f"trainflow accuracy {mine:.4f}; HistGradientBoosting {hgb_s:.1f} s, accuracy {hgb:.4f}; "
            f"{len(test):,} held-out rows)",
            flush=True,
        )


if __name__ == "__main__":
    main()
