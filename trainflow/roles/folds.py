"""The fold plan: which rows each consumer may read.

One seeded hash of each row's key (the id column, else the row's values) gives it a number u in [0, 1) that
never changes (the same row gets the same number in every run, on every worker, materialized or streamed). The
plan cuts that range into roles:

    [0, test_fraction)                      test: read once, by the final scoring and the gate
    [test_fraction, validation_cut)         validation: early stopping, the family choice, ensemble weights,
                                            calibration and the decision threshold
    [validation_cut, 1)                     train

With cross-fitting (folds > 1) the rows outside the test role are cut into `folds` equal ranges instead of a
validation and a training range: fold model k trains on every fold but k, early-stops on fold k, and predicts fold k
(its out-of-fold predictions). Every non-test row is then trained on by K-1 fold models and predicted by the one that
never saw it, and those predictions drive the family choice, the ensemble weights, calibration and the threshold.

A class with too few rows to give a role at least one row keeps those rows for training (classification), so
every class the model is judged on was also trained on. A table that grows keeps its test rows as test rows, and
a plan stored with a model (split.json in its checkpoint) says, for any later table, which rows that model never
trained on or chose on: the gate compares two models only on rows held out from both.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

TRAIN, VALIDATION, TEST = 0, 1, 2
ROLE_NAMES = {TRAIN: "train", VALIDATION: "validation", TEST: "test"}
PLAN_FILE = "split.json"

# a test set beyond this adds no precision worth its rows (the standard error of an accuracy near 0.9 is 0.13
# points at 50,000 rows): the rest trains
MAX_TEST_ROWS = 50_000
MIN_ROLE_ROWS = 10  # fewer test, validation or training rows than this judge nothing
MAX_FOLDS = 20
AUTO_FOLDS = 5  # train.folds: auto below AUTO_FOLD_ROWS rows outside the test role
AUTO_FOLD_ROWS = 4_000  # where one holdout is as good (docs/performance.md, model-quality with and without folds)
# one split of at most this many rows that train (scaling.num_workers unset): one worker per family, all families in
# one Ray Train run (docs/performance.md, cost-curve: Ray Train's start was most of each family's fit; 80,000
# training rows: 33 s of training against 74 s in a two-worker run per family, the same test figures)
ONE_WORKER_ROWS = 100_000
# up to this many rows the roles and folds are cut at the hash's ranks within each class (exact shares; one pass
# brings every row's key to this process: 8 bytes and its class); beyond it the hash's fixed ranges are within a
# fraction of a percent of those shares
EXACT_ROWS = 50_000
# up to this many rows the test role is cut at the ranks too: a fixed range would leave its size to chance (113 rows
# at 0.15: 17 +- 4 rows, under the 10 that judge anything about 2% of the time); a larger table keeps its test rows as
# it grows (the fixed range)
EXACT_TEST_ROWS = 1_000
# roles by group, classification: up to this many groups the roles and folds are cut within each group's majority
# class (the plan stores which groups hold which class: a few tens of kilobytes); with more, the groups' hash alone
# spreads the classes over the roles within a point or two of their shares
STRATIFIED_GROUPS = 2_000
NO_FOLD = -1  # the fold column of a test row (and of every row without cross-fitting)


def split_fraction_keys(batch: pa.Table, columns: list[str], seed: int) -> np.ndarray:
    """A number in [0, 1) per row from a seeded hash of its values in columns: the same row gets the same
    number in every run, on every worker and in either data path (materialized or streamed)."""
    import pandas as pd

    hashed = pd.util.hash_pandas_object(batch.select(columns).to_pandas(), index=False).to_numpy(dtype=np.uint64)
    # pandas' hash_key only salts text columns: mix the seed in with splitmix64's finalizer instead
    salt = np.uint64(int.from_bytes(hashlib.blake2b(str(seed).encode(), digest_size=8).digest(), "little"))
    z = hashed + salt
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
# a date or timestamp after this (2200-01-01 UTC, in seconds) is taken for a placeholder ("no end date",
# 9999-12-31), not a time: refused by name, since it would make its rows the newest, the test role
FAR_FUTURE_S = 7_258_118_400.0


def time_number(column) -> np.ndarray:
    """A time column as float64 numbers that order as its times: days since 1970 for dates, seconds for timestamps,
    the value for numbers; a missing time is NaN."""
    t = column.type
    if pa.types.is_date32(t):
        values, per = pc.cast(column, pa.int32()), 1.0
    elif pa.types.is_date64(t):  # milliseconds
        values, per = pc.cast(column, pa.int64()), 86_400_000.0
    elif pa.types.is_timestamp(t):  # in its own unit (a cast to another unit would overflow or lose data)
        values, per = pc.cast(column, pa.int64()), float(_PER_SECOND[t.unit])
    else:
        values, per = column, 1.0
    # safe=False: int64 beyond 2**53 (nanoseconds since 1970) rounds to the nearest float (about 0.2 us apart)
    out = np.asarray(pc.cast(values, pa.float64(), safe=False).to_numpy(zero_copy_only=False), dtype=np.float64)
    return out / per if per != 1.0 else out


def time_kind(t: pa.DataType) -> str | None:
    """How a time column's values are shown ("date", "timestamp", "number"); None: not a time."""
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "number"
    return None


