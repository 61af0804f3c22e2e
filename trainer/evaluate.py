"""Score a checkpoint on a labelled table with its own preprocessor (the champion/challenger gate)."""

from __future__ import annotations

import numpy as np
import ray.data

from trainflow.trainer.serving import load_servable
from trainflow.trainer.loop import compute_metrics


def evaluate_checkpoint(checkpoint_path: str, ds: ray.data.Dataset, batch_size: int = 65536) -> dict[str, float]:
    """Validation metrics of the checkpoint over every row of ds, computed like the train loop's.

    Each model applies the preprocessor stored in its own checkpoint, so an older champion is
    judged on the same rows as a new challenger even when their fitted preprocessing differs.
    Raises SchemaDriftError when the model cannot read the table (a missing column, a new class).
    """
    servable = load_servable(checkpoint_path)
    prep = servable.preprocessor
    cols = list(dict.fromkeys([*prep.feature_order, prep.label]))
    outs, labels = [], []
    for batch in ds.select_columns(cols).iter_batches(batch_size=batch_size, batch_format="pyarrow"):
        x = prep.transform_features(batch, strict=False)
        labels.append(prep.transform_label(batch))
        outs.append(servable.predict(x))
    if not outs:
        return {"val_loss": float("nan")}
    return compute_metrics(prep.task, np.concatenate(outs), np.concatenate(labels), prep)
