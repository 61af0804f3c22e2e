"""The services a run leans on, and how long it waits out each one's absence: the MLflow tracking server, the
Prefect API, the object store (s3://, gs://, ... through pyarrow.fs) and a PostgreSQL source's server.

Each wait is a config key (`services.*_wait_s`) and is bounded: while a service does not answer, a line says every
WAIT_NOTE_S seconds what the run waits for and for how long; when the wait is spent the run fails with
ServiceUnavailable (exit 1) naming the service, having published nothing half-done (the output commit, the alias move
and the registry's records are each one step that either happened or did not), and the same command run again
resumes. The clients' own retries do the waiting where they can: MLflow's HTTP retries and Prefect's client retries
are sized to the config's waits; trainflow's own reads and writes of the object store retry in `patient`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

from trainflow.errors import InfrastructureError, exception_chain

log = logging.getLogger("trainflow.run.services")
T = TypeVar("T")

WAIT_NOTE_S = 30.0  # a waiting run says so at once, then this often
MLFLOW_BACKOFF_CAP_S = 120.0  # urllib3's longest pause between two of MLflow's retries
MLFLOW_MAX_RETRIES = 10  # MLflow refuses more (its _MLFLOW_HTTP_REQUEST_MAX_RETRIES_LIMIT)


@dataclass
class Waits:
    """Seconds to wait out each service (the config's `services` section; these defaults until a config is read)."""

    mlflow: float = 300.0
    prefect: float = 300.0
    storage: float = 300.0
    database: float = 300.0
    database_read: float = 300.0


WAITS = Waits()

# what an absent service's errors say (requests/urllib3, httpx, the AWS SDK under pyarrow.fs)
_DOWN = (
    "Connection refused",
    "Max retries exceeded",
    "Failed to establish a new connection",
    "NETWORK_CONNECTION",
    "Could not connect to server",
    "Couldn't connect to server",
    "curlCode: 7",
    "curlCode: 28",
    "Connection reset by peer",
    "RemoteDisconnected",
    "Name or service not known",
    "All connection attempts failed",
    "Server disconnected",
    "502 Bad Gateway",
    "503 Service Unavailable",
    "504 Gateway Timeout",
)


class ServiceUnavailable(InfrastructureError):
    """A service did not answer for the whole of its configured wait."""

    def __init__(self, service: str, where: str, waited_s: float, key: str, reason: str):
        self.service, self.where = service, where
        self._args = (service, where, waited_s, key, reason)
        super().__init__(
            f"{service} at {where} did not answer for {waited_s:.0f} s (services.{key}; {reason}); "
            "nothing was published half-done: run the same command again when it is back (a retrain "
            "resumes from its last checkpoint and finishes what it had not)"
        )

    def __reduce__(self):  # raised in a Ray worker, it reaches the driver whole (an exception pickles its args)
        return type(self), self._args


def is_down(exc: BaseException | None) -> bool:
    """Whether exc (or an exception in its chain) says a service could not be reached."""
    return any(
        isinstance(e, (ConnectionError, TimeoutError)) or any(s in str(e) for s in _DOWN) for e in exception_chain(exc)
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


class _Note:
    """Says at once, then every WAIT_NOTE_S seconds, what a wait is for."""

    def __init__(self) -> None:
        self.next = 0.0
        self.lock = threading.Lock()

    def say(self, text: str, *args: Any) -> None:
        with self.lock:
            now = time.monotonic()
            if now < self.next:
                return
            self.next = now + WAIT_NOTE_S
        log.warning(text, *args)


def patient(op: Callable[[], T], service: str, where: str, key: str, wait_s: float) -> T:
    """op(), retried with a growing pause (1 s doubling to 15 s) while it fails because the service is down, for
    at most wait_s; then ServiceUnavailable. Other errors pass at once."""
    start, pause, note = time.monotonic(), 1.0, _Note()
    while True:
        try:
            return op()
        except Exception as exc:  # noqa: BLE001 - only an absent service is waited for
            if not is_down(exc):
                raise
            waited = time.monotonic() - start
            if waited + pause > wait_s:
                raise ServiceUnavailable(service, where, waited, key, _first_line(exc)) from exc
            note.say(
                "waiting for %s at %s, which does not answer (%s): %.0f s so far, up to %.0f s (services.%s)",
                service,
                where,
                _first_line(exc),
                waited,
                wait_s,
                key,
            )
        time.sleep(pause)
        pause = min(pause * 2, 15.0)


# the object store ---------------------------------------------------------------------------------------------------


def storage_endpoint(uri: str) -> str:
    """Where an object store URI's requests go, as a person would name it."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if "endpoint_override=" in uri:
        endpoint = uri.split("endpoint_override=", 1)[1].split("&", 1)[0]
    scheme = uri.split("://", 1)[0]
    return f"{endpoint} ({scheme})" if endpoint else f"{scheme}://{uri.split('://', 1)[1].split('/', 1)[0]}"


def patient_storage(op: Callable[[], T], uri: str) -> T:
    """op() on the object store that serves uri, its absence waited out for services.storage_wait_s."""
    return patient(op, "the object store", storage_endpoint(uri), "storage_wait_s", WAITS.storage)


# MLflow -------------------------------------------------------------------------------------------------------------


def mlflow_retries(wait_s: float) -> tuple[int, int]:
    """(retries, backoff factor) whose pauses add up to at least wait_s and as little more as MLflow allows: urllib3
    pauses 0, 2f, 4f, ... seconds (each at most 120) between MLflow's retries, and MLflow takes at most 10."""
    if wait_s <= 0:
        return 0, 1
    best: tuple[float, int, int] | None = None
    for factor in range(1, 61):
        total = 0.0
        for retries in range(1, MLFLOW_MAX_RETRIES + 1):
            total += 0.0 if retries == 1 else min(MLFLOW_BACKOFF_CAP_S, factor * 2 ** (retries - 1))
            if total >= wait_s:
                if best is None or total < best[0]:
                    best = (total, retries, factor)
                break
    return (best[1], best[2]) if best else (MLFLOW_MAX_RETRIES, 60)


class _MlflowRetryLine(logging.Filter):
    """urllib3's line for each of MLflow's retries ("Retrying (Retry(total=3...)) after connection broken by ...")
    becomes one that says what the run waits for and how long, at once and then every WAIT_NOTE_S seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.note, self.where = _Note(), ""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith("Retrying") or "/mlflow" not in message:
            return True
        reason = "connection refused" if "refused" in message else message.split(" after ", 1)[-1][:160]
        self.note.say(
            "waiting for the MLflow tracking server at %s, which does not answer (%s): retrying for up "
            "to %.0f s (services.mlflow_wait_s)",
            self.where,
            reason,
            WAITS.mlflow,
        )
        return False


_RETRY_LINE = _MlflowRetryLine()


def mlflow_where(tracking_uri: str | None) -> str | None:
    """The tracking server's address for a remote (HTTP) store; None for a local one (SQLite, files)."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or ""
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else None


# applying a config --------------------------------------------------------------------------------------------------


def apply(
    mlflow_wait_s: float,
    prefect_wait_s: float,
    storage_wait_s: float,
    tracking_uri: str | None,
    database_wait_s: float = 300.0,
    database_read_s: float = 300.0,
) -> None:
    """Make this process wait out each service as the config says: MLflow's HTTP retries sized to the MLflow wait
    (a remote tracking server only), trainflow's object-store calls to the storage wait, a PostgreSQL source's
    connection to the database wait, and the Prefect client's retries (`prefect_client_retries`) to the Prefect
    wait."""
    WAITS.mlflow, WAITS.prefect, WAITS.storage = mlflow_wait_s, prefect_wait_s, storage_wait_s
    WAITS.database, WAITS.database_read = database_wait_s, database_read_s
    where = mlflow_where(tracking_uri)
    if where is None:
        return
    retries, factor = mlflow_retries(mlflow_wait_s)
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(retries)
    os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] = str(factor)
    _RETRY_LINE.where = where
    pool = logging.getLogger("urllib3.connectionpool")
    if _RETRY_LINE not in pool.filters:
        pool.addFilter(_RETRY_LINE)


def prefect_retries(wait_s: float) -> int:
    """The Prefect client's retries whose pauses (2, 4, 8, ... seconds) add up to at least wait_s."""
    retries, total = 0, 0.0
    while total < wait_s:
        retries += 1
        total += 2**retries
    return retries


def prefect_api() -> str | None:
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    return str(url).rstrip("/") if url else None


class _PrefectRetryLine(logging.Filter):
    """The Prefect client says each retry at DEBUG ("Encountered retryable exception during request. Another attempt
    will be made in 8s. This is attempt 3/9."): that becomes a line saying what the run waits for (at once, then at
    most every WAIT_NOTE_S seconds); the client's other DEBUG lines stay hidden, its INFO and above pass as before."""

    def __init__(self, api: str, shown: int):
        super().__init__()
        self.api, self.shown, self.note = api, shown, _Note()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "Another attempt will be made" in message:
            attempt = message.rsplit("This is attempt", 1)[-1].strip(" .")
            self.note.say(
                "waiting for the Prefect API at %s, which does not answer: attempt %s, up to %.0f s "
                "(services.prefect_wait_s)",
                self.api,
                attempt,
                WAITS.prefect,
            )
            return False
        return record.levelno >= self.shown


class _Sparse(logging.Filter):
    """A warning repeated while a service is away (Prefect's events client tries its websocket every few seconds)
    passes at most once every WAIT_NOTE_S seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key, now = record.getMessage()[:80], time.monotonic()
        if now - self.last.get(key, -WAIT_NOTE_S) < WAIT_NOTE_S:
            return False
        self.last[key] = now
        return True


@contextlib.contextmanager
def prefect_client_retries() -> Iterator[None]:
    """The Prefect client's retries of a request that fails mid-run (the API went away after the run reached it),
    sized to services.prefect_wait_s and said in a line, while the block runs."""
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    client_log = logging.getLogger("prefect.client")
    level, api = client_log.level, prefect_api()
    line = _PrefectRetryLine(api or "", client_log.getEffectiveLevel())
    # its children (prefect.client.subscriptions) keep the level they had, not the DEBUG set below
    children = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict) if n.startswith("prefect.client.")]
    children = [c for c in children if c.level == logging.NOTSET]
    events_log, sparse = logging.getLogger("prefect.events.clients"), _Sparse()
    if api:
        for child in children:
            child.setLevel(line.shown)
        events_log.addFilter(sparse)
        client_log.addFilter(line)
        client_log.setLevel(
            logging.DEBUG
        )  # its retry record is made only at DEBUG; the filter keeps the rest as it was
    try:
        with temporary_settings(updates={PREFECT_CLIENT_MAX_RETRIES: max(prefect_retries(WAITS.prefect), 1)}):
            yield
    finally:
        if api:
            events_log.removeFilter(sparse)
            client_log.removeFilter(line)
            client_log.setLevel(level)
            for child in children:
                child.setLevel(logging.NOTSET)


def wait_for_prefect() -> None:
    """Where a Prefect API is configured, wait (services.prefect_wait_s) until it answers before a run starts: the
    Prefect client retries a request that fails mid-run, but not a first connection that fails."""
    api = prefect_api()
    if api is None:
        return
    import httpx

    def health() -> None:
        httpx.get(f"{api}/health", timeout=10.0).raise_for_status()

    patient(health, "the Prefect API", api, "prefect_wait_s", WAITS.prefect)


def explain(exc: BaseException) -> ServiceUnavailable | None:
    """A run that failed because a service stayed away past its clients' retries, as ServiceUnavailable naming it;
    None for any other failure."""
    chain = exception_chain(exc)
    for e in chain:
        if isinstance(e, ServiceUnavailable):
            return e
    if not any(is_down(e) for e in chain):
        return None
    text = " ".join(str(e) for e in chain)
    mlflow = _RETRY_LINE.where or mlflow_where(None)
    if mlflow and (mlflow in text or "API request to" in text):
        return ServiceUnavailable(
            "the MLflow tracking server", mlflow, WAITS.mlflow, "mlflow_wait_s", _first_line(chain[-1])
        )
    api = prefect_api()
    if api and (api.split("://", 1)[-1].split("/", 1)[0] in text or any("httpx" in type(e).__module__ for e in chain)):
        return ServiceUnavailable("the Prefect API", api, WAITS.prefect, "prefect_wait_s", _first_line(chain[-1]))
    if "AWS Error" in text or "curlCode" in text:
        return ServiceUnavailable(
            "the object store", storage_endpoint("s3://"), WAITS.storage, "storage_wait_s", _first_line(chain[-1])
        )
    return None
