"""Score a checkpoint on a labelled table with its own preprocessor (the champion/challenger gate), and what a
reviewer asks of the scores: calibration, metrics per slice, and whether a difference is more than noise."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from trainflow.data import Rows, arrow_batches, column_names
from trainflow.preprocessors.tabular import TabularPreprocessor
from trainflow.trainer.metrics import calibration, compute_metrics
from trainflow.trainer.serving.servable import load_servable


@dataclass
class Scored:
    """A model's outputs on every row of a labelled table, with the encoded labels and the raw values of the
    columns asked for (slices), in the table's row order."""

    prep: TabularPreprocessor
    outputs: np.ndarray
    labels: np.ndarray
    columns: dict[str, np.ndarray] = field(default_factory=dict)
    held_out: np.ndarray | None = None  # per row: held out by the plan score_checkpoint was given

    def subset(self, rows: np.ndarray) -> Scored:
        """The same scores on the rows selected (a boolean mask or indices), in order."""
        return Scored(
            self.prep,
            self.outputs[rows],
            self.labels[rows],
            {c: v[rows] for c, v in self.columns.items()},
            None if self.held_out is None else self.held_out[rows],
        )

    def metrics(self, rows: np.ndarray | None = None) -> dict[str, float]:
        if rows is None:
            return compute_metrics(self.prep.task, self.outputs, self.labels, self.prep)
        return compute_metrics(self.prep.task, self.outputs[rows], self.labels[rows], self.prep)

    def calibration(self) -> dict[str, Any] | None:
        """ECE and Brier score with the reliability curve's bins (classification only)."""
        return (
            calibration(self.outputs, self.labels, self.prep.num_outputs)
            if self.prep.task == "classification"
            else None
        )


def score_checkpoint(
    checkpoint_path: str,
    ds: Rows,
    columns: tuple[str, ...] = (),
    batch_size: int = 65536,
    calibrated: bool = True,
    held_out=None,
) -> Scored:
    """The checkpoint's outputs over every row of ds, through the preprocessor stored in its own checkpoint, so an
    older champion is judged on the same rows as a new challenger even when their fitted preprocessing differs.
    held_out: a FoldPlan (another model's): each row's mark, whether that plan held it out, in Scored.held_out.
    Raises SchemaDriftError when the model cannot read the table (a missing column, a new class)."""
    servable = load_servable(checkpoint_path, calibrated=calibrated)
    prep = servable.preprocessor
    plan_columns = [*held_out.key_columns, *([held_out.label] if held_out.label else [])] if held_out else []
    wanted = list(dict.fromkeys([*prep.feature_order, prep.label, *columns, *plan_columns]))
    missing = [c for c in plan_columns if c not in column_names(ds)]
    outs, labels, raw, marks = [], [], {c: [] for c in columns}, []
    for batch in arrow_batches(ds, [c for c in wanted if c not in missing], batch_size):
        x = prep.transform_features(batch, strict=False)
        labels.append(prep.transform_label(batch))
        outs.append(servable.predict(x))
        for c in columns:
            raw[c].append(batch[c])
        if held_out is not None:  # a key column the plan needs is gone: no row can be shown held out
            marks.append(np.zeros(batch.num_rows, bool) if missing else held_out.held_out(batch))
    if not outs:
        return Scored(
            prep,
            np.zeros((0, prep.num_outputs), np.float32),
            np.zeros(0),
            {c: np.array([]) for c in columns},
            np.zeros(0, bool) if held_out is not None else None,
        )
    values = {
        c: np.asarray(pa.chunked_array([chunk for part in parts for chunk in part.chunks]).to_pylist(), dtype=object)
        for c, parts in raw.items()
    }
    return Scored(
        prep,
        np.concatenate(outs),
        np.concatenate(labels),
        values,
        np.concatenate(marks) if held_out is not None else None,
    )


MAX_SLICE_VALUES = 50  # per column, the values with the most rows; the others are counted, not scored


