"""Process-level setup done inside the functions that need it, never at import."""

from __future__ import annotations

import logging
import os

import ray


def ensure_ray(address: str | None = None) -> None:
    """Join RAY_ADDRESS/address if given, else start a local Ray; no-op when already connected."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    # Workers must import trainflow's packages from wherever the driver runs.
    ray.init(
        address=address,
        include_dashboard=False,
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
