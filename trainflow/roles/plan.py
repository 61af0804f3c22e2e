"""The fold plan of a table: one counting pass over its key and label columns (Ray Data, or this process for a small
table) gives each role's and fold's rows: by a seeded hash of the keys (stratified by class), by time, or by group.
trainflow/roles/folds.py holds the plan itself (FoldPlan); trainflow/data.py applies it to the rows."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trainflow.data import Rows, per_batch, schema_of
from trainflow.errors import DataError


def _role_counts(batch: pa.Table, plan) -> pa.Table:
    """Per class (or for the whole batch): rows, rows the plan puts in the test role, in the validation role and,
    with folds, rows per fold (f0, f1, ...): the plan's own roles (before its classes are chosen, every class's rows
    in the test and validation ranges)."""
    from trainflow.roles.folds import TEST, VALIDATION

    roles = plan.roles(batch)
    test, val = roles == TEST, roles == VALIDATION
    folds = plan.fold_ids(batch) if plan.folds > 1 else None
    if plan.label is None:
        extra = {f"f{k}": [int((folds == k).sum())] for k in range(plan.folds)} if folds is not None else {}
        return pa.table({"rows": [batch.num_rows], "test": [int(test.sum())], "val": [int(val.sum())], **extra})
    labels = pc.cast(batch[plan.label], pa.string()).to_numpy(zero_copy_only=False)
    values, inverse = np.unique(labels.astype(str), return_inverse=True)
    count = lambda w=None: np.bincount(inverse, weights=w, minlength=len(values)).astype(np.int64)  # noqa: E731
    extra = {f"f{k}": count(folds == k) for k in range(plan.folds)} if folds is not None else {}
    return pa.table(
        {
            "value": pa.array(values.tolist(), pa.string()),
            "rows": count(),
            "test": count(test),
            "val": count(val),
            **extra,
        }
    )


def _counts(ds: Rows, plan, columns: list[str]) -> list[dict]:
    return per_batch(ds, _role_counts, {"plan": plan}, columns)


def _keys_and_classes(batch: pa.Table, plan) -> pa.Table:
    """Each row's number u and (stratified) its class as text."""
    classes = plan._classes(batch)
    return pa.table({"u": plan.keys(batch), "value": classes if classes is not None else np.full(batch.num_rows, "")})


