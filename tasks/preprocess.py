"""Task: fit the preprocessor on the training split only, then pack both splits into tensors."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from prefect import task
from prefect.cache_policies import NO_CACHE

from trainflow.preprocessors.tabular import TabularPreprocessor
from trainflow.tasks.common import retry_unless_user_error, task_logger, scored_here
from trainflow.tasks.values import Ingested, Split, Prepared
from trainflow.tasks.warm import resolve_warm
from trainflow.config import Config, infer_format
from trainflow.errors import ConfigError, DataError
from trainflow.run.redact import redact_text
from trainflow.trainer.families import family_for
from trainflow.trainer.loop import class_weights
from trainflow.data import read_table
from trainflow.preprocessors.fit import check_unseen, count_unseen, fit_preprocessor, pack
from trainflow.run.runtime import cluster_resources, ensure_ray
from trainflow.tables.files import INFERENCE_INPUT, in_memory_bytes, list_files, read_arrow
from trainflow.trainer.memory import is_out_of_memory, out_of_memory_error


def _unseen_in_scoring_table(config: Config, prep: TabularPreprocessor) -> dict[str, dict]:
    """count_unseen over inference.input: read by this process where infer scores it here, else by Ray Data."""
    inp = config.inference.input
    fmt = infer_format(inp)
    fs, files = listed = list_files(inp, fmt, INFERENCE_INPUT)
    if scored_here(config, in_memory_bytes(fs, files, fmt)):
        return count_unseen(read_arrow(fs, files, fmt, config.data.csv, inp), prep)
    ensure_ray(**config.ray_start)
    return count_unseen(read_table(inp, fmt, listed=listed, csv=config.data.csv)[0], prep)


def _kept_where(rows, materialize: bool) -> str:
    if isinstance(rows, pa.Table):
        return "held in this process (a worker group's fit puts it in the object store)"
    return "materialized in the object store" if materialize else "streamed from the files each epoch"


@task(
    name="preprocess",
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=retry_unless_user_error,
    cache_policy=NO_CACHE,
)
def preprocess(
    ingested: Ingested,
    parts: Split,
    config: Config,
    packed: bool = True,
    warm: bool = True,
    workers: int | None = None,
) -> Prepared:
    """Fit on train (with folds: every non-test row; the preprocessor learns no label), transform train and
    validation (or each fold's rows); materialize when the packed data fits in memory. A small table's rows (tables
    in this process's memory) are fitted on and transformed here. packed=False: the fit and every family's checks
    only (validate), with train and val left None. warm=False: train.warm_start does not apply (a sweep's trials).
    workers: the workers each family's fit will have (a small table's: one), where not scaling.num_workers: its
    budget and memory plan count them."""
    prep = fit_preprocessor(parts.train, ingested.spec, config.task, config.preprocess)
    # train.warm_start: a continuation packs with the source model's fitted preprocessing (tasks/warm.py)
    prep, started = resolve_warm(config, prep, parts.fold_count) if packed and warm else (prep, None)
    if config.inference.input and config.inference.on_unseen == "error":
        # before any training: a scoring value this vocabulary lacks would fail the run after register and promote
        check_unseen(_unseen_in_scoring_table(config, prep), prep, config.inference.input)
    k = parts.fold_count
    fold_rows = parts.plan.fold_rows() if k > 1 and parts.plan is not None else []
    # cross-fitted, each family is sized for its largest fold model: the most training and the most held-out rows
    fit_rows, held_rows = (
        (parts.train_rows - min(fold_rows), max(fold_rows)) if fold_rows else (parts.train_rows, parts.val_rows)
    )
    budgets, estimate, left_out = size_families(
        config, prep, fit_rows, held_rows, cluster_resources().get("memory", 0), ingested.spec.path, workers
    )
    rows = parts.train_rows + parts.val_rows
    materialize = parts.materialized
    folds, train, val = None, None, None
    if packed and not isinstance(parts.train, pa.Table):
        ensure_ray(**config.ray_start)  # Ray Data packs the rows (a table in memory is packed here, without Ray)
    try:
        if packed and parts.folds:
            folds = [pack(a, b, prep, materialize) for a, b in parts.folds]
            train, val = folds[0]
        elif packed:
            train, val = pack(parts.train, parts.val, prep, materialize)
    except Exception as exc:
        if is_out_of_memory(exc):
            raise out_of_memory_error("preprocessing", config.scaling.workers_label) from None
        raise
    task_logger("preprocess").info(
        "preprocessor: %d input columns -> %d features (%d one-hot, %d embedded: %s; %d date column(s))%s; training set %s",
        len(prep.feature_order),
        prep.num_features,
        len(prep.categorical),
        len(prep.embedded),
        {c: f"{len(s['categories'])} values, dim {s['dim']}" for c, s in prep.embedded.items()},
        len(prep.dates),
        f", classes {prep.classes}" if prep.classes is not None else "",
        ("" if packed else "to be ") + _kept_where(parts.train, materialize),
    )
    task_logger("preprocess").info(
        "packed size: %d bytes per row, %.1f MiB for %d rows",
        estimate["bytes_per_row"],
        estimate["table_bytes"] / 2**20,
        rows,
    )
    return Prepared(
        prep, train, val, materialize, budgets, ingested.spec.fingerprint, left_out, folds, fold_rows, started, rows
    )


def size_families(
    config: Config,
    prep: TabularPreprocessor,
    train_rows: int,
    val_rows: int,
    memory: float,
    source: str,
    workers: int | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """Each family's budget, after its checks (a user's module builds; class weights; its training data fits a
    worker's share of the cluster's memory): (budgets, the last memory estimate, left out). Under model.type auto
    a family whose data does not fit is left out with the reason (a booster's in-memory matrices on a table the
    network streams), as long as one family remains; a family named in model.type fails the run instead. train_rows:
    the rows a fit trains on (cross-fitted: the largest fold model's); workers: as preprocess's."""
    workers = workers or config.scaling.max_workers
    budgets, estimate, left_out, refused = {}, None, {}, None
    for name in config.model.families:
        resolved = config.for_family(name)
        family = family_for(resolved)
        try:
            family.check(
                prep, resolved.model.model_dump(mode="json")
            )  # a user's module fails here, before any training
            class_weights(config.train, prep)  # the loop's own check, before any worker starts
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if config.train.class_weight is not None and not family.class_weights:
            task_logger("preprocess").warning(
                "%s: train.class_weight is not applied (the torch families' loss takes it); its "
                "probabilities are still calibrated (calibration.method)",
                name,
            )
        budget = family.budget(resolved, train_rows, workers)
        try:
            fits, budget = family.plan_memory(prep, resolved, budget, (train_rows, val_rows), workers, memory, source)
        except DataError as exc:
            if not config.model.auto:
                raise
            # the message names data.path: a URI's credentials masked before it is logged or summarized
            left_out[name], refused = redact_text(str(exc)), refused or exc
            task_logger("preprocess").warning(
                "model.type auto: %s left out, its training data does not fit: %s", name, left_out[name]
            )
            continue
        if fits.get("external_memory"):
            task_logger("preprocess").info(
                "%s: external-memory matrices (model.params.external_memory %s; in memory a worker would hold "
                "about %.1f GiB of its %.1f GiB share): each worker writes its shard to local disk a batch at a time",
                name,
                resolved.model.params.external_memory,
                fits["worker_matrix_bytes"] / 2**30,
                memory / max(1, workers) / 2**30,
            )
        budgets[name], estimate = budget, fits
    if not budgets:
        raise refused
    return budgets, estimate, left_out
