"""Small work answered in this process, without Prefect's temporary server or Ray; the pre-flight checks that
every command makes from the files' metadata before anything starts.

With no Prefect API configured, `trainflow predict` of a scoring table small enough to score in this process, a
`trainflow retrain` whose table is the champion's own (a skip), and `trainflow validate` run the flow's steps as
plain functions: starting Ray and Prefect's temporary server would take most of their time, and nothing outlives
that server to read its records (validate starts Ray only to read a table through Ray Data: a CSV, a large table, a
named cluster). What such a run records: the predictions with their manifest, drift scores as metrics of the serving
model version's MLflow run, and the summary it prints (and --summary-json). With a Prefect API configured (a server, a
worker, a deployment) every command is a flow run there, as is any work past these (training, a large table).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from trainflow.config import Config, infer_format
from trainflow.errors import DataError
from trainflow.tables.sources import resolve_snapshot, snapshot_bytes, source, source_dataset
from trainflow.tables.columns import check_names
from trainflow.tables.files import (
    INFERENCE_INPUT,
    check_present,
    did_you_mean,
    list_files,
    open_dataset,
    table_dataset,
)
from trainflow.run.locks import prefect_server_configured


def run_here(command: str, config: Config, args: argparse.Namespace) -> dict[str, Any] | None:
    """The command's summary when it was small work done here; None when it needs the flow run (Prefect and Ray)."""
    if (
        prefect_server_configured()
        or command not in ("predict", "retrain", "validate")
        or (command == "retrain" and args.force)
    ):
        return None
    if command == "predict" and config.inference.input and not scored_in_process(config):
        return None  # (predict without inference.input: refused here, at once)
    # the tasks log to trainflow.<task> outside Prefect: at INFO, Prefect's console handler shows them as in a flow run
    logger = logging.getLogger("trainflow")
    level = logger.level
    logger.setLevel(logging.INFO)
    summary = None
    try:
        summary = _small_work(command, config, args)
    finally:
        if summary is None:  # the flow run shows its own lines
            logger.setLevel(level)
    return summary


def _small_work(command: str, config: Config, args: argparse.Namespace) -> dict[str, Any] | None:
    if command == "validate":  # every check, nothing trained: Ray only where a step reads through it
        from trainflow.flows.validate import checks

        return checks(config, in_flow=False)
    if command == "predict":
        from trainflow.flows.predict import score

        return score(config, args.model, in_flow=False)
    fingerprint = small_table_fingerprint(config)
    if fingerprint is None:
        return None
    from trainflow.tasks.run_name import resolve_run_name
    from trainflow.tasks.skip import check_unchanged

    skipped = check_unchanged.fn(config, fingerprint)
    # a skip scores inference.input with the champion: here when that table is small, else in the flow (a retrain
    # with work to do never reads the scoring table's size: its flow starts the sooner)
    if not skipped or (config.inference.input and not scored_in_process(config)):
        return None
    from trainflow.flows.predict import skipped_run  # (the scoring steps' imports: seconds, paid by a skip alone)

    return skipped_run(config, resolve_run_name.fn(args.run_name), skipped, in_flow=False)


def scored_in_process(config: Config) -> bool:
    """Whether inference.input is scored in this process (tasks/infer.py's rule)."""
    from trainflow.tasks.common import scored_here, scoring_table_bytes

    try:
        return scored_here(config, scoring_table_bytes(config))
    except Exception:  # noqa: BLE001 - a missing or unreadable table is reported by the flow, which names it
        return False


def trained_in_process(config: Config) -> bool:
    """Whether a retrain of config needs no Ray: its table is read by this process (tasks/ingest.py) and small enough
    that each fit trains in Ray Train's local mode (trainflow/run/runtime.py in_process, the fits' own rule, for the
    one worker tasks/cross_fit.py train_config gives a family), and its scoring table is scored here. The CLI then
    starts no Ray beside Prefect's server (a step that needs Ray after all starts it then: ensure_ray)."""
    from trainflow.limits import LOCAL_MAX_ROWS
    from trainflow.roles.folds import AUTO_FOLD_ROWS
    from trainflow.run.runtime import in_process
    from trainflow.tables.files import IN_PROCESS_BYTES, in_memory_bytes, list_files

    scaling, data = config.scaling, config.data
    # scaling.num_workers unset: one worker a family, but for explicit folds of a table past AUTO_FOLD_ROWS
    unset = "num_workers" not in scaling.model_fields_set
    fit = scaling.model_copy(update={"num_workers": 1}) if unset else scaling
    most_rows = AUTO_FOLD_ROWS if unset and config.train.folds not in ("auto", 1) else LOCAL_MAX_ROWS
    if (
        data.materialize == "never"  # streamed through Ray Data
        or not in_process(config, fit, 0, True)
        or not getattr(source(data.format), "reads_here", False)
        or (config.inference.input and not scored_in_process(config))
    ):
        return False
    try:
        fs, files = list_files(data.path, data.format)
        if in_memory_bytes(fs, files, data.format) > IN_PROCESS_BYTES:
            return False
        return open_dataset(data.path, data.format, data.csv, (fs, files)).count_rows() <= most_rows
    except Exception:  # noqa: BLE001 - an unreadable table is reported by the flow, which names it
        return False


