"""The training baseline and the distance of other data from it.

At preprocessor fit (the same streaming pass of Ray aggregates) every feature gets mergeable statistics: its
null count, a fine histogram for numbers (bins of width STEP on the asinh scale, so no range is needed before
the pass), bounded category counts for text. They are finalized into a small JSON baseline stored with the
preprocessor: per number up to BINS equal-mass bins (edges from the fine histogram), per text column the
most frequent categories; plus row count and label distribution. Scoring data is counted into the same bins
by the predictors as they predict (trainer/serving/predict.py), and compared per feature: Jensen-Shannon divergence (base 2) for
numbers and L-infinity distance for categories, as TFDV and Vertex AI do; nulls are one more bin of each.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

STEP = 0.02  # asinh-scale width of the fit's fine bins: about 2% of a value away from zero
BINS = 20  # equal-mass bins per number in the stored baseline
TOP_CATEGORIES = 50  # categories per text column in the stored baseline; the rest is one "other" bucket


def numeric_baseline(fine: dict[int, int] | None, rows: int, missing: int) -> dict[str, Any]:
    """Up to BINS equal-mass bins from a fine histogram: edges (values) and counts, and the null count."""
    fine = {int(k): int(v) for k, v in (fine or {}).items()}
    keys = sorted(fine)
    total = sum(fine.values())
    edges: list[float] = []
    if total:
        cum, target = 0, 1
        for k in keys[:-1]:
            cum += fine[k]
            while target < BINS and cum >= target * total / BINS:
                edge = float(np.sinh((k + 1) * STEP))
                if not edges or edge > edges[-1]:
                    edges.append(edge)
                target += 1
    counts = np.zeros(len(edges) + 1, dtype=np.int64)
    for k in keys:  # a fine bin lies wholly inside one coarse bin: the edges are fine-bin boundaries
        counts[np.searchsorted(edges, float(np.sinh(k * STEP + STEP / 2)), side="right")] += fine[k]
    # the fine histogram too (sparse, a few hundred bins): another baseline's data can be re-binned into these edges
    return {
        "kind": "numeric",
        "edges": edges,
        "counts": counts.tolist(),
        "nulls": int(missing),
        "rows": int(rows),
        "fine": {str(k): v for k, v in fine.items()},
    }


def rebin(spec: dict[str, Any], edges: list[float]) -> list[int]:
    """A numeric baseline entry's values counted into other edges (through its fine histogram)."""
    counts = np.zeros(len(edges) + 1, dtype=np.int64)
    for k, v in (spec.get("fine") or {}).items():
        counts[np.searchsorted(edges, float(np.sinh(int(k) * STEP + STEP / 2)), side="right")] += v
    return counts.tolist()


def categorical_baseline(counts: dict[str | None, int], rows: int) -> dict[str, Any]:
    """The TOP_CATEGORIES most frequent values with their counts, the rest as one bucket, and the null count."""
    nulls = int(counts.get(None, 0))
    values = sorted(((v, int(c)) for v, c in counts.items() if v is not None), key=lambda vc: (-vc[1], vc[0]))
    top = dict(values[:TOP_CATEGORIES])
    return {
        "kind": "categorical",
        "counts": top,
        "other": int(rows - nulls - sum(top.values())),
        "nulls": nulls,
        "rows": int(rows),
        "distinct": len(values),
    }


def label_baseline(task: str, class_counts: dict | None, fine: dict | None, rows: int) -> dict[str, Any]:
    if task == "classification":
        return {
            "kind": "classes",
            "counts": {str(k): int(v) for k, v in (class_counts or {}).items()},
            "rows": int(rows),
        }
    return {**numeric_baseline(fine, rows, 0), "kind": "numeric"}


COUNT_ROWS = 8192  # rows of a batch counted for drift at most, evenly spaced (a JS estimate needs no more)


