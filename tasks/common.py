"""What every task shares: the retry policy."""

from __future__ import annotations

from trainflow.errors import TrainflowError, disk_full
from trainflow.runtime import stop_requested


def retry_unless_user_error(task, task_run, state) -> bool:
    """Retry infrastructure failures (Ray, a dead actor, a lost node, the registry); never a user's bad config
    or data, a full disk, or anything once the process was asked to stop (SIGTERM, e.g. a cancelled flow run)."""
    try:
        state.result()
    except TrainflowError:
        return False
    except Exception as exc:  # noqa: BLE001 - anything else is infrastructure until proven otherwise
        return not (stop_requested(exc) or disk_full(exc))
    return False
