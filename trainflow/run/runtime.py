"""Process-level setup done inside the functions that need it, never at import."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import ray

if TYPE_CHECKING:
    from trainflow.config import Config, ScalingSection

from trainflow import pacing

log = logging.getLogger(__name__)
_START_LOCK = threading.Lock()  # one ray.init at a time: the background start and a task's ensure_ray may race


# Ray Train's controller polls its workers every 2 s by default, and reports, failures and the end of a run
# wait for the next poll; polling at 0.5 s makes short fits markedly shorter (docs/performance.md). On an existing
# cluster the job's runtime_env carries it to the controller; a local Ray's processes have it from their start.
TRAIN_ENV_DEFAULTS = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}
# Only for a Ray this process starts itself: its one node is never drained by an autoscaler, so Ray
# Train's preemption watcher (an extra actor process in every fit, polling Ray's drain state) has
# nothing to watch, and it costs every fit a process. Its few workers are polled every 0.05 s: every
# report waits for a poll (Ray Train's result queue holds one), so a small table's 35 fold reports took 7.4 s at
# 0.2 s; the poll costs 0.015 / 0.054 more of a core than at 0.2 s with 1 / 2 workers (docs/performance.md); a
# cluster's many workers keep the 0.5 s poll.
# On an existing cluster (ray.address or RAY_ADDRESS) the watcher keeps Ray's default (on) and the poll 0.5 s.
LOCAL_TRAIN_ENV_DEFAULTS = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.05"}
# where a Ray worker process finds its worker_process_setup_hook at its start (ray._private.ray_constants)
SETUP_HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"


class _KnownNotice(logging.Filter):
    """Drops a notice Ray prints on every local start that asks nothing of the user (docs/operations.md says it once):
    its local cluster turns token authentication on by itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


def node_id() -> str | None:
    """This process's Ray node, or None in a process Ray is not started in (a small table's fit in Ray Train's
    local mode needs none)."""
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def cluster_named(address: str | None) -> bool:
    """Whether a run joins an existing cluster (ray.address, else RAY_ADDRESS) rather than starting its own Ray."""
    return bool(address or os.environ.get("RAY_ADDRESS"))


def in_process(config: Config, scaling: ScalingSection, rows: int, materialized: bool) -> bool:
    """Whether a fit of one worker group of `scaling` (a family's worker_scaling, or a shared run's) runs in Ray
    Train's local mode, as scaling.local_mode of the run's config says; rows: the table's non-test rows. (Here, below
    Ray Train's imports: the CLI asks it before the services start, flows/local.py trained_in_process.)"""
    from trainflow.limits import LOCAL_MAX_ROWS

    mode = config.scaling.local_mode
    if mode is False or scaling.elastic or scaling.num_workers != 1:
        return False
    if mode is True:
        return True
    return (
        materialized
        and rows <= LOCAL_MAX_ROWS
        and not (scaling.use_gpu or scaling.wait_for_resources or scaling.env_vars)
        and not cluster_named(config.ray.address)
    )