@dataclass(frozen=True)
class FoldPlan:
    """Which role each row has, from a seeded hash of its key columns; plain data, stored with the model."""

    seed: int
    key_columns: tuple[str, ...]
    test_fraction: float  # the share of all rows in the test role (after the MAX_TEST_ROWS cap)
    validation_fraction: float  # the share of the non-test rows in the validation role
    label: str | None = None  # classification: the label whose small classes stay in training
    # classes with enough rows for each role (None: every class); text, as the label's values cast to string
    test_classes: tuple[str, ...] | None = None
    validation_classes: tuple[str, ...] | None = None
    counts: dict[str, int] = field(default_factory=dict, compare=False)  # rows per role when the plan was made
    folds: int = 1  # cross-fitting: the non-test rows in this many folds (1: a validation role instead)
    # tables up to EXACT_ROWS rows: per class (its value as text; "" without stratification) the cuts on u that give
    # each role and fold its exact share of the class's rows (the hash's rank cut into parts): [test, validation]
    # then the folds' K-1 inner cuts. A class not listed (a larger table, a class new since) uses the fixed ranges.
    cuts: dict[str, tuple[float, ...]] | None = None
    # roles by time (split.time_column): a row's number is minus its time (time_number), so the cuts on it make the
    # newest rows the test role, the newest before them validation (or the folds' blocks of time) and the oldest
    # training; the cuts always come from the table's times (cuts[""]), ties on one side of every cut
    time_column: str | None = None
    time_kind: str | None = None  # "date", "timestamp" or "number": how times are shown (time_text)
    # each role's first and last time, and (with group_column too) the groups the time cut split between roles
    time_ranges: dict[str, tuple[float, float]] | None = field(default=None, compare=False)
    # roles by group (split.group_column, without time_column): the group's hash decides, so its rows share a role
    group_column: str | None = None
    groups_split: int | None = field(default=None, compare=False)
    # roles by time: the backtest's earlier model (flows/backtest.py), the recent model's procedure one validation
    # block back in time. The recent model (one split: the chosen family's; folds: its newest fold model, fold 0)
    # trains on u >= recent_cut; the earlier one on u >= cut and early-stops on the recent model's newest training
    # rows [recent_cut, cut), as many as the recent model's validation rows. {"cut", "recent_cut", "end" (the earlier
    # model's last training time), "recent_end", "rows" (its training rows), "validation_rows"}; None: too few rows
    earlier: dict[str, float] | None = field(default=None, compare=False)
    # roles by group, classification, up to STRATIFIED_GROUPS groups: each group's hash (u) under its majority class
    # (as text), sorted; its rows take that class's cuts. A group not listed (new since) takes the cuts of all rows ("")
    group_strata: dict[str, tuple[float, ...]] | None = None

    def columns(self) -> tuple[str, ...]:
        """The columns roles() reads from a table: its time column, or its key columns (the group column by group);
        the label where it stratifies."""
        read = (self.time_column,) if self.time_column is not None else tuple(self.key_columns)
        return read + ((self.label,) if self.label is not None else ())

    def fold_rows(self) -> list[int]:
        """Cross-fitting: the rows of each fold (its fold model's held-out rows) when the plan was made."""
        return [int(self.counts.get(f"fold {i}", 0)) for i in range(self.folds)] if self.folds > 1 else []

    @property
    def validation_cut(self) -> float:
        return self.test_fraction + (1.0 - self.test_fraction) * self.validation_fraction

    def _classes(self, batch: pa.Table) -> np.ndarray | None:
        if self.label is None:
            return None
        return np.asarray(pc.cast(batch[self.label], pa.string()).to_numpy(zero_copy_only=False)).astype(str)

    def group_stratum(self, u: np.ndarray) -> np.ndarray:
        """Per row (u: its group's hash), the majority class its group was stratified under; "" for a group the plan
        does not list."""
        out = np.full(len(u), "", dtype=object)
        for value, members in (self.group_strata or {}).items():
            members = np.asarray(members)
            at = np.minimum(np.searchsorted(members, u), len(members) - 1)
            out[members[at] == u] = value
        return out

    def _row_cuts(self, batch: pa.Table, n: int, u: np.ndarray | None = None) -> np.ndarray:
        """Per row, its class's cuts [test, validation, fold cuts ...] (rows of a class without cuts: the fixed ranges
        as cuts; by group stratum: its group's class's); shape (n, 2 + folds - 1)."""
        t, k = self.test_fraction, max(self.folds, 1)
        default = np.array([t, self.validation_cut, *[t + (1 - t) * i / k for i in range(1, k)]])
        out = np.tile(default, (n, 1))
        if not self.cuts:
            return out
        if self.group_strata:
            strata = self.group_stratum(self.keys(batch) if u is None else u)
            for value, cut in self.cuts.items():
                out[strata == value] = cut
            return out
        classes = self._classes(batch)
        if classes is None:
            if "" in self.cuts:
                out[:] = self.cuts[""]
            return out
        values, inverse = np.unique(classes, return_inverse=True)
        for i, value in enumerate(values):
            if value in self.cuts:
                out[inverse == i] = self.cuts[value]
        return out

    def keys(self, batch: pa.Table) -> np.ndarray:
        """The number of each row of batch: in [0, 1), its key columns hashed with the plan's seed; by time, minus its
        time (the newest first)."""
        if self.time_column is not None:
            return -time_number(batch[self.time_column])
        return split_fraction_keys(batch, list(self.key_columns), self.seed)

    def roles(self, batch: pa.Table, u: np.ndarray | None = None) -> np.ndarray:
        """The role code (TRAIN, VALIDATION, TEST) of every row of batch; with folds, every non-test row is TRAIN
        (fold_ids says which fold holds it out). u: the batch's keys when the caller has them."""
        u = self.keys(batch) if u is None else u
        roles = np.full(len(u), TRAIN, dtype=np.int8)
        cuts = self._row_cuts(batch, len(u), u)
        test = u < cuts[:, 0]
        val = (u >= cuts[:, 0]) & (u < cuts[:, 1]) & (self.folds < 2)
        if self.label is not None:
            values = pc.cast(batch[self.label], pa.string())
            for mask, classes in ((test, self.test_classes), (val, self.validation_classes)):
                if classes is not None:
                    mask &= pc.is_in(values, value_set=pa.array(list(classes), pa.string())).to_numpy(
                        zero_copy_only=False
                    )
        roles[val] = VALIDATION
        roles[test] = TEST
        return roles

    def fold_ids(self, batch: pa.Table) -> np.ndarray:
        """The fold (0 .. folds-1) of every non-test row of batch, NO_FOLD for test rows (and without folds)."""
        u = self.keys(batch)
        roles = self.roles(batch, u)
        out = np.full(len(u), NO_FOLD, dtype=np.int8)
        if self.folds < 2:
            return out
        fit = roles != TEST
        if self.cuts:  # the class's own cuts on u among its non-test rows
            inner = self._row_cuts(batch, len(u), u)[:, 2:]
            out[fit] = (u[fit, None] >= inner[fit]).sum(axis=1)
            return out
        # the non-test share of [0, 1) stretched back to [0, 1): u past the test range, or (a class kept out of the
        # test role) u inside it
        t = self.test_fraction
        spread = np.where(u >= t, (u - t) / (1.0 - t), u / t if t > 0 else u)
        out[fit] = np.minimum((spread[fit] * self.folds).astype(np.int64), self.folds - 1)
        return out

    def earlier_roles(self, batch: pa.Table) -> np.ndarray:
        """The backtest's earlier model's role of every row of batch: TRAIN, VALIDATION, or NO_FOLD for the rows it
        never reads (the test rows, and the recent model's validation rows or newest fold)."""
        u = self.keys(batch)
        out = np.full(len(u), NO_FOLD, dtype=np.int8)
        if self.earlier is not None:
            out[u >= self.earlier["cut"]] = TRAIN
            out[(u >= self.earlier["recent_cut"]) & (u < self.earlier["cut"])] = VALIDATION
        return out

    def held_out(self, batch: pa.Table) -> np.ndarray:
        """Rows a model trained under this plan never trained on and no choice of its run read: its test rows (a
        plan without a test role, a model trained before there was one: its validation rows)."""
        return self.roles(batch) == (TEST if self.test_fraction > 0 else VALIDATION)

    def holds_out_every_test_row_of(self, other: FoldPlan) -> bool:
        """True when every row `other` puts in its test role is held out by this plan too (the same hash and classes,
        a test range at least as wide): a gate between their models needs no row-by-row check."""
        if not (
            self.seed == other.seed
            and self.key_columns == other.key_columns
            and self.label == other.label
            and self.test_classes == other.test_classes
            and other.test_fraction > 0
            and self.time_column == other.time_column
            and (self.time_column is not None or self.test_fraction >= other.test_fraction)
            and not self.group_strata
            and not other.group_strata  # groups under classes that may differ between the tables: row by row
        ):
            return False
        if not self.cuts and not other.cuts:
            return True
        mine, theirs = self.cuts or {}, other.cuts or {}
        classes = set(mine) | set(theirs)  # every class either cuts by rank; the others keep the fixed ranges
        return all(
            (mine[c][0] if c in mine else self.test_fraction) >= (theirs[c][0] if c in theirs else other.test_fraction)
            for c in classes
        )

    def describe(self) -> str:
        rest = (
            f"{self.folds} cross-fitting folds of the rest"
            if self.folds > 1
            else f"validation {self.validation_fraction:.3g} of the rest"
        )
        if self.time_column is not None:
            ranges = "; ".join(
                f"{role}: {self.time_text(a)} to {self.time_text(b)}, {self.counts.get(role, 0):,} rows"
                for role, (a, b) in (self.time_ranges or {}).items()
            )
            split = (
                f"; {self.groups_split:,} group(s) of {self.group_column!r} have rows on both sides of a cut"
                if self.groups_split
                else ""
            )
            return (
                f"by time ({self.time_column!r}): the newest {self.test_fraction:.3g} of the rows test, {rest} "
                f"in time order" + (f" ({ranges})" if ranges else "") + split
            )
        if self.group_column is not None:
            keyed = f"group column {self.group_column!r} (a group's rows share a role and fold)"
            if self.group_strata:
                groups = sum(len(v) for v in self.group_strata.values())
                keyed += f", stratified by each group's majority class ({groups:,} groups)"
        else:
            keyed = f"id column {self.key_columns[0]!r}" if len(self.key_columns) == 1 else "each row's values"
        return f"test {self.test_fraction:.3g} of the rows, {rest}, by a hash of {keyed} with seed {self.seed}"

    def time_text(self, value: float) -> str:
        """A time as time_number made it, written as the column holds it (2013-08-20, 2013-08-20T06:00:00, 17.5)."""
        import datetime as dt

        if self.time_kind == "date":
            return (dt.date(1970, 1, 1) + dt.timedelta(days=int(round(value)))).isoformat()
        if self.time_kind == "timestamp":
            return dt.datetime.fromtimestamp(value, dt.timezone.utc).replace(tzinfo=None).isoformat(timespec="seconds")
        return f"{value:g}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FoldPlan:
        """A stored plan, checked: fractions in [0, 1), a seed and key columns as written."""
        try:
            plan = cls(
                seed=int(d["seed"]),
                key_columns=tuple(str(c) for c in d["key_columns"]),
                test_fraction=float(d["test_fraction"]),
                validation_fraction=float(d["validation_fraction"]),
                label=None if d.get("label") is None else str(d["label"]),
                test_classes=None if d.get("test_classes") is None else tuple(map(str, d["test_classes"])),
                validation_classes=None
                if d.get("validation_classes") is None
                else tuple(map(str, d["validation_classes"])),
                counts={str(k): int(v) for k, v in (d.get("counts") or {}).items()},
                folds=int(d.get("folds", 1)),
                cuts=None
                if d.get("cuts") is None
                else {str(k): tuple(float(x) for x in v) for k, v in dict(d["cuts"]).items()},
                time_column=None if d.get("time_column") is None else str(d["time_column"]),
                time_kind=None if d.get("time_kind") is None else str(d["time_kind"]),
                time_ranges=None
                if d.get("time_ranges") is None
                else {str(k): (float(v[0]), float(v[1])) for k, v in dict(d["time_ranges"]).items()},
                group_column=None if d.get("group_column") is None else str(d["group_column"]),
                groups_split=None if d.get("groups_split") is None else int(d["groups_split"]),
                earlier=None if d.get("earlier") is None else {str(k): float(v) for k, v in dict(d["earlier"]).items()},
                group_strata=None
                if d.get("group_strata") is None
                else {str(k): tuple(float(x) for x in v) for k, v in dict(d["group_strata"]).items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a split plan trainflow wrote ({type(exc).__name__}: {exc})") from None
        lo, hi = (-np.inf, np.inf) if plan.time_column is not None else (0.0, 1.0)  # by time: minus a time
        bad_cuts = (
            (
                plan.cuts is not None
                and any(
                    len(c) != plan.folds + 1
                    or any(not lo <= x <= hi for x in c)
                    or list(c[2:]) != sorted(c[2:])
                    or c[1] < c[0]
                    for c in plan.cuts.values()
                )
            )
            or (plan.time_column is not None and not plan.cuts)
            or (
                plan.group_strata is not None
                and (
                    plan.group_column is None
                    or not set(plan.group_strata) <= set(plan.cuts or {})
                    or any(
                        list(v) != sorted(v) or any(not 0.0 <= x < 1.0 for x in v) for v in plan.group_strata.values()
                    )
                )
            )
            or plan.time_kind not in (None, "date", "timestamp", "number")
        )
        if bad_cuts or not (
            0.0 <= plan.test_fraction < 1.0
            and 0.0 < plan.validation_fraction < 1.0
            and plan.key_columns
            and 1 <= plan.folds <= MAX_FOLDS
        ):
            raise ValueError(
                f"not a split plan trainflow wrote (fractions {plan.test_fraction}, "
                f"{plan.validation_fraction}; folds {plan.folds}; key columns {plan.key_columns})"
            )
        return plan

    def save(self, directory: str | Path) -> None:
        from trainflow.run.storage import replace_bytes

        replace_bytes(str(Path(directory) / PLAN_FILE), json.dumps(self.to_dict(), indent=1).encode())

    @classmethod
    def load(cls, directory: str | Path) -> FoldPlan | None:
        """The plan stored in a checkpoint; for a checkpoint from before plans were stored, the plan its config.json
        implies (no test role: its validation rows are the ones it held out); None when neither says."""
        directory = Path(directory)
        path = directory / PLAN_FILE
        if path.is_file():
            try:
                return cls.from_dict(json.loads(path.read_text()))
            except ValueError as exc:
                raise ValueError(f"{path}: {exc}") from None
        try:
            cfg = json.loads((directory / "config.json").read_text())
            data, split = cfg["data"], cfg["split"]
            if data.get("id_column"):
                keys = [data["id_column"]]
            else:  # the row's values: its features in the fitted order, then the label
                prep = json.loads((directory / "preprocessor.json").read_text())
                keys = [*prep["feature_order"], prep["label"]]
            return cls(
                seed=int(split["seed"]),
                key_columns=tuple(keys),
                test_fraction=0.0,
                validation_fraction=float(split["validation_fraction"]),
            )
        except (OSError, KeyError, TypeError, ValueError):
            return None


def plan_mismatch(plan: FoldPlan, directory: str | Path, params: dict[str, str] | None = None) -> str | None:
    """Why a plan stored in a checkpoint (split.json) cannot be the one its training used, judged by the same
    checkpoint's config.json (and preprocessor.json) and, when given, the model version's logged params; None when
    they agree. A stored file is a claim: a gate reads held-out rows from it only after this check."""
    directory = Path(directory)
    try:
        cfg = json.loads((directory / "config.json").read_text())
        data, split, task = cfg["data"], cfg["split"], cfg.get("task")
        ordered = split.get("time_column") or split.get("group_column")  # roles by time or by group
        if ordered:
            keys = (str(ordered),)
        elif data.get("id_column"):
            keys = (str(data["id_column"]),)
        else:
            prep = json.loads((directory / "preprocessor.json").read_text())
            keys = (*map(str, prep["feature_order"]), str(prep["label"]))
        asked_test, asked_val = float(split["test_fraction"]), float(split["validation_fraction"])
        seed = int(split["seed"])
    except (OSError, KeyError, TypeError, ValueError) as exc:
        return f"its config.json cannot be read to check it ({type(exc).__name__}: {exc})"
    wrong = []
    if plan.seed != seed:
        wrong.append(f"seed {plan.seed} where its config says split.seed {seed}")
    if plan.key_columns != keys:
        wrong.append(f"key columns {list(plan.key_columns)} where its config implies {list(keys)}")
    if abs(plan.validation_fraction - asked_val) > 1e-9:
        wrong.append(f"validation fraction {plan.validation_fraction} where its config says {asked_val}")
    if plan.test_fraction > asked_test + 1e-9 or (asked_test > 0) != (plan.test_fraction > 0):
        wrong.append(f"test fraction {plan.test_fraction} where its config says at most {asked_test}")
    label = str(data.get("label")) if task == "classification" and not ordered else None
    for key in ("time_column", "group_column"):
        if getattr(plan, key) != split.get(key):
            wrong.append(f"{key} {getattr(plan, key)!r} where its config says split.{key} {split.get(key)!r}")
    if plan.label != label:
        wrong.append(f"stratified by {plan.label!r} where its config implies {label!r}")
    for key, value in (
        ("split.seed", seed),
        ("split.test_fraction", asked_test),
        ("split.validation_fraction", asked_val),
    ):  # config.json against what MLflow logged
        if params and key in params and str(params[key]) != str(value):
            wrong.append(f"its config.json says {key} {value} where the version's MLflow run logged {params[key]}")
    return "; ".join(wrong) or None


def resolve_folds(asked: int | str, non_test_rows: int, test_fraction: float) -> int:
    """train.folds: a number as given; auto: AUTO_FOLDS folds when the rows outside the test role are at most
    AUTO_FOLD_ROWS (where a fifth of them for validation would judge on few rows and train on fewer), else 1. Without a
    test role every row trains some fold model, so nothing would be left to judge the served model on: 1."""
    if test_fraction <= 0:
        return 1
    if asked == "auto":
        return AUTO_FOLDS if non_test_rows <= AUTO_FOLD_ROWS else 1
    return int(asked)


def effective_test_fraction(requested: float, rows: int) -> float:
    """split.test_fraction, capped so the test role holds at most MAX_TEST_ROWS rows."""
    if requested <= 0 or rows <= 0:
        return 0.0
    return min(requested, MAX_TEST_ROWS / rows)


def eligible(per_class: dict[str, int], share: float) -> tuple[str, ...]:
    """The classes with at least one expected row in a role that takes `share` of them."""
    return tuple(sorted(v for v, n in per_class.items() if n * share >= 1))


MIN_CLASS_ROWS = 5  # the rows a typical class needs for a model to learn it and a split to judge it
# a label of numbers with more classes than this and fewer rows per class on average than the next is a quantity
# read as classes (332 whole numbers in 3,000 rows): refused under task: classification, however the task was set
MAX_NUMBER_CLASSES = 20
MIN_NUMBER_CLASS_ROWS = 50


def _is_number(value) -> bool:
    if isinstance(value, bool):
        return False
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def label_unfit_for_task(path: str, label: str, task: str, rows: str, values: str):
    """The DataError for a label that cannot be what the task says: one class under classification, at most two
    values under regression. rows: which rows were read ("its 300 rows"); values: what was found in them."""
    from trainflow.errors import DataError

    if task == "classification":
        return DataError(
            f"{path}: label column {label!r} has only one class ({values}) in {rows}; classification needs at least two"
        )
    return DataError(
        f"{path}: label column {label!r} under task: regression holds at most two values in {rows} "
        f"({values}): that is a class, not a quantity to fit; set task: classification"
    )


def check_class_sizes(path: str, label: str, label_counts: dict) -> None:
    """DataError when most classes are too small to learn or to judge (the median class under MIN_CLASS_ROWS rows):
    a quantity read as classes (a count, an amount in whole units) or a label that names rows rather than groups; and
    when numbers make more than MAX_NUMBER_CLASSES classes of under MIN_NUMBER_CLASS_ROWS rows on average (a quantity,
    whatever set the task: the config or the label's inference)."""
    from trainflow.errors import DataError

    sizes = sorted(label_counts.values())
    median = sizes[len(sizes) // 2]
    numeric = all(_is_number(k) for k in label_counts)
    mean = sum(sizes) / len(sizes)
    if len(sizes) > 2 and median < MIN_CLASS_ROWS:
        raise DataError(
            f"{path}: label column {label!r} has {len(sizes):,} classes over {sum(sizes):,} rows, half of "
            f"them with {median} row(s) or fewer: too few for a model to learn a class or for a split to judge it. "
            + ("If the label is a quantity, set task: regression; otherwise " if numeric else "")
            + "merge rare classes or gather more rows per class"
        )
    if numeric and len(sizes) > MAX_NUMBER_CLASSES and mean < MIN_NUMBER_CLASS_ROWS:
        raise DataError(
            f"{path}: label column {label!r} under task: classification holds {len(sizes):,} distinct numbers over "
            f"{sum(sizes):,} rows (about {mean:.0f} rows each, half of them {median} or fewer): that reads as a "
            f"quantity (a count, an amount in whole units), not {len(sizes):,} classes. Set task: regression; if they "
            f"are codes of classes, each needs more rows (at least {MIN_NUMBER_CLASS_ROWS} on average with more than "
            f"{MAX_NUMBER_CLASSES} classes)"
        )


def check_sizes(counts: dict[str, int], source: str, plan: FoldPlan) -> None:
    """DataError naming the counts when a role is too small to judge anything."""
    from trainflow.errors import DataError

    wanted = {"train": MIN_ROLE_ROWS}
    wanted.update(
        {f"fold {k}": MIN_ROLE_ROWS for k in range(plan.folds)} if plan.folds > 1 else {"validation": MIN_ROLE_ROWS}
    )
    if plan.test_fraction > 0:
        wanted["test"] = MIN_ROLE_ROWS
    short = [f"{role} {counts.get(role, 0)}" for role, least in wanted.items() if counts.get(role, 0) < least]
    if short:
        raise DataError(
            f"{source}: {sum(counts.get(r, 0) for r in ('train', 'validation', 'test'))} rows are too few to train, "
            "choose and judge a model: "
            f"{', '.join(f'{r} {n}' for r, n in counts.items() if not r.startswith('fold '))} rows"
            + (
                f" (the train rows in {plan.folds} folds of "
                f"{', '.join(str(counts.get(f'fold {k}', 0)) for k in range(plan.folds))})"
                if plan.folds > 1
                else ""
            )
            + f" (at least {MIN_ROLE_ROWS} each are needed; "
            f"short: {', '.join(short)}); add rows, or change split.test_fraction / split.validation_fraction"
            + (" / train.folds" if plan.folds > 1 else "")
        )
