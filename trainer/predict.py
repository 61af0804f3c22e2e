"""Batch prediction with a checkpoint's own preprocessor, as a Ray Data callable class."""

from __future__ import annotations

import pyarrow as pa
import torch

from trainer.checkpoint import ServableModel, load_servable


def predict_table(servable: ServableModel, table: pa.Table, id_column: str | None = None) -> pa.Table:
    """Predictions for every row of table: [id], prediction, and proba_<class> for classification."""
    x = servable.preprocessor.transform_features(table)  # unseen text values: the unknown code
    out = servable.predict(x)
    cols = {}
    if id_column is not None:
        cols[id_column] = table[id_column]
    cols.update(servable.preprocessor.decode_predictions(out))
    return pa.table(cols)


class BatchPredictor:
    """Loads the checkpoint once per actor, then predicts pyarrow batches."""

    def __init__(self, checkpoint_path: str, id_column: str | None = None, use_gpu: bool = False):
        self.device = "cuda" if use_gpu and torch.cuda.is_available() else "cpu"
        self.servable = load_servable(checkpoint_path, self.device)
        self.id_column = id_column

    def __call__(self, batch: pa.Table) -> pa.Table:
        return predict_table(self.servable, batch, self.id_column)


def predict_dataset(
    ds, checkpoint_path: str, id_column: str | None, feature_order: list[str], batch_size: int = 4096,
    num_actors: int = 1, use_gpu: bool = False,
):
    """Lazily predict every row of a Ray Dataset with a pool of BatchPredictor actors (model loaded once each)."""
    import ray.data

    cols = feature_order + ([id_column] if id_column and id_column not in feature_order else [])
    return ds.select_columns(cols).map_batches(
        BatchPredictor,
        fn_constructor_kwargs={"checkpoint_path": checkpoint_path, "id_column": id_column, "use_gpu": use_gpu},
        batch_size=batch_size,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=num_actors),
        num_gpus=1 if use_gpu else 0,
    )
