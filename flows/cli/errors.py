"""How a failed command ends: the message a person reads (secrets masked) and the exit code: 2 for a mistake of the
user's (config, data, a full disk), 1 for a failure (a service away too long, a bug), 130 for ^C, 143 for SIGTERM."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import traceback

from trainflow.errors import TrainflowError
from trainflow.run.runtime import stop_ray, stop_requested


@contextlib.contextmanager
def short_failure_logs(enabled: bool):
    """Prefect and Ray log each failure with its traceback; without --debug keep just the message."""
    if not enabled:
        yield
        return
    previous = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        if record.exc_info and record.levelno >= logging.WARNING:
            record.exc_info, record.exc_text = None, None
        return record

    logging.setLogRecordFactory(factory)
    try:
        yield
    finally:
        logging.setLogRecordFactory(previous)


def exit_code(exc: BaseException, debug: bool) -> int:
    """Say why the command failed on stderr and return its exit code."""
    if isinstance(exc, KeyboardInterrupt):
        print("trainflow: interrupted", file=sys.stderr)
        return 130
    if stop_requested(exc):
        # what the stop made fail (a Ray call interrupted by the signal) is no error of the run's to report
        print(
            "trainflow: stopped by SIGTERM; rerun with the same --run-name to resume from the latest checkpoint",
            file=sys.stderr,
        )
        stop_ray()
        return 128 + signal.SIGTERM
    from trainflow.errors import disk_full
    from trainflow.run.redact import redact_text

    if disk_full(exc):
        print(
            f"trainflow: error: no space left on device ({redact_text(str(exc).splitlines()[0])}); free space "
            "where the run writes (storage_path, inference.output, TMPDIR, Ray's spill folder) and rerun with "
            "the same --run-name to resume",
            file=sys.stderr,
        )
        return 2
    if isinstance(exc, TrainflowError):
        print(f"trainflow: error: {redact_text(str(exc))}", file=sys.stderr)
        return 2
    from trainflow.run.services import explain

    absent = explain(exc)  # a service that stayed away longer than the run waits for it: named, exit 1
    if absent is not None:
        print(f"trainflow: failed: {redact_text(str(absent))}", file=sys.stderr)
        return 1
    if debug:
        traceback.print_exception(exc)
    print(
        f"trainflow: failed: {type(exc).__name__}: {redact_text(str(exc).splitlines()[0]) if str(exc) else ''}",
        file=sys.stderr,
    )
    print("trainflow: rerun with --debug for the traceback", file=sys.stderr)
    return 1
