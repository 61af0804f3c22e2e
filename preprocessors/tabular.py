"""Fit-on-train tabular preprocessing: impute (with missing indicators), scale, expand dates, one-hot or
embed text, and pack into one float32 tensor.

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

from trainflow.errors import UnreadableCheckpoint
from trainflow.preprocessors.dates import date_parts
from trainflow.tables.files import is_numeric_type, is_string_type, is_temporal_type

FEATURES = "features"
LABEL = "label"
PREPROCESSOR_FILE = "preprocessor.json"


class SchemaDriftError(ValueError):
    """A batch does not match the schema the preprocessor was fitted on."""


def _as_float(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Numeric column -> float64 numpy with NaN for nulls."""
    return pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)


def _as_string(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    return pc.cast(col, pa.string())


NULL_CATEGORY = "<missing>"  # a missing text value is a category of its own
UNKNOWN_CODE = 0  # embedding code of values never seen in training, or too rare to learn


def embedding_dim(num_codes: int) -> int:
    """fastai's rule of thumb for an entity embedding's width."""
    return int(min(600, round(1.6 * num_codes**0.56)))


def _stats(
    mean: float | None, std: float | None, low: float | None = None, high: float | None = None
) -> dict[str, float]:
    mean = 0.0 if mean is None or not math.isfinite(mean) else float(mean)
    std = 1.0 if std is None or not math.isfinite(std) or std <= 1e-12 else float(std)
    out = {"mean": mean, "std": std}
    if low is not None and high is not None and math.isfinite(low) and math.isfinite(high):
        out |= {"min": float(low), "max": float(high)}
    return out


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _stats_problem(where: str, st: Any) -> str | None:
    """What in a column's stored mean, spread and range fitting cannot have written, or None."""
    if not isinstance(st, dict):
        return f"{where} is not an object"
    if not _number(st.get("mean")):
        return f"{where}: mean {st.get('mean')!r} is not a finite number"
    if not _number(st.get("std")) or not st["std"] > 1e-12:
        return f"{where}: std {st.get('std')!r} is not a finite number above 0"
    if ("min" in st) != ("max" in st):
        return f"{where}: min and max come together"
    if "min" in st and not (_number(st["min"]) and _number(st["max"]) and st["min"] <= st["max"]):
        return f"{where}: min {st['min']!r} and max {st['max']!r} are not finite numbers with min <= max"
    return None


@dataclass
class TabularPreprocessor:
    """Fitted state of the tabular transform; every field is JSON-serialisable.

    Packed layout, column by column in feature_order: a number is one standardized value (plus a
    0/1 missing indicator when training had missing values), clipped first to the range seen in training (a
    network extrapolates wildly from a value far outside it: diamonds' y = 58.9 mm sits 48 standard deviations
    out, and the validation rows holding such values decided early stopping); a date is its standardized parts (plus
    the indicator); a low-cardinality text column is one-hot; a high-cardinality one is one integer
    code (0 = unknown) that the model looks up in an embedding table.
    """

    task: str
    label: str
    numeric: dict[str, dict[str, Any]] = field(default_factory=dict)  # col -> mean, std, min, max, na
    categorical: dict[str, dict[str, Any]] = field(default_factory=dict)  # one-hot: col -> categories, fill
    feature_order: list[str] = field(default_factory=list)
    classes: list[Any] | None = None
    label_mean: float = 0.0
    label_std: float = 1.0
    train_rows: int = 0
    class_counts: dict[str, int] = field(default_factory=dict)  # training rows per class, keyed by str(class)
    embedded: dict[str, dict[str, Any]] = field(default_factory=dict)  # col -> categories (code = 1 + index), dim
    dates: dict[str, dict[str, Any]] = field(default_factory=dict)  # col -> parts, stats per part, na
    # the training split's distribution (preprocessors/baseline.py): what validation and drift compare against
    baseline: dict[str, Any] = field(default_factory=dict)

    # ---------- fitting ----------
    @classmethod
    def from_stats(
        cls,
        task: str,
        label: str,
        feature_order: list[str],
        numeric_stats: dict[str, tuple[float | None, ...]],
        category_counts: dict[str, dict[str | None, int]],
        classes: list[Any] | None,
        label_stats: tuple[float, float] | None,
        train_rows: int,
        class_counts: dict[Any, int] | None = None,
        missing: dict[str, int] | None = None,
        date_stats: dict[str, dict[str, tuple[float | None, float | None]]] | None = None,
        max_onehot: int = 16,
        min_frequency: int = 5,
        max_categories: int = 100_000,
        baseline: dict[str, Any] | None = None,
    ) -> TabularPreprocessor:
        """Build the fitted state from aggregates computed over the training split.

        category_counts may count missing values under None; missing counts missing values of the
        numeric and date columns. Text columns with more than max_onehot values are embedded: values
        seen fewer than min_frequency times share the unknown code, and at most max_categories are kept.
        numeric_stats are (mean, std) or (mean, std, min, max) per column: with the training range, values
        outside it are clipped to it before scaling.
        """
        missing = missing or {}
        numeric = {col: {**_stats(*st), "na": missing.get(col, 0) > 0} for col, st in numeric_stats.items()}
        dates = {
            col: {
                "parts": list(parts),
                "stats": {p: _stats(*v) for p, v in parts.items()},
                "na": missing.get(col, 0) > 0,
            }
            for col, parts in (date_stats or {}).items()
        }
        categorical, embedded = {}, {}
        for col, counts in category_counts.items():
            counts = {NULL_CATEGORY if k is None else str(k): int(v) for k, v in counts.items()}
            # the most frequent present value: the registered model's input example
            mode = min((v for v in counts if v != NULL_CATEGORY), key=lambda v: (-counts[v], v), default=None)
            if len(counts) <= max_onehot:
                categorical[col] = {"categories": sorted(counts), "fill": None, "mode": mode}
                continue
            frequent = sorted((v for v in counts if counts[v] >= min_frequency), key=lambda v: (-counts[v], v))
            vocab = sorted(frequent[:max_categories])
            embedded[col] = {"categories": vocab, "dim": embedding_dim(len(vocab) + 1), "mode": mode}
        mean, std = label_stats if label_stats else (0.0, 1.0)
        return cls(
            task=task,
            label=label,
            numeric=numeric,
            categorical=categorical,
            embedded=embedded,
            dates=dates,
            feature_order=list(feature_order),
            classes=sorted(classes) if classes is not None else None,
            label_mean=float(mean),
            label_std=float(std) if std and std > 1e-12 else 1.0,
            train_rows=int(train_rows),
            class_counts={str(k): int(v) for k, v in (class_counts or {}).items()},
            baseline=baseline or {},
        )

    # ---------- shape ----------
    def _width(self, col: str) -> int:
        if col in self.numeric:
            return 1 + bool(self.numeric[col].get("na"))
        if col in self.dates:
            return len(self.dates[col]["parts"]) + bool(self.dates[col]["na"])
        if col in self.embedded:
            return 1
        return len(self.categorical[col]["categories"])

    @property
    def num_features(self) -> int:
        return sum(self._width(c) for c in self.feature_order)

    @property
    def num_outputs(self) -> int:
        return len(self.classes) if self.task == "classification" else 1

    def embedding_slots(self) -> list[tuple[int, int, int]]:
        """(position in the packed row, number of codes incl. unknown, embedding width) per embedded column."""
        slots, pos = [], 0
        for col in self.feature_order:
            if col in self.embedded:
                spec = self.embedded[col]
                slots.append((pos, len(spec["categories"]) + 1, int(spec["dim"])))
            pos += self._width(col)
        return slots

    def continuous_positions(self) -> list[int]:
        """Positions of the packed row that hold a continuous value: each number column's value and each date part
        (not their null flags, one-hot slots or embedded codes)."""
        out, pos = [], 0
        for col in self.feature_order:
            if col in self.numeric:
                out.append(pos)
            elif col in self.dates:
                out += range(pos, pos + len(self.dates[col]["parts"]))
            pos += self._width(col)
        return out

    def feature_names(self) -> list[str]:
        names = []
        for col in self.feature_order:
            if col in self.numeric:
                names += [col] + ([f"{col}_na"] if self.numeric[col].get("na") else [])
            elif col in self.dates:
                names += [f"{col}_{p}" for p in self.dates[col]["parts"]] + (
                    [f"{col}_na"] if self.dates[col]["na"] else []
                )
            elif col in self.embedded:
                names.append(f"{col}#code")
            else:
                names.extend(f"{col}={cat}" for cat in self.categorical[col]["categories"])
        return names

    def feature_sources(self) -> list[str]:
        """The table column behind each position of the packed row (a one-hot group, date parts and null flags
        all name their column)."""
        return [col for col in self.feature_order for _ in range(self._width(col))]

    def text_columns(self) -> dict[str, list[str]]:
        """The vocabulary of every text column, one-hot or embedded."""
        return {c: spec["categories"] for c, spec in {**self.categorical, **self.embedded}.items()}

    # ---------- transform ----------
    def check_schema(self, schema: pa.Schema, source: str = "input") -> None:
        """Raise SchemaDriftError naming every feature column that is missing or of the wrong kind."""
        problems = []
        for col in self.feature_order:
            if col not in schema.names:
                problems.append(f"column {col!r} is missing")
                continue
            t = schema.field(col).type
            if pa.types.is_null(t):
                continue
            if col in self.numeric and not is_numeric_type(t):
                problems.append(f"column {col!r} was numeric in training but is {t} here")
            if col in self.text_columns() and not is_string_type(t):
                problems.append(f"column {col!r} was text in training but is {t} here")
            if col in self.dates and not (is_temporal_type(t) or is_string_type(t)):
                problems.append(f"column {col!r} was a date in training but is {t} here")
        if problems:
            raise SchemaDriftError(f"{source} does not match the model's preprocessor: " + "; ".join(problems))

    def _text_values(self, col: str, table: pa.Table) -> pa.Array:
        values = _as_string(table[col])
        fill = self.categorical.get(col, {}).get("fill")  # checkpoints written before missing was a category
        return pc.fill_null(values, fill if fill is not None else NULL_CATEGORY)

    def unseen_mask(self, col: str, table: pa.Table) -> np.ndarray:
        """Rows of a text column whose value is outside the model's vocabulary (mapped to unknown)."""
        values = self._text_values(col, table)
        known = pa.array(self.text_columns()[col], pa.string())
        return ~pc.is_in(values, value_set=known).to_numpy(zero_copy_only=False)

    def transform_features(self, table: pa.Table, strict: bool = False) -> np.ndarray:
        """Pack the feature columns of a batch into one float32 matrix.

        A text value outside the vocabulary is encoded as unknown (all zeros one-hot, code 0 embedded);
        strict=True raises SchemaDriftError for it instead.
        """
        self.check_schema(table.schema, "batch")
        n = table.num_rows
        out = np.zeros((n, self.num_features), dtype=np.float32)
        pos = 0
        for col in self.feature_order:
            if col in self.numeric or col in self.dates:
                if col in self.numeric:
                    stats, na = {col: self.numeric[col]}, self.numeric[col].get("na")
                    raw = {col: _as_float(table[col])}
                else:
                    stats, na = self.dates[col]["stats"], self.dates[col]["na"]
                    raw = date_parts(table[col], self.dates[col]["parts"])
                missing = np.zeros(n, dtype=bool)
                for key, x in raw.items():
                    st = stats[key]
                    isnan = np.isnan(x)
                    missing |= isnan
                    if "min" in st:  # fitted before the range was stored: not clipped
                        x = np.clip(x, st["min"], st["max"])
                    out[:, pos] = (np.where(isnan, st["mean"], x) - st["mean"]) / st["std"]
                    pos += 1
                if na:
                    out[:, pos] = missing
                    pos += 1
                continue
            values = self._text_values(col, table)
            cats = self.text_columns()[col]
            idx = pc.index_in(values, value_set=pa.array(cats, pa.string())).to_numpy(zero_copy_only=False)
            unseen = np.isnan(idx) if idx.dtype.kind == "f" else np.zeros(n, dtype=bool)
            if strict and unseen.any():
                bad = values[int(np.flatnonzero(unseen)[0])].as_py()
                raise SchemaDriftError(
                    f"column {col!r} has category {bad!r} that the model never saw in training "
                    f"(known: {cats[:10]}{' ...' if len(cats) > 10 else ''})"
                )
            rows = np.flatnonzero(~unseen)
            codes = idx[rows].astype(np.int64)
            if col in self.embedded:
                out[rows, pos] = codes + UNKNOWN_CODE + 1  # after the unknown code; exact in float32 below 2**24 codes
                pos += 1
            else:
                out[rows, pos + codes] = 1.0
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

    def decode_predictions(
        self, outputs: np.ndarray, threshold: float | None = None
    ) -> dict[str, np.ndarray | pa.Array]:
        """Model outputs -> prediction column (and per-class probabilities for classification). threshold (two
        classes): the second class where its probability reaches it, instead of the most probable class."""
        if self.task == "classification":
            z = outputs - outputs.max(axis=1, keepdims=True)
            probs = np.exp(z)
            probs /= probs.sum(axis=1, keepdims=True)
            chosen = (
                (probs[:, 1] >= threshold).astype(np.int64)
                if threshold is not None and len(self.classes) == 2
                else probs.argmax(axis=1)
            )
            cols: dict[str, Any] = {"prediction": pa.array(self.classes).take(pa.array(chosen))}
            for i, cls in enumerate(self.classes):
                cols[f"proba_{cls}"] = probs[:, i].astype(np.float64)
            return cols
        return {"prediction": (outputs.reshape(-1) * self.label_std + self.label_mean).astype(np.float64)}

    # ---------- persistence (data, never pickle) ----------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TabularPreprocessor:
        return cls(**d)  # fields added later default, so older checkpoints still load

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / PREPROCESSOR_FILE
        path.write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True))
        return path

    @classmethod
    def load(cls, directory: str | Path) -> TabularPreprocessor:
        """Read and check a fitted state: every number is one fitting can produce, every size is checked before
        anything is allocated from it. ValueError naming the file and the field otherwise."""
        path = Path(directory) / PREPROCESSOR_FILE
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                raise TypeError("not a JSON object")
            prep = cls.from_dict(data)
        except (ValueError, TypeError) as exc:
            raise UnreadableCheckpoint(
                f"{path}: not a preprocessor trainflow wrote ({type(exc).__name__}: {exc})"
            ) from None
        problem = prep.state_problem()
        if problem:
            raise UnreadableCheckpoint(f"{path}: {problem}; refused (not a state that fitting produces)")
        return prep

    def state_problem(self) -> str | None:
        """What in this state fitting cannot have produced, or None."""
        return self._layout_problem() or self._columns_problem() or self._label_problem()

    def _layout_problem(self) -> str | None:
        """The task, and every feature described by exactly one of the column kinds."""
        if self.task not in ("classification", "regression"):
            return f"task {self.task!r} is neither classification nor regression"
        kinds = [self.numeric, self.categorical, self.embedded, self.dates]
        if not all(isinstance(k, dict) for k in kinds) or not isinstance(self.feature_order, list):
            return "numeric, categorical, embedded and dates must be objects and feature_order a list"
        for col in self.feature_order:
            if sum(col in k for k in kinds) != 1:
                return f"feature {col!r} must be described by exactly one of numeric, categorical, embedded, dates"
        if len(set(self.feature_order)) != len(self.feature_order) or sum(map(len, kinds)) != len(self.feature_order):
            return "feature_order must list every described column once"
        return None

    def _columns_problem(self) -> str | None:
        """Each column's statistics, date parts, categories and embedding width as fitting writes them."""
        for col, st in self.numeric.items():
            if problem := _stats_problem(f"numeric column {col!r}", st):
                return problem
        for col, spec in self.dates.items():
            parts = spec.get("parts") if isinstance(spec, dict) else None
            if not isinstance(parts, list) or not parts or set(parts) != set(spec.get("stats", {})):
                return f"date column {col!r}: parts and stats do not match"
            for part in parts:
                if problem := _stats_problem(f"date column {col!r} part {part!r}", spec["stats"][part]):
                    return problem
        for col, spec in {**self.categorical, **self.embedded}.items():
            cats = spec.get("categories") if isinstance(spec, dict) else None
            if not isinstance(cats, list) or not all(isinstance(c, str) for c in cats) or len(set(cats)) != len(cats):
                return f"text column {col!r}: categories must be distinct strings"
        for col, spec in self.embedded.items():
            if spec.get("dim") != embedding_dim(len(spec["categories"]) + 1):
                return (
                    f"embedded column {col!r}: dim {spec.get('dim')!r} is not the width fitting gives "
                    f"{len(spec['categories'])} categories ({embedding_dim(len(spec['categories']) + 1)})"
                )
        return None

    def _label_problem(self) -> str | None:
        """At least two distinct classes for a classifier; the label's mean and spread finite."""
        if self.task == "classification":
            if (
                not isinstance(self.classes, list)
                or len(self.classes) < 2
                or len(set(map(str, self.classes))) != len(self.classes)
            ):
                return f"classes {str(self.classes)[:100]} must be at least two distinct classes"
        if not _number(self.label_mean) or not _number(self.label_std) or not self.label_std > 1e-12:
            return f"label_mean {self.label_mean!r} / label_std {self.label_std!r} must be finite, the std above 0"
        return None
