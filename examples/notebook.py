"""trainflow from a notebook: a pandas DataFrame in, a registered model and its leaderboard out.

    python examples/notebook.py [WORK_FOLDER]

Runs as written in the test suite (tests/test_notebook_example.py). The table is scikit-learn's breast cancer data
(569 rows, shipped with scikit-learn); a quarter of it is kept back to try the model on afterwards.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from sklearn.datasets import load_breast_cancer

import trainflow


def main(work: Path) -> dict:
    frame = load_breast_cancer(as_frame=True).frame  # 30 measurements and `target` (0 malignant, 1 benign)
    frame.columns = [c.replace(" ", "_") for c in frame.columns]
    mine = frame.sample(frac=0.25, random_state=0)  # rows no part of training sees
    train = frame.drop(mine.index)

    config = {
        "data": {"label": "target"},  # no data.path: the DataFrame is the table (kept as Parquet under storage_path)
        "task": "classification",
        "model": {"type": ["xgboost", "lightgbm"]},  # two families and their weighted ensemble
        "train": {"folds": 1},  # one validation split, for speed (the default cross-fits a table this small)
        "scaling": {"num_workers": 1},
        "storage_path": str(work / "runs"),
        "mlflow": {"tracking_uri": f"sqlite:///{work / 'mlflow.db'}", "registered_model": "breast-cancer"},
    }
    summary = trainflow.retrain(config, data=train)
    print(trainflow.leaderboard(summary).to_string(index=False))

    model = trainflow.load_model("models:/breast-cancer@champion", tracking_uri=config["mlflow"]["tracking_uri"])
    proba = model.predict_proba(mine)  # one column per class, each row summing to 1
    print(proba.head())
    scores = model.evaluate(mine)  # the model's metrics on the rows kept back
    print({k: round(v, 4) for k, v in scores.items()})
    return {"summary": summary, "proba": proba, "scores": scores, "kept_back": mine, "train": train, "config": config}


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="trainflow-notebook-")))
