"""Errors a user can act on: the CLI prints their message without a traceback."""


class TrainflowError(Exception):
    """A problem with the user's config, data or environment; never retried."""


class ConfigError(TrainflowError):
    """The config file or an override is invalid."""


class DataError(TrainflowError):
    """The input table is missing, empty or has unusable columns or values."""


class TrainingError(TrainflowError):
    """Training cannot go on for a reason retrying will not fix (e.g. NaN loss)."""


class CheckpointError(TrainflowError):
    """No usable checkpoint could be found or loaded."""


class InfrastructureError(RuntimeError):
    """A service trainflow depends on (the registry, storage) failed in a way a retry may fix: retried by the
    task's retries, then the run fails without having changed what it guards (the champion alias, outputs)."""


def disk_full(exc: BaseException | None) -> bool:
    """Whether exc (or an exception in its chain) is a full disk (ENOSPC): retrying would fill it again."""
    import errno

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(exc):  # pyarrow and Ray pass it on as text
            return True
        exc = exc.__cause__ or exc.__context__
    return False
