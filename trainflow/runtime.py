"""Process-level setup done inside the functions that need it, never at import."""

from __future__ import annotations

import logging
import os

import ray


def ensure_ray(address: str | None = None, runtime_env: dict | None = None) -> None:
    """Join the cluster at address (ray.address / RAY_ADDRESS) if given, else start a local Ray.

    A no-op when this process is already connected. On an existing cluster every node must be
    able to import trainflow (installed there, or shipped with runtime_env={"working_dir": ...}).
    """
    if ray.is_initialized():
        return
    ray.init(
        address=address,
        runtime_env=runtime_env,
        # Ray Train's PlacementGroupCleaner frees a killed run's resources through the state API, which
        # the dashboard serves: without it a Tune trial stopped early leaks its workers' placement group.
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        log_to_driver=os.environ.get("TRAINFLOW_RAY_LOGS", "0") == "1",
        logging_level=logging.WARNING,
        configure_logging=True,
    )
    quiet_ray_data()


def quiet_ray_data() -> None:
    """Ray Data prints progress for every dataset; keep the driver's output readable."""
    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    for name in ("ray.data", "ray.train", "ray.tune"):
        logging.getLogger(name).setLevel(logging.WARNING)