def nodes() -> list[dict[str, float]]:
    """Each alive node's resources (CPU, GPU, memory, object_store_memory ...): the connected Ray's; with none
    connected, the one node trainflow's own local Ray will be, as Ray resolves this machine when it starts (its
    CPUs, GPUs and memory), without starting it. A run on a named cluster joins it (ensure_ray) before asking."""
    if ray.is_initialized():
        return [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    return [dict(_local_node())]


def cluster_resources() -> dict[str, float]:
    """ray.cluster_resources(), or before trainflow's own local Ray starts, what it will have (nodes())."""
    return ray.cluster_resources() if ray.is_initialized() else dict(_local_node())


@functools.cache
def _local_node() -> dict[str, float]:
    from ray._private.resource_and_label_spec import ResourceAndLabelSpec  # what ray.init resolves for its node

    return ResourceAndLabelSpec().resolve(is_head=True, node_ip_address="127.0.0.1").to_resource_dict()


def ensure_ray(
    address: str | None = None,
    runtime_env: dict | None = None,
    num_cpus: int | None = None,
    object_store_memory: int | None = None,
    worker_env: dict[str, str] | None = None,
    temp_dir: str | None = None,
) -> None:
    """Join the cluster at address (ray.address / RAY_ADDRESS) if given, else start a local Ray (of num_cpus
    CPUs and an object store of object_store_memory bytes, when given: benchmarks and tests).

    A local Ray keeps its session folder (logs, sockets, spilled objects) in a private folder (mode 0700): temp_dir
    (ray.temp_dir), kept, or a new one that goes when Ray stops. Its processes inherit worker_env (scaling.env_vars)
    and runtime_env's env_vars from this process's environment at the start, so no Ray log holds their values
    (Ray's runtime-env agent logs every runtime_env it sets up, in plain text).

    A no-op when this process is already connected. On an existing cluster every node must be
    able to import trainflow (installed there, or shipped with runtime_env={"working_dir": ...}).
    """
    with _START_LOCK:
        if not ray.is_initialized():
            _init(address, runtime_env, num_cpus, object_store_memory, worker_env, temp_dir)


# what the local Ray this process started carries in its processes' environment (scaling.env_vars and the
# runtime_env's env_vars): a fit passes on only what is not there already (carried_env)
_CARRIED: dict[str, str] = {}
_OWN_TEMP: list[str] = []  # the private session folder this process made for its local Ray (removed on stop)


def carried_env() -> dict[str, str]:
    """The environment variables every process of this process's own local Ray has from its start."""
    return dict(_CARRIED) if ray.is_initialized() else {}


_OWN_PREFIX = "trainflow-ray-"  # tempfile.mkdtemp adds 8 characters


def private_temp_dir(temp_dir: str | None) -> str:
    """A folder only this user can read for a local Ray's session: temp_dir (created 0700 when missing; an existing
    one must not be readable by others), else a new one under the system's temporary folder (or /tmp, where that
    one's path is too long for Ray's socket paths under it)."""
    import stat
    import tempfile

    from trainflow.errors import ConfigError
    from trainflow.limits import ray_folder_refusal

    if temp_dir:
        path = os.path.abspath(os.path.expanduser(temp_dir))
        if refused := ray_folder_refusal(path):
            raise ConfigError(f"ray.temp_dir {refused}")
        os.makedirs(path, mode=0o700, exist_ok=True)
        if os.stat(path).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"ray.temp_dir {path}: readable by other users (mode {stat.S_IMODE(os.stat(path).st_mode):o});"
                " Ray's logs there may hold secrets: chmod 700 it or name another folder"
            )
        return path
    base = tempfile.gettempdir()
    if ray_folder_refusal(os.path.join(base, _OWN_PREFIX + "x" * 8)):
        log.info(
            "the temporary folder %s is too long for Ray's socket paths: the local Ray's folder goes in /tmp", base
        )
        base = "/tmp"
    path = tempfile.mkdtemp(prefix=_OWN_PREFIX, dir=base)  # mode 0700
    if not _OWN_TEMP:
        import atexit

        atexit.register(stop_ray)  # Ray stopped first, then the folder goes (also after a test's own ray.shutdown)
    _OWN_TEMP.append(path)
    return path


