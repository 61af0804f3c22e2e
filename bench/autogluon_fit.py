"""AutoGluon-Tabular on one held-out split, run in AutoGluon's own virtual environment (`make autogluon`):
AutoGluon 1.6 needs pandas < 2.4 and pyarrow < 25, older than trainflow's, so it cannot share trainflow's venv.

    .venv-autogluon/bin/python bench/autogluon_fit.py TRAIN.parquet TEST.parquet LABEL TASK TIME_LIMIT_S OUT.parquet [PRESETS]

Fits TabularPredictor with PRESETS (default: AutoGluon's own, medium_quality) and the time limit on TRAIN (every column but `row_id` and the label
a feature), predicts TEST, writes OUT with columns row_id and prediction.
"""

from __future__ import annotations

import sys
import tempfile

import pandas as pd
from autogluon.tabular import TabularPredictor

ID = "row_id"


def main(train_path: str, test_path: str, label: str, task: str, time_limit: str, out: str, presets: str = "") -> None:
    train, test = pd.read_parquet(train_path), pd.read_parquet(test_path)
    problem = "regression" if task == "regression" else ("binary" if train[label].nunique() == 2 else "multiclass")
    with tempfile.TemporaryDirectory(prefix="autogluon-") as path:
        predictor = TabularPredictor(
            label=label,
            problem_type=problem,
            path=path,
            verbosity=0,
            eval_metric="root_mean_squared_error" if task == "regression" else "accuracy",
        )
        predictor.fit(train.drop(columns=[ID]), time_limit=float(time_limit), presets=presets or None)
        pred = predictor.predict(test.drop(columns=[ID, label], errors="ignore"))
    pd.DataFrame({ID: test[ID].to_numpy(), "prediction": pred.to_numpy()}).to_parquet(out)


if __name__ == "__main__":
    main(*sys.argv[1:8])
