"""Task: the Ray Train run name, stable across Prefect retries of the same flow run."""

from __future__ import annotations

import re

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from trainflow.errors import ConfigError

VALID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@task(name="run-name", cache_policy=NO_CACHE)
def resolve_run_name(requested: str | None, prefix: str = "retrain") -> str:
    """The requested name, or one derived from the flow run's id (the same on every retry of that run)."""
    if requested is not None:
        if not VALID.match(requested):
            raise ConfigError(f"run name {requested!r}: use letters, digits, '.', '_' or '-' (at most 128)")
        return requested
    run_id = flow_run.get_id() or ""
    started = flow_run.get_scheduled_start_time()
    stamp = started.strftime("%Y%m%d-%H%M%S") if started else "local"
    return f"{prefix}-{stamp}-{str(run_id)[:8]}"
