"""What every task shares: the retry policy."""

from __future__ import annotations

from trainflow.errors import TrainflowError


def retry_unless_user_error(task, task_run, state) -> bool:
    """Retry infrastructure failures (Ray, a dead actor, a lost node); never a user's bad config or data."""
    try:
        state.result()
    except TrainflowError:
        return False
    except Exception:  # noqa: BLE001 - anything else is infrastructure until proven otherwise
        return True
    return False
