"""Monitoring counts honestly: every labelled prediction once, and a label file it cannot join is refused naming
the file, the column and the count."""

from __future__ import annotations

import pyarrow as pa
import pytest

from trainflow.errors import DataError
from trainflow.tasks.monitor import join_labels

PREDICTIONS = pa.table(
    {
        "id": pa.array(range(1000), pa.int64()),
        "prediction": [0, 1] * 500,
        "proba_0": [0.5] * 1000,
        "proba_1": [0.5] * 1000,
    }
)


@pytest.mark.parametrize(
    "truth, message",
    [
        (
            pa.table({"id": list(range(100)) * 20, "y": [1] * 2000}),
            "100 'id' value(s) appear more than once (2000 rows",
        ),
        (pa.table({"id": pa.array([], pa.int64()), "y": pa.array([], pa.int64())}), "has no rows"),
        (pa.table({"id": ["1", "2"], "y": [1, 0]}), "column 'id' holds string values, the predictions' ids are int64"),
        (pa.table({"id": [1.0, 2.0], "y": [1, 0]}), "holds double values"),
        (pa.table({"id": [1, 2, 3], "y": [1, None, 0]}), "column 'y' has 1 empty value"),
        (pa.table({"id": [1, None, 3], "y": [1, 0, 0]}), "column 'id' has 1 empty value"),
        (pa.table({"key": [1], "y": [1]}), "column 'id' not found"),
        (pa.table({"id": [5000, 5001], "y": [1, 0]}), "none of its 'id' values"),
    ],
    ids=["repeated ids", "empty", "string ids", "float ids", "null label", "null id", "no id column", "no match"],
)
def test_a_label_file_that_cannot_be_joined_honestly_is_refused(truth, message):
    with pytest.raises(DataError, match="labels.csv") as err:
        join_labels(PREDICTIONS, truth, "id", "y", "labels.csv")
    assert message in str(err.value)


def test_each_labelled_prediction_counts_once_with_ids_of_another_integer_width():
    truth = pa.table({"id": pa.array([3, 1, 2], pa.int32()), "y": [1, 0, 1]})
    joined = join_labels(PREDICTIONS, truth, "id", "y", "labels.csv")
    assert joined.num_rows == 3 and sorted(joined["id"].to_pylist()) == [1, 2, 3]
    repeated_predictions = pa.concat_tables([PREDICTIONS.slice(0, 10)] * 2)
    with pytest.raises(DataError, match="the predictions: 10 'id' value"):
        join_labels(repeated_predictions, truth, "id", "y", "labels.csv")


def test_performance_estimated_from_calibrated_probabilities_matches_what_labels_then_measure():
    """CBPE: labels drawn from the probabilities themselves (a calibrated model): the expected accuracy, F1 and ROC
    AUC from the probabilities alone equal what those labels measure, to sampling noise."""
    import numpy as np
    from sklearn.metrics import accuracy_score, f1_score, roc_auc_score

    from trainflow.preprocessors.tabular import TabularPreprocessor
    from trainflow.trainer.evaluate import estimate_metrics

    rng = np.random.default_rng(0)
    p = rng.beta(2, 3, 20_000)
    y = (rng.random(p.size) < p).astype(int)
    chosen = (p >= 0.5).astype(int)
    prep = TabularPreprocessor.from_stats(
        "classification", "y", ["x"], {"x": (0.0, 1.0, 0.0, 1.0)}, {}, [0, 1], None, p.size
    )
    estimated = estimate_metrics(prep, pa.table({"prediction": chosen, "proba_0": 1 - p, "proba_1": p}))
    assert estimated["val_accuracy"] == pytest.approx(accuracy_score(y, chosen), abs=0.015)
    assert estimated["val_f1"] == pytest.approx(f1_score(y, chosen), abs=0.02)
    assert estimated["val_roc_auc"] == pytest.approx(roc_auc_score(y, p), abs=0.015)
    # a model whose probabilities are all 0.5 knows nothing: chance, whatever it predicts
    flat = estimate_metrics(
        prep, pa.table({"prediction": chosen, "proba_0": [0.5] * p.size, "proba_1": [0.5] * p.size})
    )
    assert flat["val_accuracy"] == pytest.approx(0.5) and flat["val_roc_auc"] == pytest.approx(0.5, abs=1e-9)


def test_a_verdict_rests_on_monitor_min_rows_labelled_predictions():
    from trainflow.config import config_from_dict
    from trainflow.tasks.monitor import _verdict

    cfg = config_from_dict(
        {
            "data": {"path": "x.parquet", "label": "y"},
            "task": "classification",
            "promotion": {"metric": "val_roc_auc"},
            "monitor": {"min_rows": 100, "max_drop": 0.05},
        }
    )
    registered = {"test_roc_auc": 0.80, "best_val_roc_auc": 0.90}  # the test rows' figure is the baseline
    ok, worse, few = (
        _verdict(cfg, registered, {"val_roc_auc": auc}, rows, 200)
        for auc, rows in ((0.78, 150), (0.70, 150), (0.50, 99))
    )
    assert (ok["verdict"], ok["judged"], ok["degraded"], ok["baseline_on"]) == ("ok", True, False, "test")
    assert ok["drop"] == pytest.approx(0.02) and ok["coverage"] == 0.75
    assert (worse["verdict"], worse["judged"], worse["degraded"]) == ("degraded", True, True)
    # fewer labelled predictions than monitor.min_rows: no verdict however far the score fell, and why
    assert not few["judged"] and not few["degraded"]
    assert few["verdict"] == "none: 99 labelled predictions, fewer than monitor.min_rows 100"