def _init(
    address: str | None,
    runtime_env: dict | None,
    num_cpus: int | None,
    object_store_memory: int | None = None,
    worker_env: dict[str, str] | None = None,
    temp_dir: str | None = None,
) -> None:
    runtime_env = dict(runtime_env or {})
    defaults = dict(TRAIN_ENV_DEFAULTS)
    address = address or os.environ.get("RAY_ADDRESS") or None
    carried: dict[str, str] = {}
    extra: dict = {}
    if not cluster_named(address):
        defaults.update(LOCAL_TRAIN_ENV_DEFAULTS)
        # With no address, ray.init joins whatever /tmp/ray/ray_current_cluster names (the last `ray start`
        # or ray.cluster_utils head on this machine), even a dead one: it then hangs on the dead GCS, or
        # refuses num_cpus. trainflow's default is its own Ray; a cluster is joined only when named.
        address = "local"
        # Everything this Ray's processes need reaches them through the environment it starts with, not through a
        # job runtime_env: Ray's agent writes a runtime_env to its log (the user's values), and with one every
        # worker process starts through a runtime-env wrapper process (setup_worker.py), another Python start
        # (16 actors started in 16.9 core-s against 12.2 without, docs/performance.md). trainflow's Train settings
        # (where this environment has none of its own), then the user's env vars, then Ray's setup hook: a hook of
        # the user's own (ray.runtime_env) wins, else streamed pipelines run Ray's unpaced loop (trainflow/pacing.py)
        carried = {k: v for k, v in defaults.items() if k not in os.environ}
        carried.update({**(runtime_env.pop("env_vars", None) or {}), **(worker_env or {})})
        if "worker_process_setup_hook" not in runtime_env:
            carried[SETUP_HOOK_ENV] = pacing.HOOK
        # Ray opens its own folder to everyone (0777): it lives inside the private one, which nobody else can enter
        extra["_temp_dir"] = os.path.join(private_temp_dir(temp_dir), "ray")
    else:  # a cluster's processes started long before: the job's runtime_env carries the settings
        runtime_env["env_vars"] = {**defaults, **(runtime_env.get("env_vars") or {})}
        runtime_env.setdefault("worker_process_setup_hook", pacing.HOOK)
    if address == "local":
        logging.getLogger("ray._private.authentication.authentication_token_setup").addFilter(_KnownNotice())
    with _environment(carried):
        context = _ray_init(address, runtime_env, num_cpus, object_store_memory, extra)
    _CARRIED.clear()
    _CARRIED.update(carried)
    if context.dashboard_url:
        print(f"trainflow: Ray dashboard at http://{context.dashboard_url}", file=sys.stderr, flush=True)
    configure_ray_data()


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """values in os.environ while the block runs (the local Ray's processes start inside it), then as before."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _ray_init(address: str, runtime_env: dict, num_cpus: int | None, object_store_memory: int | None, extra: dict):
    return ray.init(
        address=address,
        runtime_env=runtime_env,
        num_cpus=num_cpus,
        object_store_memory=object_store_memory,
        # Ray Train's PlacementGroupCleaner frees a killed run's resources through the state API, which
        # the dashboard serves: without it a Tune trial stopped early leaks its workers' placement group.
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        log_to_driver=os.environ.get("TRAINFLOW_RAY_LOGS", "0") == "1",
        logging_level=logging.WARNING,
        configure_logging=True,
        **extra,
    )


# Prefect cancels a flow run with SIGTERM. Raising from a handler (Ray's sys.exit, Prefect's
# TerminationSignal) lands inside whatever C call the main thread is in: a training run turned
# it into `SystemError(... returned a result with an exception set)`, which the train task's retry
# caught, and training went on (resumed) instead of stopping.
STOP_GRACE_S = 20.0
_stop_requested = threading.Event()


def stop_requested(exc: BaseException | None = None) -> bool:
    """Whether this process was asked to stop (SIGTERM), so nothing should be retried any more.

    During a flow run Prefect's own SIGTERM handler raises TerminationSignal wherever the main thread
    is; inside a Ray call that surfaces as another exception with the signal in its chain, so exc's
    chain is searched too.
    """
    if _stop_requested.is_set():
        return True
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, SystemExit) or type(exc).__name__ == "TerminationSignal":
            return True
        exc = exc.__cause__ or exc.__context__
    return False


_stop_lock = threading.RLock()  # a second SIGTERM may arrive inside the handler itself


def _on_sigterm(signum: int, frame: object) -> None:
    # called by the watcher thread and by the Python handler for the same signal: one stop only
    with _stop_lock:
        if _stop_requested.is_set():
            return
        _stop_requested.set()
    threading.Thread(target=_stop, name="trainflow-stop", daemon=True).start()


_watching = False


def plain_progress() -> None:
    """Progress bars only where a person watches a terminal: MLflow's artifact transfers draw tqdm bars, which in a
    worker's log or a file are hundreds of characters of noise per download. A user's
    MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR wins. (Ray Data's bars: configure_ray_data.)"""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "true" if sys.stderr.isatty() else "false")


def watch_for_sigterm() -> None:
    """React to SIGTERM at once, even while the main thread is blocked inside a Ray call.

    A Python signal handler runs only when the main thread returns to the interpreter, which a
    stalled or long `TorchTrainer.fit` never does (SIGTERM would be handled when the fit ended). The C-level handler writes every signal to the wakeup fd at once, so a thread
    reading it stops Ray, the blocked call fails, and the flow ends. Main thread only.
    """
    global _watching
    if _watching or threading.current_thread() is not threading.main_thread():  # once per process, main thread only
        return
    _watching = True
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    signal.signal(signal.SIGTERM, _on_sigterm)  # a Python handler must be set for the wakeup write

    def watch() -> None:
        while True:
            for signum in os.read(read_fd, 64):
                if signum == signal.SIGTERM:
                    _on_sigterm(signum, None)

    threading.Thread(target=watch, name="trainflow-sigterm-watch", daemon=True).start()


_shutdown_lock = threading.Lock()


def stop_ray() -> None:
    """Shut Ray down now: Ray Train's controller and workers go with their driver (best effort).
    One shutdown at a time: the stop thread and the CLI's exit path may both call this."""
    with _shutdown_lock:
        if ray.is_initialized():
            try:
                ray.shutdown()
            except Exception as exc:  # noqa: BLE001 - best effort on the way out
                log.debug("ray.shutdown on stop failed: %s", exc)
        remove_own_temp()


def remove_own_temp() -> None:
    """Remove the private session folders this process made for its local Ray (once that Ray stopped): its logs
    may hold what a user's code printed. A folder named by ray.temp_dir is the user's and stays."""
    import shutil

    while _OWN_TEMP:
        shutil.rmtree(_OWN_TEMP.pop(), ignore_errors=True)


def _stop() -> None:
    """Shut Ray down so every pending Ray call in the flow fails now (Ray Train's controller and workers
    go with their driver; checkpoints already reported stay, so a rerun with the same run name resumes),
    then, should the flow still be running after STOP_GRACE_S, end the process."""
    log.warning("SIGTERM: stopping; rerun with the same --run-name to resume from the latest checkpoint")
    stop_ray()
    threading.Event().wait(STOP_GRACE_S)
    os._exit(128 + signal.SIGTERM)


class _NoThreadSigtermWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


_NO_THREAD_SIGTERM_WARNING = _NoThreadSigtermWarning()


def start_ray_in_background(
    address: str | None = None,
    runtime_env: dict | None = None,
    worker_env: dict[str, str] | None = None,
    temp_dir: str | None = None,
) -> threading.Thread:
    """Start (or join) Ray on a daemon thread, so it comes up while the caller imports Prefect and
    Prefect starts its temporary server: both are seconds of CPU-bound start-up (docs/performance.md).

    The tasks still call ensure_ray, which waits for this start (one lock) and is a no-op after it.
    Best effort: if this start fails, the error is logged at debug level and the first task's
    ensure_ray tries again and raises it where Prefect reports it. ray.init installs its SIGTERM
    handler only from the main thread, so trainflow's own (`_on_sigterm`: stop Ray, retry nothing, end
    the run) is installed here.
    """
    if threading.current_thread() is threading.main_thread():
        watch_for_sigterm()
        logging.getLogger("ray._private.worker").addFilter(
            _NO_THREAD_SIGTERM_WARNING
        )  # added once: addFilter skips a filter already there

    def start() -> None:
        try:
            ensure_ray(address, runtime_env, worker_env=worker_env, temp_dir=temp_dir)
        except Exception as exc:  # noqa: BLE001 - retried, and reported, by the first task's ensure_ray
            log.debug("starting Ray in the background failed; the first task retries: %s", exc)
            return
        # A local Ray's GCS and raylet are forked with PR_SET_PDEATHSIG, which fires when the forking
        # *thread* ends (they would die with this thread and the driver lose its GCS); so this
        # thread lives as long as the process. ray.shutdown at exit stops them as usual.
        threading.Event().wait()

    thread = threading.Thread(target=start, name="trainflow-ray-start", daemon=True)
    thread.start()
    return thread


def start_prefect_server_in_background() -> threading.Thread | None:
    """Boot Prefect's temporary server (used when no PREFECT_API_URL is set) on a thread, so its process starts
    while this one imports the flow; join the thread before the flow runs. None when a server is configured.

    The server is trainflow's own (temporary_server): once it answers, the flow's client uses it through
    PREFECT_API_URL. If this start fails, the caller's start after the join tries again and raises the error.
    """
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return None

    def start() -> None:
        try:
            temporary_server().start()
        except Exception as exc:  # noqa: BLE001 - retried, and reported, by the flow's client
            log.debug("starting Prefect's temporary server in the background failed; the flow retries: %s", exc)

    thread = threading.Thread(target=start, name="trainflow-prefect-start", daemon=True)
    thread.start()
    return thread


# a temporary server's start runs its database migrations; on a loaded machine Prefect's 20 s default ran out (two
# CLI runs started together both failed): the start waits this long, one start per Prefect home at a time
SERVER_START_TIMEOUT_S = 120
_SPAWNER: list = []
_SPAWN_LOCK = threading.Lock()


def _spawn(popen):
    """popen() on one long-lived thread of this process: a child made with PR_SET_PDEATHSIG gets its signal when the
    thread that forked it ends, so every temporary server is forked by a thread that ends only with the process."""
    from concurrent.futures import ThreadPoolExecutor

    with _SPAWN_LOCK:
        if not _SPAWNER:
            _SPAWNER.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainflow-spawn"))
    return _SPAWNER[0].submit(popen).result()


def _die_with_parent() -> None:
    """In a forked child, before exec: SIGTERM when the forking thread (hence this process) dies, SIGKILL included."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class TemporaryServer:
    """Prefect's temporary server (the command Prefect's own SubprocessASGIServer runs, prefect/server/api/server.py),
    started by trainflow without importing Prefect's server into this process (its FastAPI app, 4-5 s of CPU that
    competed with this process's own imports and Ray's start): once it answers, this process's Prefect clients use
    it through PREFECT_API_URL, and `trainflow.run.locks.TEMPORARY_API` tells trainflow the URL is this server's, not one a user
    configured. A start that fails or times out stops the process it started (a retry never leaves one running);
    starts are serialized per Prefect home across processes (two CLI runs started together both come up: each new
    server migrates the home's one database); the server dies with this process however it ends (SIGTERM, SIGINT,
    SIGKILL: the kernel's parent-death signal; a normal exit: atexit)."""

    def __init__(self) -> None:
        self.port: int | None = None
        self.server_process: subprocess.Popen | None = None
        self._lock = threading.Lock()

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def running(self) -> bool:
        """Started, answering, and the API this process's Prefect clients use."""
        from trainflow.run.locks import TEMPORARY_API

        return self.server_process is not None and TEMPORARY_API == [self.api_url]

    def _command(self) -> list[str]:
        import prefect

        return [
            sys.executable,
            "-m",
            "uvicorn",
            "--app-dir",
            str(prefect.__module_path__.parent),
            "--factory",
            "prefect.server.api.server:create_app",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "error",
            "--lifespan",
            "on",
        ]

    def _spawn_server(self) -> subprocess.Popen:
        from prefect.settings import get_current_settings

        env = {
            **os.environ,
            "PREFECT_UI_ENABLED": "0",
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
            **get_current_settings().to_environment_variables(exclude_unset=True),
        }
        env.pop("PREFECT_API_URL", None)  # a restarted server's own, from this process's environment
        if not sys.platform.startswith("linux"):
            return subprocess.Popen(self._command(), env=env)
        return _spawn(lambda: subprocess.Popen(self._command(), env=env, preexec_fn=_die_with_parent))

    def start(self, timeout: int | None = None) -> None:
        """Start the server and wait until its health check answers (timeout: Prefect's
        server.ephemeral.startup_timeout_seconds, at least SERVER_START_TIMEOUT_S); a no-op once running."""
        import atexit
        import socket

        from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

        from trainflow.run.locks import TEMPORARY_API, exclusive

        with self._lock:
            if self.running:
                return
            wait = max(timeout or PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value(), SERVER_START_TIMEOUT_S)
            with exclusive("prefect-server", "start", timeout_s=2 * wait):
                with socket.socket() as probe:  # a free loopback port, as Prefect's own start picks one
                    probe.bind(("127.0.0.1", 0))
                    self.port = probe.getsockname()[1]
                logging.getLogger("prefect").info(
                    "Starting temporary server on http://127.0.0.1:%s\nSee "
                    "https://www.prefect.io/docs/v3/concepts/server#how-to-guides "
                    "for more information on running a dedicated Prefect server.",
                    self.port,
                )
                try:
                    self.server_process = self._spawn_server()
                    self._wait_until_answering(wait)
                except BaseException:
                    self._kill()  # the process of a start that timed out would otherwise run on
                    raise
            TEMPORARY_API[:] = [self.api_url]
            # every Prefect client of this process, in any thread, finds the server here: Prefect's process-wide
            # settings (what a thread started before this, or without a settings context of its own, reads) are
            # read again from the environment
            os.environ["PREFECT_API_URL"] = self.api_url
            _refresh_prefect_settings()
            atexit.register(self.stop)

    def _wait_until_answering(self, wait: float) -> None:
        """Until the server's health check answers 200; RuntimeError when its process exits or wait seconds pass."""
        import httpx

        deadline = time.monotonic() + wait
        with httpx.Client() as client:
            while self.server_process.poll() is None:
                try:
                    if client.get(f"{self.api_url}/health", timeout=5).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Timed out after {wait:g} s while attempting to connect to Prefect's temporary server on "
                        f"{self.api_url}"
                    )
                time.sleep(0.1)
        raise RuntimeError(
            f"Prefect's temporary server exited with code {self.server_process.returncode} before it answered"
        )

    def stop(self) -> None:
        from trainflow.run.locks import TEMPORARY_API

        if TEMPORARY_API == [self.api_url]:
            TEMPORARY_API.clear()
            if os.environ.get("PREFECT_API_URL") == self.api_url:
                del os.environ["PREFECT_API_URL"]
                _refresh_prefect_settings()
        self._kill()

    def _kill(self) -> None:
        process, self.server_process = self.server_process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _refresh_prefect_settings() -> None:
    from prefect.context import refresh_global_settings_context

    refresh_global_settings_context()


