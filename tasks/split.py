"""Task: the fold plan's roles (test, validation, train) by a seeded hash, stratified for classification; the
assignment written with the run."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pyarrow as pa
from prefect import task
from prefect.cache_policies import NO_CACHE

from trainflow.config import Config
from trainflow.data import Rows, fold_parts, split_roles
from trainflow.roles.plan import plan_split
from trainflow.roles.folds import NO_FOLD, ROLE_NAMES, TEST, TRAIN, VALIDATION, FoldPlan, check_sizes
from trainflow.run.storage import filesystem_for, join, list_dir, write_text
from trainflow.tasks.common import retry_unless_user_error, task_logger
from trainflow.tasks.values import Ingested, Split


ASSIGNMENT_PLAN = "_plan.json"


def _assignment(batch: pa.Table, plan: FoldPlan, id_column: str | None) -> pa.Table:
    roles = plan.roles(batch)
    key = {id_column: batch[id_column]} if id_column else {"row_key": plan.keys(batch)}
    names = np.array([ROLE_NAMES[r] for r in (TRAIN, VALIDATION, TEST)], dtype=object)
    folds = plan.fold_ids(batch)  # the fold model that holds the row out (null: a test row, or no folds)
    return pa.table(
        {
            **key,
            "role": pa.array(names[roles].tolist(), pa.string()),
            "fold": pa.array(folds, pa.int8(), mask=folds == NO_FOLD),
        }
    )


def write_assignment(ds: Rows, plan: FoldPlan, id_column: str | None, where: str) -> str:
    """The run's assignment as Parquet under where: each row's id (or its hash key in [0, 1)) and role, the plan
    (_plan.json, a name Parquet readers skip) written last; a rerun of the same run (same data, same plan) finds it."""
    found = list_dir(where)
    if any(name == ASSIGNMENT_PLAN for name, _ in found):
        return where
    if found:  # a write of this run's own assignment folder cut short (no _plan.json): its files go, then again
        fs, inner = filesystem_for(where)
        fs.delete_dir_contents(inner, missing_dir_ok=True)
    columns = list(
        dict.fromkeys([*plan.key_columns, *([plan.label] if plan.label else []), *([id_column] if id_column else [])])
    )
    if isinstance(ds, pa.Table):  # a table in this process's memory: one file, written here
        import pyarrow.parquet as pq

        fs, inner = filesystem_for(where)
        fs.create_dir(inner, recursive=True)
        pq.write_table(
            _assignment(ds.select(columns), plan, id_column), f"{inner.rstrip('/')}/assignment.parquet", filesystem=fs
        )
    else:
        ds.select_columns(columns).map_batches(
            _assignment, fn_kwargs={"plan": plan, "id_column": id_column}, batch_format="pyarrow"
        ).write_parquet(where)
    write_text(join(where, ASSIGNMENT_PLAN), json.dumps(plan.to_dict(), indent=1))
    return where


@task(
    name="record-split",
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=retry_unless_user_error,
    cache_policy=NO_CACHE,
)
def record_split(ingested: Ingested, config: Config, parts: Split, run_name: str) -> Split:
    """Write the run's assignment (each row's key and role) beside its runs, once the checks passed and training is
    about to start; the split with its split_path."""
    where = write_assignment(
        ingested.dataset, parts.plan, config.data.id_column, join(config.storage_path, f"{run_name}-split")
    )
    return replace(parts, split_path=where)


def time_hint(config: Config, dates: list[str]) -> str | None:
    """One line for a table with a date or datetime column and roles by a hash: its test rows are a random sample of
    all times, not the rows a model meets next; names the key that changes that."""
    if config.split.time_column is not None or config.split.group_column is not None or not dates:
        return None
    return (
        f"the test rows are a random sample of all times, not the newest rows a model meets next; the table has "
        f"the date column {dates[0]!r}: set split.time_column: {dates[0]} to judge on its newest rows"
    )


@task(name="split", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_user_error, cache_policy=NO_CACHE)
def split(ingested: Ingested, config: Config, folds: int | str | None = None) -> Split:
    """Split the table into training, validation and test rows (the fold plan), or into test rows and cross-fitting
    folds (train.folds; folds overrides it: the tune flow's trials train on one split)."""
    keys = [config.data.id_column] if config.data.id_column else ingested.spec.feature_order + [config.data.label]
    rows = ingested.dataset
    plan = plan_split(
        rows,
        config.task,
        config.data.label,
        config.split.test_fraction,
        config.split.validation_fraction,
        config.split.seed,
        keys,
        ingested.spec.rows,
        config.train.folds if folds is None else folds,
        ingested.spec.path,
        config.split.time_column,
        config.split.group_column,
    )
    check_sizes(plan.counts, ingested.spec.path, plan)
    note = time_hint(config, ingested.spec.dates)
    in_process = isinstance(rows, pa.Table)  # read by this process: cut here, as tables (no Ray passes)
    parts = split_roles(rows, plan, ingested.materialized)
    log = task_logger("split")
    if note:
        log.warning("split: %s", note)
    if plan.folds > 1:
        non_test = plan.counts["train"]
        log.info(
            "split: %d test rows; %d rows in %d cross-fitting folds (%s) (%s)",
            plan.counts["test"],
            non_test,
            plan.folds,
            ", ".join(str(plan.counts[f"fold {k}"]) for k in range(plan.folds)),
            plan.describe(),
        )
        cut = [fold_parts(parts[TRAIN], plan, k, ingested.materialized) for k in range(plan.folds)]
        if ingested.materialized and not in_process:
            cut = [(a.materialize(), b.materialize()) for a, b in cut]
        return Split(
            parts[TRAIN],
            None,
            non_test,
            0,
            ingested.materialized,
            test=parts[TEST],
            test_rows=plan.counts["test"],
            plan=plan,
            folds=cut,
            note=note,
        )
    log.info(
        "split: %d training, %d validation, %d test rows (%s)",
        plan.counts["train"],
        plan.counts["validation"],
        plan.counts.get("test", 0),
        plan.describe(),
    )
    return Split(
        parts[TRAIN],
        parts[VALIDATION],
        plan.counts["train"],
        plan.counts["validation"],
        ingested.materialized,
        test=parts.get(TEST),
        test_rows=plan.counts.get("test", 0),
        plan=plan,
        note=note,
    )
