"""The retrain flow: ingest -> split -> preprocess -> train -> select -> register -> infer -> summary."""

from __future__ import annotations

from typing import Any

from prefect import flow

from tasks.infer import infer
from tasks.ingest import ingest
from tasks.preprocess import preprocess
from tasks.register import register
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
    outcome = train(prepared, config, name)
    selected = select(outcome, config)
    registered = register(config, ingested, outcome, selected)
    predictions = None
    if config.inference.input:
        predictions = infer(
            selected.path, config.inference.input, config.inference.output, config.data.id_column,
            config.inference.batch_size, config.inference.num_actors,
        )
    return summarize(ingested, outcome, selected, registered, predictions)
