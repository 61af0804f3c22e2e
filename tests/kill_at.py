"""`python -m tests.kill_at BOUNDARY trainflow-args...`: the trainflow CLI, SIGKILLed by its own hand when the
retrain reaches BOUNDARY (the exactly-once tests). A kill there is what a lost machine does: no handler, no
finally, no flush; only what was durable before the boundary survives."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import signal
import sys

# boundary -> (module, the function the flow calls on reaching it): the kill replaces the call
BOUNDARIES = {
    "after-ingest": ("trainflow.flows.retrain", "split"),  # the table read, nothing split or trained
    "after-train": ("trainflow.flows.retrain", "select_each"),  # every family's runs trained, none selected
    "after-select": ("trainflow.flows.retrain", "ensemble"),  # checkpoints selected, no ensemble yet
    "ensemble-build": ("trainflow.tasks.ensemble", "greedy_weights"),  # selected; the members' outputs, no weights
    "after-register": ("trainflow.flows.publish", "promote"),  # a model version registered, not yet judged
    "promote-locked": ("trainflow.tasks.promote", "_before_alias_move"),  # the champion lock held, alias not moved
    "promote-moved": ("trainflow.tasks.promote", "record_move"),  # the alias moved, its history not yet written
    "output-commit": ("trainflow.tables.outputs", "_manifest"),  # the predictions staged, not yet swapped in
}
# boundary -> (module, function, n): the kill comes as the n-th call returns (what it made is durable, what its
# caller does next is not)
AFTER_CALL = {
    # a retrain's refit (one member: its own run) trained, finished and selected, its model not yet registered
    "refit-fitted": ("trainflow.flows.refit", "extra_fit", 1),
    # a replay's cutoff 1: its retrain registered, the period not yet recorded in replay.json
    "replay-second-fit": ("trainflow.flows.replay", "_fit", 2),
    # `trainflow gc`: the done record and one folder of the first run it removes deleted, the rest not
    "gc-second-delete": ("trainflow.retention", "_delete", 2),
}


def kill_at(boundary: str) -> None:
    """The kill put in place of the boundary's call (or after its n-th call: AFTER_CALL) when its module is imported:
    the CLI imports the flow while Prefect's temporary server starts, as in a run a user starts (importing it here
    first would serialize both)."""

    def die(*_args, **_kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    if boundary in AFTER_CALL:
        module, name, n = AFTER_CALL[boundary]

        def patch(loaded) -> None:
            original, calls = getattr(loaded, name), []

            def call_then_die(*args, **kwargs):
                result = original(*args, **kwargs)
                calls.append(1)
                if len(calls) == n:
                    die()
                return result

            setattr(loaded, name, call_then_die)
    else:
        module, name = BOUNDARIES[boundary]

        def patch(loaded) -> None:
            setattr(loaded, name, die)

    if module in sys.modules:
        patch(sys.modules[module])
        return
    sys.meta_path.insert(0, _AfterImport(module, patch))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls then(module) once the module called `name` has been executed (a post-import hook)."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        exec_module, then = spec.loader.exec_module, self.then

        def exec_then(module):
            exec_module(module)
            then(module)

        spec.loader.exec_module = exec_then
        return spec


if __name__ == "__main__":
    kill_at(sys.argv[1])
    from trainflow.flows.cli import main

    sys.exit(main(sys.argv[2:]))