def slice_metrics(scored: Scored, min_rows: int) -> dict[str, dict[str, dict[str, Any]]]:
    """Per slice column, per value: every metric on that value's rows, the row count, and whether the slice has
    enough rows (min_rows) to be judged; null values form their own slice. A column with more than
    MAX_SLICE_VALUES values gets an "(other values)" entry with the rows left out."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for column, values in scored.columns.items():
        keys = np.array(["(null)" if v is None else str(v) for v in values], dtype=object)
        found, counts = np.unique(keys.astype(str), return_counts=True)
        kept = found[np.argsort(-counts, kind="stable")][:MAX_SLICE_VALUES]
        out[column] = {}
        if len(found) > len(kept):
            out[column]["(other values)"] = {
                "rows": int(len(keys) - np.isin(keys.astype(str), kept).sum()),
                "values": int(len(found) - len(kept)),
                "judged": False,
            }
        for value in sorted(kept.tolist()):
            rows = np.flatnonzero(keys.astype(str) == value)
            entry: dict[str, Any] = {"rows": int(len(rows)), "judged": bool(len(rows) >= min_rows)}
            entry.update(scored.metrics(rows))
            out[column][value] = entry
    return out


BOOTSTRAP_ROWS = 50_000  # rows per resample at most: the gain's spread is scaled to the full holdout (1/sqrt(n))


def paired_bootstrap(
    challenger: Scored,
    champion: Scored,
    metric: str,
    mode: str,
    margin: float = 0.0,
    resamples: int = 100,
    seed: int = 0,
) -> dict[str, Any]:
    """The challenger's gain over the champion on metric (positive: better), over validation rows resampled with
    replacement, the same rows for both models: the gain on the whole holdout, its 5th and 95th percentiles, and
    the share of resamples where the challenger is not better by more than margin. A holdout larger than BOOTSTRAP_ROWS is resampled
    BOOTSTRAP_ROWS at a time and the spread shrunk by sqrt(BOOTSTRAP_ROWS / rows), as a mean's standard error."""
    n = len(challenger.labels)
    sign = 1.0 if mode == "max" else -1.0
    full = sign * (challenger.metrics().get(metric, np.nan) - champion.metrics().get(metric, np.nan))
    if n < 2 or not np.isfinite(full):
        return {"resamples": 0, "gain": float(full), "rows": n}
    size = min(n, BOOTSTRAP_ROWS)
    # the same rows in the same order for both (a materialized split); a split read twice in another order (streamed
    # from files in a random order) is resampled for each model on its own: an unpaired bootstrap, wider
    paired = len(champion.labels) == n and bool(np.array_equal(challenger.labels, champion.labels))
    rng = np.random.default_rng(seed)
    gains = []
    for _ in range(resamples):
        rows = rng.integers(0, n, size)
        theirs = rows if paired else rng.integers(0, len(champion.labels), size)
        a, b = challenger.metrics(rows).get(metric), champion.metrics(theirs).get(metric)
        if a is not None and b is not None and np.isfinite(a) and np.isfinite(b):
            gains.append(sign * (a - b))
    if not gains:
        return {"resamples": 0, "gain": float(full), "rows": n}
    spread = (np.asarray(gains) - np.mean(gains)) * np.sqrt(size / n)
    gains_arr = full + spread
    return {
        "resamples": len(gains),
        "rows": n,
        "paired": paired,
        "gain": float(full),
        "gain_p05": float(np.percentile(gains_arr, 5)),
        "gain_p95": float(np.percentile(gains_arr, 95)),
        "share_not_better": float((gains_arr <= margin).mean()),
    }


def model_outputs(prep: TabularPreprocessor, predictions: pa.Table) -> np.ndarray:
    """What compute_metrics takes, rebuilt from the written predictions: log-probabilities per class (their softmax
    is the probabilities) or the standardized prediction."""
    if prep.task == "classification":
        probs = np.column_stack(
            [np.asarray(predictions[f"proba_{c}"].to_pylist(), dtype=np.float64) for c in prep.classes]
        )
        return np.log(np.clip(probs, 1e-12, 1.0)).astype(np.float32)
    pred = np.asarray(predictions["prediction"].to_pylist(), dtype=np.float64)
    return ((pred - prep.label_mean) / prep.label_std).astype(np.float32)


def estimate_metrics(prep: TabularPreprocessor, predictions: pa.Table) -> dict[str, float]:
    """Confidence-based performance estimation (CBPE) of a classifier from its written predictions alone: with
    calibrated probabilities (the served calibration), the expected accuracy is the mean probability of the predicted
    class, the expected log loss the mean entropy, and for two classes the expected confusion matrix (each row counts
    p towards a positive and 1 - p towards a negative) gives F1 and, over every threshold, ROC AUC. Valid while the
    probabilities stay calibrated, i.e. under covariate shift but not under concept shift (P(y|x) changing)."""
    probs = np.exp(model_outputs(prep, predictions).astype(np.float64))
    probs /= probs.sum(axis=1, keepdims=True)
    index = {str(c): i for i, c in enumerate(prep.classes)}
    chosen = np.array([index[str(v)] for v in predictions["prediction"].to_pylist()], dtype=np.int64)
    rows = np.arange(len(chosen))
    out = {
        "val_loss": float(-(probs * np.log(np.clip(probs, 1e-12, 1.0))).sum(axis=1).mean()),
        "val_accuracy": float(probs[rows, chosen].mean()),
    }
    if probs.shape[1] == 2:
        p = probs[:, 1]
        positive = chosen == 1
        tp, fp, fn = p[positive].sum(), (1 - p[positive]).sum(), p[~positive].sum()
        out["val_f1"] = float(2 * tp / (2 * tp + fp + fn)) if tp + fp + fn > 0 else 0.0
        order = np.argsort(-p, kind="stable")
        tpr = np.concatenate([[0.0], np.cumsum(p[order])]) / max(p.sum(), 1e-12)
        fpr = np.concatenate([[0.0], np.cumsum(1 - p[order])]) / max((1 - p).sum(), 1e-12)
        out["val_roc_auc"] = float(np.trapezoid(tpr, fpr))
    return out
