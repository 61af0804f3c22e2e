"""What a model relies on: permutation importance of the table's own columns (scikit-learn's
permutation_importance over the checkpoint's preprocessor and model), and a tree family's own gain beside it.

Columns are permuted in the raw table, before the preprocessor, so a one-hot group, an embedding code or a date's
parts move together and every score names a column of the user's table.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from trainflow.trainer.metrics import compute_metrics
from trainflow.trainer.serving.servable import ServableModel


class _Scorer:
    """A fitted 'estimator' for scikit-learn: raw rows in (a DataFrame), the metric of the checkpoint's outputs out,
    larger is better (a metric to minimise is negated)."""

    def __init__(self, servable: ServableModel, metric: str, mode: str):
        self.servable, self.metric, self.sign = servable, metric, 1.0 if mode == "max" else -1.0

    def fit(self, x, y):  # permutation_importance checks that its estimator has fit; the model is trained already
        return self

    def __call__(self, estimator: Any, x: pd.DataFrame, y: np.ndarray) -> float:
        prep = self.servable.preprocessor
        outputs = self.servable.predict(prep.transform_features(pa.Table.from_pandas(x, preserve_index=False)))
        return self.sign * compute_metrics(prep.task, outputs, y, prep).get(self.metric, float("nan"))


def feature_importance(
    servable: ServableModel, table: pa.Table, metric: str, mode: str, repeats: int = 5, seed: int = 0
) -> list[dict[str, Any]]:
    """Per feature column, best first: how much metric worsens when the column's values are shuffled (mean and
    standard deviation over repeats), and for tree families the library's gain share of the column."""
    from sklearn.inspection import permutation_importance

    prep = servable.preprocessor
    frame = table.select(prep.feature_order).to_pandas()
    y = prep.transform_label(table)
    scorer = _Scorer(servable, metric, mode)
    result = permutation_importance(scorer, frame, y, scoring=scorer, n_repeats=repeats, random_state=seed, n_jobs=1)
    rows = [
        {"column": col, "importance": float(mean), "importance_std": float(std)}
        for col, mean, std in zip(prep.feature_order, result.importances_mean, result.importances_std)
    ]
    native = getattr(servable.predict, "native_importance", None)
    if native is not None:
        gains = native()
        per_column = pd.Series(gains).groupby(pd.Series(prep.feature_sources())).sum()
        total = float(per_column.sum()) or 1.0
        for row in rows:
            row["gain_share"] = float(per_column.get(row["column"], 0.0)) / total
    return sorted(rows, key=lambda r: -r["importance"])