def small_table_fingerprint(config: Config) -> str | None:
    """The training table's fingerprint as ingest computes it for a table that fits in memory (its bytes), from the
    files alone; None for a table ingest may stream (fingerprinted by metadata, as the object store's size decides)."""
    from trainflow.tables.files import IN_PROCESS_BYTES, fingerprint, in_memory_bytes, list_files

    data = config.data
    kind = source(data.format).kind
    if kind == "snapshot":  # a Delta or Iceberg table: from its snapshot, at any size
        return resolve_snapshot(data).fingerprint
    if kind == "query" or data.materialize == "never":  # a query's rows: known once the run copied them
        return None
    fs, files = list_files(data.path, data.format)
    if in_memory_bytes(fs, files, data.format) > IN_PROCESS_BYTES:
        return None
    return fingerprint(fs, files, content=True, fmt=data.format, csv=data.csv)


def preflight(config: Config, run_name: str | None = None, unlabelled_ok: bool = False) -> None:
    """What the files' metadata can tell before Ray or Prefect start (Parquet footers, a CSV's header and first
    block): the training table and the scoring table hold the columns the config names. DataError naming the file,
    the column and the closest name; the flow checks the rest (types, values) as before. A PostgreSQL source: the
    query's columns from the server, or the copy run_name's first attempt made (read without the server).
    unlabelled_ok: rows without a label are no mistake (a replay leaves them out and counts them)."""
    copied = None
    if source(config.data.format).kind == "query":  # (tasks.ingest imports Prefect, Ray Data and torch: not needed)
        from trainflow.tasks.ingest import recorded_copy

        copied = recorded_copy(config, run_name)
    data = config.data.as_copy(copied) if copied else config.data
    names = list(table_dataset(data).schema.names)
    check_names(names, data.where)
    check_present(names, data, data.where)
    for key in ("time_column", "group_column"):
        column = getattr(config.split, key)
        if column is not None and column not in names:
            raise DataError(
                f"{data.where}: split.{key} {column!r} is not a column; {did_you_mean(column, names)}columns are {names}"
            )
    missing = [c for c in config.promotion.slices if c not in names]
    if missing:
        raise DataError(
            f"{data.where}: promotion.slices names column(s) {missing} that the table lacks; "
            f"{did_you_mean(missing[0], names)}columns are {names}"
        )
    check_label_values(config, unlabelled_ok)
    inp = config.inference.input
    if inp:
        fmt = infer_format(inp)
        scored = list(open_dataset(inp, fmt, data.csv, list_files(inp, fmt, INFERENCE_INPUT)).schema.names)
        features = data.default_features(names)
        wanted = features + ([data.id_column] if data.id_column else [])
        missing = [c for c in wanted if c not in scored]
        if missing:
            raise DataError(
                f"inference input {inp}: column(s) {missing} not found; {did_you_mean(missing[0], scored)}"
                f"columns are {scored}"
            )


def check_label_values(config: Config, unlabelled_ok: bool = False) -> None:
    """A training table small enough for this process (tables.IN_PROCESS_BYTES): the label's values against the task,
    from the label column alone, in a second: missing values (unless unlabelled_ok: then the labelled rows are
    checked), one class, classes too small to learn, a regression label of two values. Ingest, the split and the fit
    check the same on any table, in the flow."""
    import pyarrow.compute as pc

    from trainflow.data import count_rows_and_bad_labels
    from trainflow.roles.folds import check_class_sizes, label_unfit_for_task
    from trainflow.tables.files import IN_PROCESS_BYTES, in_memory_bytes, list_files

    data = config.data
    kind = source(data.format).kind
    if kind == "query":  # the label's values are checked on the run's copy (ingest)
        return
    if kind == "snapshot":  # a Delta or Iceberg table: its snapshot's size and label column
        snap = resolve_snapshot(data)
        if data.materialize == "never" or snapshot_bytes(snap) > IN_PROCESS_BYTES:
            return
        table = source_dataset(data, snap).to_table(columns=[data.label])
    else:
        fs, files = list_files(data.path, data.format)
        if data.materialize == "never" or in_memory_bytes(fs, files, data.format) > IN_PROCESS_BYTES:
            return
        table = open_dataset(data.path, data.format, data.csv, (fs, files)).to_table(columns=[data.label])
    rows, bad = count_rows_and_bad_labels(table, data.label)  # ingest's count
    if rows == 0:
        raise DataError(f"{data.path}: the table has no rows")
    if bad and unlabelled_ok:
        import pyarrow as pa

        from trainflow.data import has_label

        table = table.filter(pa.array(has_label(table, data.label)))
        rows, bad = table.num_rows, 0
    values = table[data.label]
    if bad:
        raise DataError(
            f"{data.path}: label column {data.label!r} has {bad} missing, NaN or infinite value(s) out of "
            f"{rows} rows; drop or fix those rows"
        )
    found = pc.value_counts(values)
    counts = dict(zip(map(str, found.field("values").to_pylist()), found.field("counts").to_pylist()))
    classes = config.task == "classification"
    if len(counts) < (2 if classes else 3):  # one class; a "quantity" of one or two values
        raise label_unfit_for_task(
            data.path,
            data.label,
            config.task,
            f"its {rows:,} rows",
            str(list(counts)) if classes else ", ".join(counts),
        )
    if classes:
        check_class_sizes(data.path, data.label, counts)
