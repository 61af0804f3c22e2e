"""The retrain flow: ingest -> split -> preprocess -> train -> select -> register -> promote -> infer -> summary."""

from __future__ import annotations

from typing import Any

from prefect import flow

from tasks.infer import infer
from tasks.ingest import ingest
from tasks.preprocess import preprocess
from tasks.promote import promote
from tasks.register import register
from tasks.report import report
from tasks.run_name import resolve_run_name
from tasks.select import select
from tasks.split import split
from tasks.summary import summarize
from tasks.train import train
from trainflow.config import load_config


@flow(name="retrain", log_prints=True)
def retrain(config_path: str, overrides: dict[str, Any] | None = None, run_name: str | None = None) -> dict[str, Any]:
    """Train, select, register and predict from one config file; returns the run summary."""
    config = load_config(config_path, overrides)
    name = resolve_run_name(run_name)
    ingested = ingest(config)
    parts = split(ingested, config)
    prepared = preprocess(ingested, parts, config)
    outcome = train.with_options(
        retries=config.failure.task_retries, retry_delay_seconds=config.failure.retry_delay_s
    )(prepared, config, name)
    selected = select(outcome, config)
    registered = register(config, ingested, outcome, selected)
    promotion = promote(config, parts.val, selected, registered)
    predictions = None
    if config.inference.input:
        # predictions always come from the champion after the gate: a rejected challenger never serves
        predictions = infer(promotion.serving_checkpoint, config)
    summary = summarize(ingested, parts, outcome, selected, registered, promotion, predictions)
    report(config, outcome.history, summary)
    return summary
