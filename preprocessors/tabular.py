"""Fit-on-train tabular preprocessing: impute, scale, one-hot, pack into one float32 tensor.

The fitted state is plain data (JSON) so a checkpoint never needs pickle to be served.
The transform is vectorised over a pyarrow batch; it runs in Ray Data `map_batches`
during training and, unchanged, inside the inference actors.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

FEATURES = "features"
LABEL = "label"
PREPROCESSOR_FILE = "preprocessor.json"


class SchemaDriftError(ValueError):
    """A batch does not match the schema the preprocessor was fitted on."""


def is_numeric_type(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_decimal(t)


def is_string_type(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return is_string_type(t.value_type)
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _as_float(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Numeric column -> float64 numpy with NaN for nulls."""
    return pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)


def _as_string(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    return pc.cast(col, pa.string())


@dataclass
class TabularPreprocessor:
    """Fitted state of the tabular transform; every field is JSON-serialisable."""

    task: str
    label: str
    numeric: dict[str, dict[str, float]] = field(default_factory=dict)
    categorical: dict[str, dict[str, Any]] = field(default_factory=dict)
    feature_order: list[str] = field(default_factory=list)
    classes: list[Any] | None = None
    label_mean: float = 0.0
    label_std: float = 1.0
    train_rows: int = 0
    class_counts: dict[str, int] = field(default_factory=dict)  # training rows per class, keyed by str(class)

    # ---------- fitting ----------
    @classmethod
    def from_stats(
        cls,
        task: str,
        label: str,
        feature_order: list[str],
        numeric_stats: dict[str, tuple[float | None, float | None]],
        category_counts: dict[str, dict[str, int]],
        classes: list[Any] | None,
        label_stats: tuple[float, float] | None,
        train_rows: int,
        class_counts: dict[Any, int] | None = None,
    ) -> TabularPreprocessor:
        """Build the fitted state from aggregates computed over the training split."""
        numeric = {}
        for col, (mean, std) in numeric_stats.items():
            mean = 0.0 if mean is None or not math.isfinite(mean) else float(mean)
            std = 1.0 if std is None or not math.isfinite(std) or std <= 1e-12 else float(std)
            numeric[col] = {"mean": mean, "std": std}
        categorical = {}
        for col, counts in category_counts.items():
            cats = sorted(counts)
            fill = max(cats, key=lambda c: (counts[c], c)) if cats else None
            categorical[col] = {"categories": cats, "fill": fill}
        mean, std = label_stats if label_stats else (0.0, 1.0)
        return cls(
            task=task,
            label=label,
            numeric=numeric,
            categorical=categorical,
            feature_order=list(feature_order),
            classes=sorted(classes) if classes is not None else None,
            label_mean=float(mean),
            label_std=float(std) if std and std > 1e-12 else 1.0,
            train_rows=int(train_rows),
            class_counts={str(k): int(v) for k, v in (class_counts or {}).items()},
        )

    # ---------- shape ----------
    @property
    def num_features(self) -> int:
        return sum(1 if c in self.numeric else len(self.categorical[c]["categories"]) for c in self.feature_order)

    @property
    def num_outputs(self) -> int:
        return len(self.classes) if self.task == "classification" else 1

    def feature_names(self) -> list[str]:
        names = []
        for col in self.feature_order:
            if col in self.numeric:
                names.append(col)
            else:
                names.extend(f"{col}={cat}" for cat in self.categorical[col]["categories"])
        return names

    # ---------- transform ----------
    def check_schema(self, schema: pa.Schema, source: str = "input") -> None:
        """Raise SchemaDriftError naming every feature column that is missing or of the wrong kind."""
        problems = []
        for col in self.feature_order:
            if col not in schema.names:
                problems.append(f"column {col!r} is missing")
                continue
            t = schema.field(col).type
            if col in self.numeric and not is_numeric_type(t) and not pa.types.is_null(t):
                problems.append(f"column {col!r} was numeric in training but is {t} here")
            if col in self.categorical and not is_string_type(t) and not pa.types.is_null(t):
                problems.append(f"column {col!r} was text in training but is {t} here")
        if problems:
            raise SchemaDriftError(f"{source} does not match the model's preprocessor: " + "; ".join(problems))

    def transform_features(self, table: pa.Table, strict: bool) -> np.ndarray:
        """Pack the feature columns of a batch into one float32 matrix.

        strict=True raises SchemaDriftError on a category not seen in training (inference);
        strict=False encodes it as all zeros (validation rows of a rare category).
        """
        self.check_schema(table.schema, "batch")
        n = table.num_rows
        out = np.zeros((n, self.num_features), dtype=np.float32)
        pos = 0
        for col in self.feature_order:
            if col in self.numeric:
                stats = self.numeric[col]
                x = _as_float(table[col])
                x = np.where(np.isnan(x), stats["mean"], x)
                out[:, pos] = (x - stats["mean"]) / stats["std"]
                pos += 1
                continue
            spec = self.categorical[col]
            cats = spec["categories"]
            values = _as_string(table[col])
            if spec["fill"] is not None:
                values = pc.fill_null(values, spec["fill"])
            idx = pc.index_in(values, value_set=pa.array(cats, pa.string())).to_numpy(zero_copy_only=False)
            if idx.dtype.kind == "f":  # nulls (unseen categories) came back as NaN
                unseen = np.isnan(idx)
                if strict and unseen.any():
                    bad = values[int(np.flatnonzero(unseen)[0])].as_py()
                    raise SchemaDriftError(
                        f"column {col!r} has category {bad!r} that the model never saw in training "
                        f"(known: {cats[:10]}{' ...' if len(cats) > 10 else ''})"
                    )
                rows = np.flatnonzero(~unseen)
                out[rows, pos + idx[rows].astype(np.int64)] = 1.0
            else:
                out[np.arange(n), pos + idx.astype(np.int64)] = 1.0
            pos += len(cats)
        return out

    def transform_label(self, table: pa.Table) -> np.ndarray:
        """Classification: class index (int64); regression: standardized float32 target."""
        col = table[self.label]
        if self.task == "classification":
            classes = pa.array(self.classes)
            if is_string_type(col.type):
                col = _as_string(col)
            idx = pc.index_in(pc.cast(col, classes.type), value_set=classes)
            if idx.null_count:
                bad = col.filter(pc.is_null(idx))[0].as_py()
                raise SchemaDriftError(f"label column {self.label!r} has class {bad!r} not seen in training")
            return idx.to_numpy(zero_copy_only=False).astype(np.int64)
        y = _as_float(col)
        return ((y - self.label_mean) / self.label_std).astype(np.float32)

    def transform_batch(self, table: pa.Table, strict: bool = False) -> dict[str, np.ndarray]:
        """A training/validation batch -> {'features': float32 [n, d], 'label': ...}."""
        return {FEATURES: self.transform_features(table, strict=strict), LABEL: self.transform_label(table)}

    def decode_predictions(self, outputs: np.ndarray) -> dict[str, np.ndarray | pa.Array]:
        """Model outputs -> prediction column (and per-class probabilities for classification)."""
        if self.task == "classification":
            z = outputs - outputs.max(axis=1, keepdims=True)
            probs = np.exp(z)
            probs /= probs.sum(axis=1, keepdims=True)
            cols: dict[str, Any] = {"prediction": pa.array(self.classes).take(pa.array(probs.argmax(axis=1)))}
            for i, cls in enumerate(self.classes):
                cols[f"proba_{cls}"] = probs[:, i].astype(np.float64)
            return cols
        return {"prediction": (outputs.reshape(-1) * self.label_std + self.label_mean).astype(np.float64)}

    # ---------- persistence (data, never pickle) ----------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TabularPreprocessor:
        return cls(**d)

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / PREPROCESSOR_FILE
        path.write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True))
        return path

    @classmethod
    def load(cls, directory: str | Path) -> TabularPreprocessor:
        return cls.from_dict(json.loads((Path(directory) / PREPROCESSOR_FILE).read_text()))