def count_batch(baseline: dict[str, Any], batch: pa.Table) -> dict[str, list[int]]:
    """Per baseline column present in batch, its counts in the baseline's buckets: numbers [bins..., null], text
    [top categories..., other, null] (in the baseline's category order). A batch of more than COUNT_ROWS rows is
    counted on COUNT_ROWS evenly spaced ones."""
    if batch.num_rows > COUNT_ROWS:
        batch = batch.take(np.linspace(0, batch.num_rows - 1, COUNT_ROWS).astype(np.int64))
    out = {}
    for col, spec in baseline["columns"].items():
        if col not in batch.column_names:
            continue
        arr = batch[col]
        if spec["kind"] == "numeric":
            if not pa.types.is_floating(arr.type):
                arr = arr.cast(pa.float64())
            x = arr.to_numpy(zero_copy_only=False)  # nulls come as NaN
            missing = np.isnan(x)
            # NaN sorts after every edge: into the last bin, taken out again as the null count
            bins = np.bincount(
                np.searchsorted(np.asarray(spec["edges"], dtype=x.dtype), x, side="right"),
                minlength=len(spec["edges"]) + 1,
            )
            nulls = int(missing.sum())
            bins[-1] -= nulls
            out[col] = [*bins.tolist(), nulls]
        else:
            text = arr.cast(pa.string()) if not pa.types.is_string(arr.type) else arr
            found = pc.index_in(text, value_set=pa.array(list(spec["counts"]), pa.string()))
            nulls = text.null_count
            known = found.drop_null().to_numpy(zero_copy_only=False).astype(np.int64)
            counts = np.bincount(known, minlength=len(spec["counts"]))
            out[col] = [*counts.tolist(), len(text) - nulls - len(known), nulls]
    return out


def merge_counts(parts: list[dict[str, list[int]]]) -> dict[str, list[int]]:
    total: dict[str, np.ndarray] = {}
    for part in parts:
        for col, counts in part.items():
            total[col] = total.get(col, 0) + np.asarray(counts, dtype=np.int64)
    return {c: v.tolist() for c, v in total.items()}


def reference_counts(spec: dict[str, Any]) -> list[int]:
    """The baseline's own counts in the buckets count_batch fills."""
    if spec["kind"] == "numeric":
        return [*spec["counts"], spec["nulls"]]
    return [*spec["counts"].values(), spec["other"], spec["nulls"]]


def js_divergence(p: list[int] | np.ndarray, q: list[int] | np.ndarray) -> float:
    """Jensen-Shannon divergence (base 2, in [0, 1]) of two count vectors."""
    p, q = np.asarray(p, float), np.asarray(q, float)
    if p.sum() == 0 or q.sum() == 0:
        return float("nan")
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2

    def kl(a: np.ndarray) -> float:
        nz = a > 0
        return float((a[nz] * np.log2(a[nz] / m[nz])).sum())

    return max(0.0, (kl(p) + kl(q)) / 2)


def linf_distance(p: list[int] | np.ndarray, q: list[int] | np.ndarray) -> float:
    """L-infinity distance of two count vectors' frequencies, in [0, 1]."""
    p, q = np.asarray(p, float), np.asarray(q, float)
    if p.sum() == 0 or q.sum() == 0:
        return float("nan")
    return float(np.abs(p / p.sum() - q / q.sum()).max())


def drift_report(
    baseline: dict[str, Any],
    counts: dict[str, list[int]],
    rows: int,
    numeric_threshold: float,
    categorical_threshold: float,
    min_rows: int,
) -> dict[str, Any]:
    """Per feature: method, score, threshold, verdict (drifted / ok / too_few_rows); and the drifted columns."""
    columns = {}
    for col, spec in baseline["columns"].items():
        if col not in counts:
            continue
        numeric = spec["kind"] == "numeric"
        method, threshold = ("jensen_shannon", numeric_threshold) if numeric else ("l_infinity", categorical_threshold)
        score = (js_divergence if numeric else linf_distance)(reference_counts(spec), counts[col])
        if rows < min_rows:
            verdict = "too_few_rows"
        else:
            verdict = "drifted" if math.isfinite(score) and score > threshold else "ok"
        columns[col] = {
            "method": method,
            "score": round(score, 6) if math.isfinite(score) else None,
            "threshold": threshold,
            "verdict": verdict,
        }
    return {
        "rows": rows,
        "min_rows": min_rows,
        "columns": columns,
        "drifted_columns": [c for c, r in columns.items() if r["verdict"] == "drifted"],
    }


def _check(
    check: str,
    column: str | None,
    champion: Any,
    now: Any,
    threshold: float,
    key: str,
    anomaly: bool,
    score: float | None = None,
) -> dict[str, Any]:
    return {
        "check": check,
        "column": column,
        "champion": champion,
        "now": now,
        "score": score,
        "threshold": threshold,
        "key": key,
        "anomaly": bool(anomaly),
    }


