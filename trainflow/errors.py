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


class UnreadableCheckpoint(CheckpointError, ValueError):
    """A file of a checkpoint holds what trainflow does not write (a state fitting cannot produce): refused, naming
    the file (a data problem, exit 2; a ValueError to code that reads checkpoints)."""


class InfrastructureError(RuntimeError):
    """A service trainflow depends on (the registry, storage) failed in a way a retry may fix: retried by the
    task's retries, then the run fails without having changed what it guards (the champion alias, outputs)."""


def exception_chain(exc: BaseException | None) -> list[BaseException]:
    """exc and the exceptions behind it (__cause__, else __context__), each once, outermost first."""
    chain: list[BaseException] = []
    while exc is not None and all(exc is not seen for seen in chain):
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def disk_full(exc: BaseException | None) -> bool:
    """Whether exc (or an exception in its chain) is a full disk (ENOSPC): retrying would fill it again."""
    import errno

    # pyarrow and Ray pass ENOSPC on as text
    return any(
        (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in str(e)
        for e in exception_chain(exc)
    )
