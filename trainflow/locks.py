"""Cross-process locks for what several runs may touch at once: a registered model's @champion alias and a
predictions output.

Each lock is a Prefect global concurrency limit of one slot, held for the block. The CLI, every deployment
(`retrain/scheduled`, `retrain/manual`, `batch-inference/champion`) and `tune` talk to the same Prefect API
(a server, or the temporary one, whose database is shared by every process of a user), so they queue on it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager

from trainflow.errors import TrainflowError

# a promotion scores two models and an output write may take minutes; a holder that died (SIGKILL) keeps its
# slot until its lease expires, so waiting longer than this means someone must look
LOCK_TIMEOUT_S = 1800.0


class LockTimeout(TrainflowError):
    """Another run held the lock for longer than the timeout."""


def lock_name(kind: str, key: str, scope: str = "") -> str:
    """A Prefect limit name for (kind, key) in scope (e.g. a tracking URI, only hashed: it may hold a
    password): readable, within Prefect's name rules, unique per key and scope."""
    digest = hashlib.blake2b(f"{key}\x1f{scope}".encode(), digest_size=5).hexdigest()
    slug = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")[-40:].strip("-")
    return f"trainflow-{kind}-{slug}-{digest}"


def _ensure_limit(name: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
            return  # created by an earlier run (or by a user, whose settings win)
        except ObjectNotFound:
            pass
        try:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
        except ObjectAlreadyExists:
            pass  # another run created it meanwhile


@contextmanager
def exclusive(kind: str, key: str, scope: str = "", timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[str]:
    """Hold the one slot of the limit for (kind, key, scope) during the block; LockTimeout when it stays taken."""
    from prefect.concurrency.sync import concurrency

    name = lock_name(kind, key, scope)
    _ensure_limit(name)
    acquired = False
    try:
        with concurrency(name, occupy=1, timeout_seconds=timeout_s, strict=True):
            acquired = True
            yield name
    except TimeoutError:
        if acquired:
            raise
        raise LockTimeout(
            f"waited {timeout_s:g} s for the lock on {kind} {key} (Prefect global concurrency limit {name!r}); "
            f"another run holds it. If no run is active, a killed run left its slot: free it with "
            f"`prefect gcl update {name} --active-slots 0`"
        ) from None
