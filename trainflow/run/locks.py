"""Cross-process locks for what several runs may touch at once: a registered model's @champion alias and a
predictions output. A lock is held by a living process: it dies with its holder, and a waiter says what it
waits for.

Two kinds, chosen by whether a Prefect API is configured (`PREFECT_API_URL`):
- No API configured (local runs, the temporary Prefect server): an operating-system lock (`flock`) on a file in
  `<PREFECT_HOME>/trainflow-locks/`, the folder the temporary server's database lives in, so every process of the
  user on this machine shares it. The kernel releases it the moment its holder dies (SIGKILL included).
- A Prefect server (deployments, workers, CI against a server): a Prefect global concurrency limit of one slot
  held under a lease of LEASE_S seconds that the holder renews while it lives; a killed holder's lease runs out
  and the server's repossessor (every 15 s by default) frees the slot: free again within about LEASE_S + 15 s.

The holder writes who it is (host, pid, Prefect run, since when) into a small record beside the lock (the lock
file itself, or a Prefect variable); a waiter names it in a line every WAIT_NOTE_S seconds and in the
LockTimeout when its wait runs out.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import logging
import os
import re
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from trainflow.errors import TrainflowError

# a promotion scores two models and an output write may take minutes; waiting longer than this means someone
# must look (the waiter has said every minute who holds the lock)
LOCK_TIMEOUT_S = 1800.0
# a run name's lock is held for a whole retrain (hours on a large table): a second start of that name waits this long
RUN_LOCK_TIMEOUT_S = 6 * 3600.0
LEASE_S = 60.0  # the Prefect server's minimum lease
WAIT_NOTE_S = 60.0
POLL_S = 0.25
NO_WAIT_ASKS = 3  # a run that does not wait asks a Prefect server this often while nobody holds the lock


class LockTimeout(TrainflowError):
    """Another run held the lock for longer than the timeout."""


def normalized_scope(uri: str) -> str:
    """One spelling per place: a local path or a SQLite database's file through realpath (`sqlite:////x/./m.db` and
    `sqlite:////x/m.db` are one registry), a file:// URI as its path, any other URI with its trailing slashes cut."""
    uri = (uri or "").strip()
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///") :].split("?", 1)
        return "sqlite:///" + os.path.realpath(path[0]) + (f"?{path[1]}" if len(path) > 1 else "")
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    if uri and "://" not in uri:
        return os.path.realpath(os.path.expanduser(uri))
    return uri.rstrip("/")


def lock_name(kind: str, key: str, scope: str = "") -> str:
    """A lock name for (kind, key) in scope (e.g. a tracking URI, only hashed: it may hold a password; normalized,
    so two spellings of one place share a lock): readable, within Prefect's and a file name's rules, unique per key
    and scope."""
    scope = normalized_scope(scope)
    digest = hashlib.blake2b(f"{key}\x1f{scope}".encode(), digest_size=5).hexdigest()
    slug = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")[-40:].strip("-")
    return f"trainflow-{kind}-{slug}-{digest}"