def _all_keys(ds: Rows, plan, columns: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(u, class) of every row: this process's pass for a table in its memory, else Ray tasks' (a small table)."""
    if isinstance(ds, pa.Table):
        out = _keys_and_classes(ds.select(columns), plan)
    else:
        parts = (
            ds.select_columns(columns)
            .map_batches(_keys_and_classes, fn_kwargs={"plan": plan}, batch_format="pyarrow")
            .iter_batches(batch_format="pyarrow")
        )
        out = pa.concat_tables([pa.Table.from_batches([b]) if isinstance(b, pa.RecordBatch) else b for b in parts])
    return out["u"].to_numpy(), np.asarray(out["value"].to_numpy(zero_copy_only=False)).astype(str)


def _between(sorted_u: np.ndarray, rank: int, lo: float = 0.0, hi: float = 1.0) -> float:
    """A cut on u with `rank` of sorted_u below it (midway between two neighbours: a row's u never sits on it); rows
    of one value (ties: one time, one group, duplicate rows) stay on one side, the side nearer `rank`. lo / hi: the
    cut below or above every u."""
    n = len(sorted_u)
    if 0 < rank < n and sorted_u[rank - 1] == sorted_u[rank]:
        first = int(np.searchsorted(sorted_u, sorted_u[rank], "left"))
        last = int(np.searchsorted(sorted_u, sorted_u[rank], "right"))
        rank = first if (first > 0 and rank - first <= last - rank) or last == n else last
    if rank <= 0:
        return lo
    if rank >= n:
        return hi
    return float((sorted_u[rank - 1] + sorted_u[rank]) / 2.0)


def _share(n: int, share: float, eligible: bool) -> int:
    """A class's rows in a role that takes `share`: none for a class too small for it, else at least one."""
    return max(1, round(n * share)) if eligible and share > 0 else 0


def exact_cuts(
    u: np.ndarray, classes: np.ndarray, plan, test_classes, val_classes, rows: int
) -> tuple[dict, dict[str, int]]:
    """The plan's cuts for each class and the rows they give each role and fold: the validation role and the folds
    at the hash's ranks among the class's non-test rows (each its exact share); the test role too on a table of at
    most EXACT_TEST_ROWS rows, else at the fixed test range (a growing table keeps its test rows)."""
    from trainflow.roles.folds import EXACT_TEST_ROWS

    k = plan.folds
    cuts, counts = {}, {"train": 0, "validation": 0, "test": 0, **({f"fold {i}": 0 for i in range(k)} if k > 1 else {})}
    for value in np.unique(classes):
        mine = np.sort(u[classes == value])
        n = len(mine)
        tested_class = test_classes is None or value in test_classes
        if rows <= EXACT_TEST_ROWS:
            test_cut = _between(mine, _share(n, plan.test_fraction, tested_class))
        else:
            test_cut = plan.test_fraction if tested_class else 0.0
        fit = mine[mine >= test_cut]
        n_val = _share(len(fit), plan.validation_fraction, val_classes is None or value in val_classes) if k < 2 else 0
        val_cut = _between(fit, n_val) if n_val else test_cut
        inner = [_between(fit, round(len(fit) * i / k)) for i in range(1, k)] if k > 1 else []
        cuts[str(value)] = (test_cut, val_cut, *inner)
        # counted as the plan assigns (rows of equal keys, duplicates without an id, share a side of every cut)
        tested = n - len(fit)
        validated = int((fit < val_cut).sum()) if k < 2 else 0
        counts["test"] += tested
        counts["validation"] += validated
        counts["train"] += n - tested - validated
        if k > 1:
            ids = (fit[:, None] >= np.array(inner)[None, :]).sum(axis=1)
            for i in range(k):
                counts[f"fold {i}"] += int((ids == i).sum())
    return cuts, counts


def _ordered_columns(batch: pa.Table, plan, label: str | None, group_column: str | None) -> pa.Table:
    """A time or group plan's pass: each row's number (minus its time, or its group's hash), its label (the class
    check) and, by time with groups, its group's hash (the groups the time cut splits)."""
    from trainflow.roles.folds import split_fraction_keys

    out = {"u": plan.keys(batch)}
    if label is not None:
        out["label"] = pc.cast(batch[label], pa.string())
    if group_column is not None and plan.time_column is not None:
        out["g"] = split_fraction_keys(batch, [group_column], plan.seed)
    if group_column is not None and plan.time_column is None:
        out["missing"] = pc.is_null(batch[group_column])
    return pa.table(out)


def _gather(ds: Rows, fn, kwargs: dict, columns: list[str]) -> pa.Table:
    """fn over every batch of ds's columns, concatenated in this process (this process's pass for a table in its
    memory)."""
    if isinstance(ds, pa.Table):
        return fn(ds.select(columns), **kwargs)
    parts = (
        ds.select_columns(columns)
        .map_batches(fn, fn_kwargs=kwargs, batch_format="pyarrow")
        .iter_batches(batch_format="pyarrow")
    )
    return pa.concat_tables([pa.Table.from_batches([b]) if isinstance(b, pa.RecordBatch) else b for b in parts])


def _ordering_kind(ds: Rows, source: str, time_column: str | None, group_column: str | None) -> str | None:
    """The time column's kind (None by group); DataError naming a column that is missing or of another type."""
    from trainflow.roles.folds import time_kind

    names = schema_of(ds).names
    for key, column in (("time_column", time_column), ("group_column", group_column)):
        if column is not None and column not in names:
            from trainflow.tables.files import did_you_mean

            raise DataError(
                f"{source}: split.{key} {column!r} is not a column; {did_you_mean(column, names)}columns are {names}"
            )
    if time_column is None:
        return None
    kind = time_kind(schema_of(ds).field(time_column).type)
    if kind is None:
        raise DataError(
            f"{source}: split.time_column {time_column!r} has type "
            f"{schema_of(ds).field(time_column).type}; it needs dates, timestamps or numbers (a text "
            "column of dates: parse it into a date or timestamp column first)"
        )
    return kind


def _rows_per_role(plan, u: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
    """Each row's role (0 train, 1 validation, 2 test) at the plan's cuts, and the rows per role and fold."""
    k = plan.folds
    row_cuts = plan._row_cuts(None, len(u), u)
    roles = np.where(u < row_cuts[:, 0], 2, np.where((u < row_cuts[:, 1]) & (k < 2), 1, 0))
    counts = {"train": int((roles == 0).sum()), "validation": int((roles == 1).sum()), "test": int((roles == 2).sum())}
    if k > 1:
        ids = (u[roles != 2, None] >= row_cuts[roles != 2, 2:]).sum(axis=1)
        counts.update({f"fold {i}": int((ids == i).sum()) for i in range(k)})
    return roles, counts


def plan_ordered(
    ds: Rows,
    task: str,
    label: str,
    test_fraction: float,
    validation_fraction: float,
    seed: int,
    rows: int,
    folds: int | str,
    source: str,
    time_column: str | None,
    group_column: str | None,
):
    """The plan by time (time_column: the newest rows test, the newest before them validation or the folds' blocks,
    the oldest training) or by group (group_column: a group's rows share a role and fold), cut at the ranks of every
    row's time or group hash in one pass; ties never straddle a cut. DataError naming the column for a missing time,
    a time column of another type, or a group larger than a role can hold."""
    from trainflow.roles.folds import FoldPlan, check_class_sizes, effective_test_fraction, resolve_folds

    kind = _ordering_kind(ds, source, time_column, group_column)
    test_share = effective_test_fraction(test_fraction, rows)
    plan = FoldPlan(
        seed=seed,
        key_columns=(time_column or group_column,),
        test_fraction=test_share,
        validation_fraction=validation_fraction,
        folds=resolve_folds(folds, round(rows * (1 - test_share)), test_share),
        time_column=time_column,
        time_kind=kind,
        group_column=group_column,
    )
    by_label = label if task == "classification" else None
    columns = list(dict.fromkeys(c for c in (time_column, group_column, by_label) if c is not None))
    got = _gather(ds, _ordered_columns, {"plan": plan, "label": by_label, "group_column": group_column}, columns)
    u = got["u"].to_numpy()
    if time_column is not None:
        _check_times(u, plan, source)
    else:
        _check_groups(u, got["missing"].to_numpy(zero_copy_only=False), group_column, source)
    if by_label is not None:
        found = pc.value_counts(got["label"])
        check_class_sizes(
            source, label, dict(zip(map(str, found.field("values").to_pylist()), found.field("counts").to_pylist()))
        )
    lo, hi = (-np.inf, np.inf) if time_column is not None else (0.0, 1.0)
    s, k = np.sort(u), plan.folds
    test_cut = _between(s, _share(len(s), test_share, True), lo, hi)
    fit = s[s >= test_cut]
    val_cut = _between(fit, _share(len(fit), validation_fraction, True), lo, hi) if k < 2 else test_cut
    val_cut = max(val_cut, test_cut)
    inner = [_between(fit, round(len(fit) * i / k), lo, hi) for i in range(1, k)] if k > 1 else []
    plan = replace(plan, cuts={"": (test_cut, val_cut, *inner)})
    if group_column is not None and time_column is None and by_label is not None:
        plan = _stratify_groups(plan, u, np.asarray(got["label"].to_numpy(zero_copy_only=False)).astype(str))
    roles, counts = _rows_per_role(plan, u)
    extra: dict = {}
    if time_column is not None:
        extra["time_ranges"] = {
            name: (float(-u[roles == r].max()), float(-u[roles == r].min()))
            for r, name in ((0, "train"), (1, "validation"), (2, "test"))
            if (roles == r).any()
        }
        extra["earlier"] = _earlier(u, (test_cut, val_cut, *inner), k, lo, hi)
        if group_column is not None:
            pairs = np.unique(np.stack([got["g"].to_numpy(), roles.astype(np.float64)], axis=1), axis=0)
            extra["groups_split"] = int((np.unique(pairs[:, 0], return_counts=True)[1] > 1).sum())
    elif group_column is not None:
        _check_group_sizes(ds, plan, s, counts, source)
    return replace(plan, counts=counts, **extra)


def _check_times(u: np.ndarray, plan, source: str) -> None:
    """DataError naming split.time_column and the count for times no role can come from: missing, infinite, a
    date past FAR_FUTURE_S (a placeholder such as 9999-12-31, which would make its rows the test role), or one time
    for every row (nothing is newer than anything)."""
    from trainflow.roles.folds import FAR_FUTURE_S

    column, n = plan.time_column, len(u)
    times = -u
    missing = np.isnan(times)
    if missing.any():
        raise DataError(
            f"{source}: split.time_column {column!r} is missing in {int(missing.sum()):,} of {n:,} rows; drop or "
            "fill them (a row's role comes from its time)"
        )
    infinite = np.isinf(times)
    if infinite.any():
        raise DataError(
            f"{source}: split.time_column {column!r} is infinite in {int(infinite.sum()):,} of {n:,} rows; drop them "
            "or give them their real times (a row's role comes from its time)"
        )
    limit = FAR_FUTURE_S / 86_400.0 if plan.time_kind == "date" else FAR_FUTURE_S
    far = times > limit if plan.time_kind in ("date", "timestamp") else np.zeros(n, dtype=bool)
    if far.any():
        raise DataError(
            f"{source}: split.time_column {column!r} is after {plan.time_text(limit)} in {int(far.sum()):,} of "
            f"{n:,} rows (the latest {plan.time_text(float(times.max()))}): a placeholder for 'no date', not a time; "
            "drop those rows or give them their real times (they would be the newest, the test role)"
        )
    if n and (times == times[0]).all():
        raise DataError(
            f"{source}: split.time_column {column!r} has one value ({plan.time_text(float(times[0]))}) in all {n:,} "
            "rows: no row is newer than another, so no role can be cut by time; name a column whose times differ, "
            "or leave split.time_column out"
        )


def _check_groups(u: np.ndarray, missing: np.ndarray, column: str, source: str) -> None:
    """DataError naming split.group_column for rows without a group (they would silently be one group) or a table
    of one group (a group's rows share a role)."""

    n = len(u)
    if missing.any():
        raise DataError(
            f"{source}: split.group_column {column!r} is missing in {int(missing.sum()):,} of {n:,} rows"
            + (" (every row)" if missing.all() else "")
            + "; rows without a group would all be one group: fill them (each row its own id, say) or drop them"
        )
    if n and (u == u[0]).all():
        raise DataError(
            f"{source}: split.group_column {column!r} holds one group in all {n:,} rows: a group's rows share a "
            "role, so one group cannot give training, validation and test rows; name a column of several groups, "
            "or leave split.group_column out"
        )


def _stratify_groups(plan, u: np.ndarray, labels: np.ndarray):
    """A group plan cut within each group's majority class (FoldPlan.group_strata): every class with groups to spare
    gets its share of test, validation and fold rows, where the hash alone could leave a class of few groups out of
    the test role. Unchanged above STRATIFIED_GROUPS groups (the hash spreads many groups evenly enough)."""
    from trainflow.roles.folds import STRATIFIED_GROUPS

    groups, group_of = np.unique(u, return_inverse=True)
    if len(groups) > STRATIFIED_GROUPS or len(groups) < 2:
        return plan
    classes, class_of = np.unique(labels, return_inverse=True)
    per_group = np.zeros((len(groups), len(classes)), dtype=np.int64)
    np.add.at(per_group, (group_of, class_of), 1)
    majority = per_group.argmax(axis=1)  # ties: the class that sorts first
    cuts, strata, k = dict(plan.cuts), {}, plan.folds
    for c, value in enumerate(classes):
        members = majority == c
        if not members.any():
            continue
        mine = np.sort(u[members[group_of]])
        test_cut = _between(mine, _share(len(mine), plan.test_fraction, True))
        fit = mine[mine >= test_cut]
        val_cut = max(_between(fit, _share(len(fit), plan.validation_fraction, True)), test_cut) if k < 2 else test_cut
        inner = [_between(fit, round(len(fit) * i / k)) for i in range(1, k)] if k > 1 else []
        cuts[str(value)] = (test_cut, max(val_cut, test_cut), *inner)
        strata[str(value)] = tuple(float(g) for g in groups[members])
    return replace(plan, cuts=cuts, group_strata=strata)


def _earlier(u: np.ndarray, cuts: tuple[float, ...], k: int, lo: float, hi: float) -> dict[str, float] | None:
    """By time, the backtest's earlier model (FoldPlan.earlier): cut one block of the recent model's validation
    size off the newest end of its training rows; None when that leaves it fewer training rows than the block."""
    from trainflow.roles.folds import MIN_ROLE_ROWS

    recent_cut = cuts[1] if k < 2 else cuts[2]
    trained = np.sort(u[u >= recent_cut])
    held = int(((u >= cuts[0]) & (u < recent_cut)).sum())
    if held < MIN_ROLE_ROWS or len(trained) < 2 * held:
        return None
    cut = _between(trained, held, lo, hi)
    rows = int((trained >= cut).sum())
    if rows < held or not np.isfinite(cut):
        return None
    return {
        "cut": float(cut),
        "recent_cut": float(recent_cut),
        "end": float(-trained[trained >= cut].min()),
        "recent_end": float(-trained.min()),
        "rows": rows,
        "validation_rows": len(trained) - rows,
    }


def _check_group_sizes(ds: Rows, plan, sorted_u: np.ndarray, counts: dict[str, int], source: str) -> None:
    """DataError naming the largest group when it holds more rows than the smallest role or fold the plan asks for."""

    values, sizes = np.unique(sorted_u, return_counts=True)
    biggest = int(sizes.argmax())
    roles = {r: n for r, n in counts.items() if n > 0 and r != "train"}
    if not roles:
        return
    smallest = min(roles, key=roles.get)
    n = len(sorted_u)
    wanted = {"test": n * plan.test_fraction, "validation": (n - counts["test"]) * plan.validation_fraction}
    target = wanted.get(smallest, (n - counts["test"]) / max(plan.folds, 1))
    if sizes[biggest] <= target:
        return
    hit = _gather(ds, _rows_of_key, {"plan": plan, "u": float(values[biggest])}, [plan.group_column])
    name = hit[plan.group_column][0].as_py() if hit.num_rows else "?"
    raise DataError(
        f"{source}: group {name!r} of split.group_column {plan.group_column!r} has {int(sizes[biggest]):,} "
        f"rows, more than the {smallest} role's {target:,.0f} rows can hold (a group's rows share one role): "
        "split the group, raise split.test_fraction / split.validation_fraction, or choose another group "
        "column"
    )


def _rows_of_key(batch: pa.Table, plan, u: float) -> pa.Table:
    return batch.filter(pa.array(plan.keys(batch) == u)).slice(0, 1)


def plan_split(
    ds: Rows,
    task: str,
    label: str,
    test_fraction: float,
    validation_fraction: float,
    seed: int,
    key_columns: list[str],
    rows: int,
    folds: int | str = 1,
    source: str = "",
    time_column: str | None = None,
    group_column: str | None = None,
):
    """The fold plan for this table: one counting pass over the key and label columns gives the rows per class in
    each role, so every class with enough rows gets its share of test and validation rows (stratification) and a
    class too small for a role keeps those rows for training; a label whose classes are mostly too small for any is
    refused (source names the table). folds: train.folds (auto resolved from rows). A table of at most EXACT_ROWS
    rows has its validation role and folds cut at the hash's ranks within each class (each gets its share: on 95
    rows, folds of 18 to 20), and its test role too when it has at most EXACT_TEST_ROWS rows (exact_cuts); a larger
    one by the hash's fixed ranges (within a fraction of a percent of those shares)."""
    from trainflow.roles.folds import (
        EXACT_ROWS,
        FoldPlan,
        effective_test_fraction,
        resolve_folds,
    )

    if time_column is not None or group_column is not None:
        return plan_ordered(
            ds, task, label, test_fraction, validation_fraction, seed, rows, folds, source, time_column, group_column
        )
    by_label = label if task == "classification" else None
    test_share = effective_test_fraction(test_fraction, rows)
    plan = FoldPlan(
        seed=seed,
        key_columns=tuple(key_columns),
        test_fraction=test_share,
        validation_fraction=validation_fraction,
        label=by_label,
        folds=resolve_folds(folds, round(rows * (1 - test_share)), test_share),
    )
    columns = list(dict.fromkeys([*key_columns, label]))
    if 0 < rows <= EXACT_ROWS:
        return _exact_plan(ds, plan, columns, source, label, rows)
    return _counted_plan(ds, plan, columns, source, label)


def _class_roles(plan, source: str, label: str, sizes: dict) -> tuple[list, list]:
    """The classes with enough rows for a test and a validation share (a label mostly of tiny classes refused)."""
    from trainflow.roles.folds import check_class_sizes, eligible

    check_class_sizes(source, label, sizes)
    test_classes = eligible(sizes, plan.test_fraction)
    return test_classes, eligible(sizes, (1 - plan.test_fraction) * plan.validation_fraction)


def _exact_plan(ds: Rows, plan, columns: list[str], source: str, label: str, rows: int):
    """A small table's plan: its roles and folds cut at the hash's ranks within each class (exact_cuts)."""
    u, classes = _all_keys(ds, plan, columns)
    test_classes = val_classes = None
    if plan.label is not None:
        values, sizes_ = np.unique(classes, return_counts=True)
        test_classes, val_classes = _class_roles(plan, source, label, dict(zip(values.tolist(), sizes_.tolist())))
        plan = replace(plan, test_classes=test_classes, validation_classes=val_classes)
    cuts, counts = exact_cuts(u, classes, plan, test_classes, val_classes, rows)
    return replace(plan, cuts=cuts, counts=counts)


def _counted_plan(ds: Rows, plan, columns: list[str], source: str, label: str):
    """A larger table's plan: its roles by the hash's fixed ranges, their rows counted (per class when stratified)."""
    counts = _counts(ds, plan, columns)
    fold_names = [f"f{k}" for k in range(plan.folds)] if plan.folds > 1 else []
    if plan.label is None:
        total = {c: sum(r[c] for r in counts) for c in ["rows", "test", "val", *fold_names]}
        return replace(
            plan,
            counts={
                "train": total["rows"] - total["test"] - total["val"],
                "validation": total["val"],
                "test": total["test"],
                **_fold_counts(total, fold_names),
            },
        )
    per_class: dict[str, dict[str, int]] = {}
    for r in counts:
        tot = per_class.setdefault(r["value"], {})
        for c in ["rows", "test", "val", *fold_names]:
            tot[c] = tot.get(c, 0) + r[c]
    sizes = {v: t["rows"] for v, t in per_class.items()}
    test_classes, val_classes = _class_roles(plan, source, label, sizes)
    n_test = sum(per_class[v]["test"] for v in test_classes)
    n_val = sum(per_class[v]["val"] for v in val_classes) if plan.folds < 2 else 0
    plan = replace(plan, test_classes=test_classes, validation_classes=val_classes)
    if fold_names:  # a class kept out of the test role spreads its test-range rows over the folds: count again
        counts = _counts(ds, plan, columns)
    total = {c: sum(r[c] for r in counts) for c in fold_names}
    return replace(
        plan,
        counts={
            "train": sum(sizes.values()) - n_test - n_val,
            "validation": n_val,
            "test": n_test,
            **_fold_counts(total, fold_names),
        },
    )


def _fold_counts(total: dict[str, int], fold_names: list[str]) -> dict[str, int]:
    return {f"fold {name[1:]}": int(total[name]) for name in fold_names}
