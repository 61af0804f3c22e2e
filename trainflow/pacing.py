"""Pace Ray Data's scheduling loop for pipelines streamed to training workers.

Ray Data 2.60's StreamingExecutor waits for its running tasks with `ray.wait(timeout=0.1)`, but a read task
held by output backpressure (its next block is ready, the consumers are not) counts as ready, so the wait
returns at once and the loop spins. A table streamed from one large file is read by one long task that
spends most of an epoch in that state: on the beyond-memory bench (12M rows, 200 MiB object store, 2
workers on 2 CPUs) the train split's SplitCoordinator burned 61% of a core (81 s CPU in 132 s) while the
two training workers got 43% each; the materialized run's coordinator used 2 s CPU in 99 s.

`setup` (Ray's `worker_process_setup_hook`, which `trainflow.run.runtime` gives the local Ray it starts through its
processes' environment and a cluster's job through its runtime_env) wraps the
loop's step in every worker process; the wrapper only acts on datasets marked with `pace` (the streamed
training and validation splits): a step that returned in under PACE_S, that is without waiting, is
followed by a sleep of PACE_S. A block arrives at most PACE_S later than it would have; the blocks there
are tens of thousands of rows, consumed in tenths of seconds. Without the private method (another Ray
version), nothing is wrapped and the loop runs as Ray ships it.

The wrap waits for the process to import Ray Data's executor itself: importing it costs about 0.45 s of CPU, and
most of Ray's worker processes (a fit's controller helpers, idle workers, queues) never run a pipeline.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys
import time

CONFIG_KEY = "trainflow.scheduling_pace_s"
PACE_S = 0.01
HOOK = "trainflow.pacing.setup"
EXECUTOR = "ray.data._internal.execution.streaming_executor"

log = logging.getLogger(__name__)


def pace(ds, seconds: float = PACE_S):
    """Mark a dataset (and those derived from it) for a paced scheduling loop."""
    ds.context.set_config(CONFIG_KEY, seconds)
    return ds


def setup() -> None:
    """Wrap StreamingExecutor._scheduling_loop_step once per process: now if Ray Data's executor is imported
    already, else the moment the process imports it."""
    module = sys.modules.get(EXECUTOR)
    if module is not None:
        _wrap(module)
    elif not any(isinstance(f, _WrapOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _WrapOnImport())


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds the executor's module as Python would, and wraps the loop once the module has run."""

    def find_spec(self, name, path=None, target=None):
        if name != EXECUTOR:
            return None
        sys.meta_path.remove(self)  # the real finders find it; this finder is done either way
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _wrap(module)

        spec.loader.exec_module = exec_module
        return spec


def _wrap(module) -> None:
    executor = getattr(module, "StreamingExecutor", None)
    original = getattr(executor, "_scheduling_loop_step", None)
    if original is None or getattr(original, "_trainflow_paced", False):
        return

    def step(self, topology):
        started = time.perf_counter()
        more = original(self, topology)
        context = getattr(self, "_data_context", None)
        seconds = context.get_config(CONFIG_KEY, 0.0) if context is not None else 0.0
        if more and seconds and time.perf_counter() - started < seconds:
            time.sleep(seconds)
        return more

    step._trainflow_paced = True
    executor._scheduling_loop_step = step