def _holder() -> dict[str, Any]:
    """Who takes the lock: host, pid, the Prefect flow run (when inside one) and the time."""
    run = None
    try:
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        if ctx is not None and ctx.flow_run is not None:
            run = f"{ctx.flow_run.name} ({ctx.flow_run.id})"
    except Exception:  # noqa: BLE001 - the holder's description is best effort
        run = None
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "run": run,
        "since": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def describe_holder(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "a run that has not said who it is"
    run = f"run {holder['run']}, " if holder.get("run") else ""
    return f"{run}process {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')}"


def prefect_server_configured() -> bool:
    """True when a Prefect API URL is configured (a server); False for local runs and the temporary server."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    return bool(url) and TEMPORARY_API != [url]


# the API URL of this process's running temporary server (trainflow/run/runtime.py TemporaryServer): no server the user
# configured, though its clients reach it through PREFECT_API_URL
TEMPORARY_API: list[str] = []


def lock_dir() -> Path:
    """Where the file locks live: beside the Prefect home's database, shared by the user's processes."""
    from prefect.settings import get_current_settings

    path = Path(get_current_settings().home).expanduser() / "trainflow-locks"
    path.mkdir(parents=True, exist_ok=True)
    return path


class _Waiter:
    """Says, every WAIT_NOTE_S seconds, what a wait is for; raises LockTimeout when it runs out."""

    def __init__(self, kind: str, key: str, name: str, timeout_s: float, read_holder):
        self.kind, self.key, self.name, self.timeout_s, self.read_holder = kind, key, name, timeout_s, read_holder
        self.start = time.monotonic()
        self.next_note = self.start + min(WAIT_NOTE_S, 5.0)  # the first line soon: the waiter is not silent
        self.log = logging.getLogger("trainflow.run.locks")

    def left(self) -> float:
        return self.start + self.timeout_s - time.monotonic()

    def tick(self) -> None:
        now = time.monotonic()
        if self.timeout_s <= 0:  # asked not to wait (`--no-wait`)
            raise LockTimeout(
                f"{self.kind} {self.key} is in use: the lock {self.name} is held by "
                f"{describe_holder(self.read_holder())}; without --no-wait this run waits for it"
            )
        if self.left() <= 0:
            raise LockTimeout(
                f"waited {self.timeout_s:g} s for the lock on {self.kind} {self.key} ({self.name}); it is held by "
                f"{describe_holder(self.read_holder())}. A holder that died frees it by itself "
                f"({'within about %g s' % (LEASE_S + 15) if prefect_server_configured() else 'at once'}); "
                "if that process is alive, it is still working: try again later"
            )
        if now >= self.next_note:
            self.log.warning(
                "waiting %.0f s so far for the lock on %s %s, held by %s",
                now - self.start,
                self.kind,
                self.key,
                describe_holder(self.read_holder()),
            )
            self.next_note = now + WAIT_NOTE_S


@contextmanager
def _file_lock(kind: str, key: str, name: str, timeout_s: float) -> Iterator[str]:
    path = lock_dir() / f"{name}.lock"

    def read_holder() -> dict[str, Any] | None:
        try:
            return json.loads(path.read_text() or "null")
        except (OSError, ValueError):
            return None

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        waiter = _Waiter(kind, key, name, timeout_s, read_holder)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waiter.tick()
                time.sleep(POLL_S)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_holder()).encode(), 0)
        try:
            yield name
        finally:
            os.ftruncate(fd, 0)  # the record goes with the lock (the kernel releases it on close or death)
    finally:
        os.close(fd)


def _variable_name(name: str) -> str:
    return name.replace("-", "_")  # a Prefect variable name: lowercase letters, digits and underscores


def _read_limit(client, name: str):
    """The global concurrency limit `name` as the Prefect server holds it (through client, a sync Prefect client), or
    None when it has none of that name."""
    from prefect.exceptions import ObjectNotFound

    try:
        return client.read_global_concurrency_limit_by_name(name)
    except ObjectNotFound:
        return None


def _ensure_limit(name: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client:
        if _read_limit(client, name) is not None:
            return  # created by an earlier run (or by a user, whose settings win)
        try:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
        except ObjectAlreadyExists:
            pass  # another run created it meanwhile


def _occupied(name: str) -> bool:
    """Whether the global concurrency limit `name` has a slot taken (True when that cannot be read)."""
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            limit = _read_limit(client, name)
    except Exception:  # noqa: BLE001 - unknown counts as taken: the caller says the lock is in use
        return True
    return limit is None or limit.active_slots > 0


@contextmanager
def _prefect_lock(kind: str, key: str, name: str, timeout_s: float) -> Iterator[str]:
    from prefect.concurrency.sync import concurrency
    from prefect.variables import Variable

    def read_holder() -> dict[str, Any] | None:
        try:
            value = Variable.get(_variable_name(name))
            return value if isinstance(value, dict) else None
        except Exception:  # noqa: BLE001 - the description is best effort; the lock is the limit
            return None

    _ensure_limit(name)
    waiter = _Waiter(kind, key, name, timeout_s, read_holder)
    asked = 0
    with ExitStack() as stack:
        while True:
            asked += 1
            try:
                # a short acquisition wait so the waiter can say what it waits for; the lease dies with the holder
                stack.enter_context(
                    concurrency(
                        name,
                        occupy=1,
                        timeout_seconds=max(1.0, min(10.0, waiter.left())),
                        strict=True,
                        lease_duration=LEASE_S,
                    )
                )
                break
            except TimeoutError:
                # a run that does not wait asks again while the limit shows no slot taken: its second's wait ran out
                # on a server slow to answer (a loaded one took longer in a suite run), not on a holder
                if waiter.timeout_s <= 0 and asked < NO_WAIT_ASKS and not _occupied(name):
                    continue
                waiter.tick()
        try:
            Variable.set(_variable_name(name), _holder(), overwrite=True)
        except Exception:  # noqa: BLE001 - a variable that cannot be written only makes waiters less specific
            pass
        yield name


@contextmanager
def exclusive(kind: str, key: str, scope: str = "", timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[str]:
    """Hold the lock for (kind, key, scope) during the block; a waiter logs who holds it every minute and raises
    LockTimeout naming the lock and its holder after timeout_s."""
    name = lock_name(kind, key, scope)
    make = _prefect_lock if prefect_server_configured() else _file_lock
    with make(kind, key, name, timeout_s) as held:
        yield held


@contextmanager
def run_lock(storage_path: str, run_name: str, wait: bool = True) -> Iterator[str]:
    """One retrain, tune or resume per run name at a time (the run's folders under storage_path are its alone):
    a second start of the same name waits, saying who holds it, or with wait=False fails at once naming the holder."""
    with exclusive("run", run_name, storage_path, timeout_s=RUN_LOCK_TIMEOUT_S if wait else 0.0) as held:
        yield held