def compare_baselines(old: dict[str, Any], new: dict[str, Any], v: Any) -> list[dict[str, Any]]:
    """Every check of new training data (its baseline) against the champion's: row count, columns gone or added,
    null rates, label balance, numeric distributions, category frequencies. v: the config's validation section."""
    out = [
        _check(
            "row_count",
            None,
            old["rows"],
            new["rows"],
            v.min_row_ratio,
            "validation.min_row_ratio",
            new["rows"] < v.min_row_ratio * old["rows"],
            round(new["rows"] / max(old["rows"], 1), 4),
        )
    ]
    gone = sorted(set(old["columns"]) - set(new["columns"]))
    added = sorted(set(new["columns"]) - set(old["columns"]))
    out.append(
        _check(
            "columns",
            None,
            sorted(old["columns"]),
            sorted(new["columns"]),
            0,
            "data.features",
            bool(gone or added),
            None,
        )
        | {"gone": gone, "added": added}
    )
    judged = new["rows"] >= v.min_rows and old["rows"] >= v.min_rows
    for col in sorted(set(old["columns"]) & set(new["columns"])):
        out += _column_checks(col, old["columns"][col], new["columns"][col], v, judged)
    out += _label_checks(old.get("label") or {}, new.get("label") or {}, v, judged)
    return out


def _column_checks(col: str, a: dict[str, Any], b: dict[str, Any], v: Any, judged: bool) -> list[dict[str, Any]]:
    """A column's checks: its null rate, its kind, and its distribution (numbers) or category frequencies (text)."""
    out = []
    was, now = a["nulls"] / max(a["rows"], 1), b["nulls"] / max(b["rows"], 1)
    out.append(
        _check(
            "null_rate",
            col,
            round(was, 4),
            round(now, 4),
            v.max_null_increase,
            "validation.max_null_increase",
            judged and now - was > v.max_null_increase,
            round(now - was, 4),
        )
    )
    if a["kind"] != b["kind"]:
        out.append(_check("kind", col, a["kind"], b["kind"], 0, "data.features", True))
    elif a["kind"] == "numeric":
        score = js_divergence(a["counts"], rebin(b, a["edges"]))
        out.append(
            _check(
                "distribution",
                col,
                _range(a),
                _range(b),
                v.max_numeric_drift,
                "validation.max_numeric_drift",
                judged and score > v.max_numeric_drift,
                round(score, 4),
            )
        )
    else:
        keys = list(a["counts"])
        mine = [a["counts"][k] for k in keys] + [a["other"]]
        theirs = [b["counts"].get(k, 0) for k in keys] + [
            b["rows"] - b["nulls"] - sum(b["counts"].get(k, 0) for k in keys)
        ]
        score = linf_distance(mine, theirs)
        new_values = sorted(set(b["counts"]) - set(a["counts"]))[:5]
        out.append(
            _check(
                "categories",
                col,
                keys[:5],
                new_values,
                v.max_category_drift,
                "validation.max_category_drift",
                judged and score > v.max_category_drift,
                round(score, 4),
            )
        )
    return out


def _label_checks(la: dict[str, Any], lb: dict[str, Any], v: Any, judged: bool) -> list[dict[str, Any]]:
    """The label's balance (classes) or distribution (numbers) against the champion's."""
    out = []
    if la.get("kind") == "classes" and lb.get("kind") == "classes":
        keys = sorted(set(la["counts"]) | set(lb["counts"]))
        score = linf_distance([la["counts"].get(k, 0) for k in keys], [lb["counts"].get(k, 0) for k in keys])
        share = {k: round(c / max(sum(la["counts"].values()), 1), 4) for k, c in la["counts"].items()}
        share_now = {k: round(c / max(sum(lb["counts"].values()), 1), 4) for k, c in lb["counts"].items()}
        out.append(
            _check(
                "label_balance",
                "(label)",
                share,
                share_now,
                v.max_label_shift,
                "validation.max_label_shift",
                judged and score > v.max_label_shift,
                round(score, 4),
            )
        )
    elif la.get("kind") == "numeric" and lb.get("kind") == "numeric":
        score = js_divergence(la["counts"], rebin(lb, la["edges"]))
        out.append(
            _check(
                "label_distribution",
                "(label)",
                _range(la),
                _range(lb),
                v.max_label_shift,
                "validation.max_label_shift",
                judged and score > v.max_label_shift,
                round(score, 4),
            )
        )
    return out


def _range(spec: dict[str, Any]) -> list[float] | None:
    keys = [int(k) for k in spec.get("fine") or {}]
    if not keys:
        return None
    return [round(float(np.sinh(min(keys) * STEP)), 6), round(float(np.sinh((max(keys) + 1) * STEP)), 6)]
