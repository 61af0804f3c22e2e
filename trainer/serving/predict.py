"""Batch prediction with a checkpoint's own preprocessor, as a Ray Data callable class."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from trainflow.preprocessors.baseline import count_batch, merge_counts
from trainflow.trainer.serving.servable import ServableModel, load_servable


def predict_table(servable: ServableModel, table: pa.Table, id_column: str | None = None) -> pa.Table:
    """Predictions for every row of table: [id], prediction, and proba_<class> for classification."""
    x = servable.preprocessor.transform_features(table)  # unseen text values: the unknown code
    out = servable.predict(x)
    cols = {}
    if id_column is not None:
        cols[id_column] = table[id_column]
    decoded = servable.preprocessor.decode_predictions(out, servable.threshold)
    check_finite(decoded, servable.source)
    cols.update(decoded)
    return pa.table(cols)


class NonFiniteOutput(ValueError):
    """A checkpoint's predictions hold NaN or infinite values: never committed."""


def check_finite(decoded: dict, source: str) -> None:
    """NonFiniteOutput naming the checkpoint's files when a probability or a predicted value is NaN or infinite
    (edited or out-of-range state that the load checks did not catch); a batch like that is never written."""
    for name, col in decoded.items():
        values = np.asarray(col) if not isinstance(col, pa.Array) else None
        if values is not None and values.dtype.kind == "f" and not np.isfinite(values).all():
            bad = int((~np.isfinite(values)).sum())
            raise NonFiniteOutput(
                f"checkpoint {source} (preprocessor.json, calibration.json, its model file): "
                f"{bad} of {len(values)} rows got a non-finite {name}; nothing was written"
            )


class CountCollector:
    """A Ray actor (0 CPUs) summing the predictors' per-batch counts in the model's baseline buckets: drift is
    measured in the prediction pass itself, never by reading the scoring table again."""

    def __init__(self):
        self.parts: list[dict[str, list[int]]] = []

    def add(self, counts: dict[str, list[int]]) -> None:
        self.parts = [merge_counts([*self.parts, counts])]

    def total(self) -> dict[str, list[int]]:
        return merge_counts(self.parts)


class BatchPredictor:
    """Loads the checkpoint once per actor, then predicts pyarrow batches (and counts them for drift when given
    a CountCollector)."""

    def __init__(self, checkpoint_path: str, id_column: str | None = None, use_gpu: bool = False, collector=None):
        self.device = "cuda" if use_gpu and torch.cuda.is_available() else "cpu"
        self.servable = load_servable(checkpoint_path, self.device)
        self.id_column = id_column
        self.collector = collector

    def __call__(self, batch: pa.Table) -> pa.Table:
        if self.collector is not None:
            import ray

            # waited for: every batch's counts are in before the write (and so the pass) ends
            ray.get(self.collector.add.remote(count_batch(self.servable.preprocessor.baseline, batch)))
        return predict_table(self.servable, batch, self.id_column)


def _columns(feature_order: list[str], id_column: str | None) -> list[str]:
    return feature_order + ([id_column] if id_column and id_column not in feature_order else [])


def predict_arrow(
    table: pa.Table, checkpoint_path: str, id_column: str | None, feature_order: list[str], batch_size: int = 4096
) -> pa.Table:
    """Every row of a small table in this process's memory predicted here, batch by batch in order, by one
    BatchPredictor (CPU)."""
    predictor = BatchPredictor(checkpoint_path, id_column)
    picked = table.select(_columns(feature_order, id_column))
    parts = [predictor(pa.Table.from_batches([b], picked.schema)) for b in picked.to_batches(max(1, batch_size))]
    return pa.concat_tables(parts) if parts else predictor(picked)


def predict_dataset(
    ds,
    checkpoint_path: str,
    id_column: str | None,
    feature_order: list[str],
    batch_size: int = 4096,
    num_actors: int = 1,
    use_gpu: bool = False,
    collector=None,
):
    """Lazily predict every row of a Ray Dataset with a pool of BatchPredictor actors (model loaded once each)."""
    import ray.data

    return ds.select_columns(_columns(feature_order, id_column)).map_batches(
        BatchPredictor,
        fn_constructor_kwargs={
            "checkpoint_path": checkpoint_path,
            "id_column": id_column,
            "use_gpu": use_gpu,
            "collector": collector,
        },
        batch_size=batch_size,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=num_actors),
        num_gpus=1 if use_gpu else 0,
    )
