"""Process-level setup done inside the functions that need it, never at import."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import ray

log = logging.getLogger(__name__)
_START_LOCK = threading.Lock()  # one ray.init at a time: the background start and a task's ensure_ray may race


# Ray Train's controller polls its workers every 2 s by default, and reports, failures and the end of a run
# wait for the next poll: at 0.5 s a TorchTrainer.fit of the demo took 22-24 s instead of 32-35 s (measured
# here). The job's runtime_env carries it to the controller, locally and on an existing cluster.
TRAIN_ENV_DEFAULTS = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}
# Only for a Ray this process starts itself: its one node is never drained by an autoscaler, so Ray
# Train's preemption watcher (an extra actor process in every fit, polling Ray's drain state) has
# nothing to watch. Measured here: a 2-worker fit 15.2 s without it vs 16.2 s with it (8 fits each).
# On an existing cluster (ray.address or RAY_ADDRESS) Ray's default, on, is kept.
LOCAL_TRAIN_ENV_DEFAULTS = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}


def ensure_ray(address: str | None = None, runtime_env: dict | None = None, num_cpus: int | None = None) -> None:
    """Join the cluster at address (ray.address / RAY_ADDRESS) if given, else start a local Ray.

    A no-op when this process is already connected. On an existing cluster every node must be
    able to import trainflow (installed there, or shipped with runtime_env={"working_dir": ...}).
    """
    with _START_LOCK:
        if not ray.is_initialized():
            _init(address, runtime_env, num_cpus)


def _init(address: str | None, runtime_env: dict | None, num_cpus: int | None) -> None:
    runtime_env = dict(runtime_env or {})
    defaults = dict(TRAIN_ENV_DEFAULTS)
    if address is None and not os.environ.get("RAY_ADDRESS"):
        defaults.update(LOCAL_TRAIN_ENV_DEFAULTS)
    runtime_env["env_vars"] = {**defaults, **(runtime_env.get("env_vars") or {})}
    ray.init(
        address=address,
        runtime_env=runtime_env,
        num_cpus=num_cpus,
        # Ray Train's PlacementGroupCleaner frees a killed run's resources through the state API, which
        # the dashboard serves: without it a Tune trial stopped early leaks its workers' placement group.
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        log_to_driver=os.environ.get("TRAINFLOW_RAY_LOGS", "0") == "1",
        logging_level=logging.WARNING,
        configure_logging=True,
    )
    configure_ray_data()


class _NoThreadSigtermWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


_NO_THREAD_SIGTERM_WARNING = _NoThreadSigtermWarning()


def start_ray_in_background(address: str | None = None, runtime_env: dict | None = None) -> threading.Thread:
    """Start (or join) Ray on a daemon thread, so it comes up while the caller imports Prefect and
    Prefect starts its temporary server (one after the other they took 9 s and 13.5 s of `make demo`;
    interleaved demo runs: 42.5-45.7 s with this, 45.3-50.6 s without).

    The tasks still call ensure_ray, which waits for this start (one lock) and is a no-op after it.
    Best effort: if this start fails, the error is logged at debug level and the first task's
    ensure_ray tries again and raises it where Prefect reports it. ray.init installs its SIGTERM
    handler (exit, so Ray shuts down cleanly) only from the main thread, so it is installed here.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
        logging.getLogger("ray._private.worker").addFilter(_NO_THREAD_SIGTERM_WARNING)  # added once: addFilter skips a filter already there

    def start() -> None:
        try:
            ensure_ray(address, runtime_env)
        except Exception as exc:  # noqa: BLE001 - retried, and reported, by the first task's ensure_ray
            log.debug("starting Ray in the background failed; the first task retries: %s", exc)
            return
        # A local Ray's GCS and raylet are forked with PR_SET_PDEATHSIG, which fires when the forking
        # *thread* ends (measured: they died with this thread and the driver lost its GCS); so this
        # thread lives as long as the process. ray.shutdown at exit stops them as usual.
        threading.Event().wait()

    thread = threading.Thread(target=start, name="trainflow-ray-start", daemon=True)
    thread.start()
    return thread


def configure_ray_data() -> None:
    """Ray Data settings for this driver: readable output, task-based shuffles and Parquet reads.

    Ray 2.60 defaults to hash shuffles served by aggregator actors; on a small cluster their start-up
    dominates (measured here: a first aggregate 3.3 s vs 0.9 s, a first random_shuffle 1.4 s vs 0.1 s
    with the sort-based pull shuffle). Set RAY_DATA_DEFAULT_SHUFFLE_STRATEGY to choose another.

    Ray 2.60 also routes read_parquet through DataSourceV2, whose listing step waits for footer-reader
    actors to start on every read: a 500-row file took 1.9-3.6 s to read and materialize on a warm Ray,
    0.2-0.8 s through the V1 reader (measured here). Set RAY_DATA_USE_DATASOURCE_V2=1 to keep V2.
    The V1 reader cuts a table into at least read_op_min_num_blocks=200 blocks, sized for large
    clusters: 2M rows x 16 columns became 200 blocks of 10k rows, and fitting the preprocessor on them
    took 7-9.6 s instead of 1.0-2.4 s. With the floor at 1, Ray's own rules decide: at least 2 blocks
    per CPU of the cluster, and blocks of at most target_max_block_size (128 MiB).
    """
    from ray.data import DataContext
    from ray.data.context import DEFAULT_READ_OP_MIN_NUM_BLOCKS, ShuffleStrategy

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    if "RAY_DATA_DEFAULT_SHUFFLE_STRATEGY" not in os.environ:
        ctx.shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    if "RAY_DATA_USE_DATASOURCE_V2" not in os.environ:
        ctx.use_datasource_v2 = False
    if ctx.read_op_min_num_blocks == DEFAULT_READ_OP_MIN_NUM_BLOCKS:
        ctx.read_op_min_num_blocks = 1
    for name in ("ray.data", "ray.train", "ray.tune"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # this module's one warning says the progress bars are off, which is set above on purpose
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)
