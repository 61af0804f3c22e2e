"""Batch prediction with a checkpoint's own preprocessor, as a Ray Data callable class."""

from __future__ import annotations

import pyarrow as pa
import torch

from trainer.checkpoint import ServableModel, load_servable


def predict_table(servable: ServableModel, table: pa.Table, id_column: str | None = None, device: str = "cpu") -> pa.Table:
    """Predictions for every row of table: [id], prediction, and proba_<class> for classification."""
    x = servable.preprocessor.transform_features(table, strict=True)
    with torch.inference_mode():
        out = servable.model(torch.from_numpy(x).to(device)).float().cpu().numpy()
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
        return predict_table(self.servable, batch, self.id_column, self.device)
