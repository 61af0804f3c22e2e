"""`python -m tests.kill_at BOUNDARY trainflow-args...`: the trainflow CLI, SIGKILLed by its own hand when the
retrain reaches BOUNDARY (the exactly-once tests). A kill there is what a lost machine does: no handler, no
finally, no flush; only what was durable before the boundary survives."""

from __future__ import annotations

import importlib
import os
import signal
import sys

# boundary -> (module, the function the flow calls on reaching it): the kill replaces the call
BOUNDARIES = {
    "after-ingest": ("trainflow.flows.retrain", "split"),  # the table read, nothing split or trained
    "after-train": ("trainflow.flows.retrain", "select"),  # every family's runs trained, none selected
    "after-select": ("trainflow.flows.retrain", "ensemble"),  # checkpoints selected, no ensemble yet
    "ensemble-build": ("trainflow.tasks.ensemble", "greedy_weights"),  # selected; the members' outputs, no weights
    "after-register": ("trainflow.flows.publish", "promote"),  # a model version registered, not yet judged
    "promote-locked": ("trainflow.tasks.promote", "_before_alias_move"),  # the champion lock held, alias not moved
    "promote-moved": ("trainflow.tasks.promote", "record_move"),  # the alias moved, its history not yet written
    "output-commit": ("trainflow.outputs", "_manifest"),  # the predictions staged, not yet swapped in
}


def kill_at(boundary: str) -> None:
    module, name = BOUNDARIES[boundary]

    def die(*_args, **_kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    setattr(importlib.import_module(module), name, die)


if __name__ == "__main__":
    kill_at(sys.argv[1])
    from trainflow.flows.cli import main

    sys.exit(main(sys.argv[2:]))
