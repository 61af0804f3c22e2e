"""Monitoring counts honestly: every labelled prediction once, and a label file it cannot join is refused naming
the file, the column and the count."""

from __future__ import annotations

import pyarrow as pa
import pytest

from trainflow.errors import DataError
from trainflow.tasks.monitor import join_labels

PREDICTIONS = pa.table({"id": pa.array(range(1000), pa.int64()), "prediction": [0, 1] * 500,
                        "proba_0": [0.5] * 1000, "proba_1": [0.5] * 1000})


@pytest.mark.parametrize("truth, message", [
    (pa.table({"id": list(range(100)) * 20, "y": [1] * 2000}), "100 'id' value(s) appear more than once (2000 rows"),
    (pa.table({"id": pa.array([], pa.int64()), "y": pa.array([], pa.int64())}), "has no rows"),
    (pa.table({"id": ["1", "2"], "y": [1, 0]}), "column 'id' holds string values, the predictions' ids are int64"),
    (pa.table({"id": [1.0, 2.0], "y": [1, 0]}), "holds double values"),
    (pa.table({"id": [1, 2, 3], "y": [1, None, 0]}), "column 'y' has 1 empty value"),
    (pa.table({"id": [1, None, 3], "y": [1, 0, 0]}), "column 'id' has 1 empty value"),
    (pa.table({"key": [1], "y": [1]}), "column 'id' not found"),
    (pa.table({"id": [5000, 5001], "y": [1, 0]}), "none of its 'id' values"),
], ids=["repeated ids", "empty", "string ids", "float ids", "null label", "null id", "no id column", "no match"])
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