_SERVER: list[TemporaryServer] = []


def temporary_server() -> TemporaryServer:
    """This process's one temporary Prefect server (TemporaryServer), started or not."""
    with _SPAWN_LOCK:
        if not _SERVER:
            _SERVER.append(TemporaryServer())
    return _SERVER[0]


@contextlib.contextmanager
def local_flow_settings() -> Iterator[None]:
    """Prefect settings for a flow run of this process. On a temporary server (none configured), no flow-run
    heartbeats: they tell a server that a run crashed, but this server ends with the process, and the heartbeat
    thread, which sleeps in 1-s steps, holds every run's end for up to a second more. With a server configured,
    Prefect's settings as they are."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from trainflow.run.locks import prefect_server_configured

    if prefect_server_configured():
        yield
        return
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


def configure_ray_data() -> None:
    """Ray Data settings for this driver: readable output, task-based shuffles and Parquet reads.

    Ray 2.60 defaults to hash shuffles served by aggregator actors; on a small cluster their start-up
    dominates; the sort-based pull shuffle has none to start. Set RAY_DATA_DEFAULT_SHUFFLE_STRATEGY to choose
    another.

    Ray 2.60 also routes read_parquet through DataSourceV2, whose listing step waits for footer-reader
    actors to start on every read, seconds for a small file. Set RAY_DATA_USE_DATASOURCE_V2=1 to keep V2.
    The V1 reader cuts a table into at least read_op_min_num_blocks=200 blocks, sized for large
    clusters, and tiny blocks make every pass slower; with the floor at 1, Ray's own rules decide: at
    least 2 blocks per CPU of the cluster, and blocks of at most target_max_block_size (128 MiB).
    Figures for each: docs/performance.md.
    """
    from ray.data import DataContext
    from ray.data.context import DEFAULT_READ_OP_MIN_NUM_BLOCKS, ShuffleStrategy

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = sys.stderr.isatty()  # where a person watches a terminal; never into log files
    ctx.print_on_execution_start = False
    if "RAY_DATA_DEFAULT_SHUFFLE_STRATEGY" not in os.environ:
        ctx.shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    if "RAY_DATA_USE_DATASOURCE_V2" not in os.environ:
        ctx.use_datasource_v2 = False
    if ctx.read_op_min_num_blocks == DEFAULT_READ_OP_MIN_NUM_BLOCKS:
        ctx.read_op_min_num_blocks = 1
    quiet_ray_loggers()
    # this module's one warning says the progress bars are off, which is set above on purpose
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)


def quiet_ray_loggers() -> None:
    """Ray Data's, Train's and Tune's INFO lines off, their warnings kept: trainflow's own progress lines say what
    each step did. Set where Ray starts (configure_ray_data) and before a fit in Ray Train's local mode, which needs
    no Ray: there Ray Train said "Running in local mode ..." and "Moving model to device" at each fit's start and
    echoed each report's metrics dict beside trainflow's own line ("Reported metrics: {...}"): 44 of the 240 lines
    a default retrain of 150 rows printed."""
    for name in ("ray.data", "ray.train", "ray.tune"):
        logging.getLogger(name).setLevel(logging.WARNING)
