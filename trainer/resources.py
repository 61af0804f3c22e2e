"""Check a worker request against the cluster before asking Ray for a placement group that can never fit."""

from __future__ import annotations

import math
from typing import Any

from trainflow.errors import ConfigError
from trainflow.run.runtime import nodes


def worker_bundle(scaling: dict[str, Any]) -> dict[str, float]:
    """What one worker asks for, as Ray Train computes it: resources_per_worker, else 1 CPU (+1 GPU with use_gpu)."""
    res = dict(scaling.get("resources_per_worker") or {})
    if not res:
        res = {"CPU": 1.0}
    if scaling.get("use_gpu") and "GPU" not in res:
        res["GPU"] = 1.0
    if scaling.get("accelerator_type"):
        # Ray exposes each node's accelerator as a resource named accelerator_type:<TYPE>
        res[f"accelerator_type:{scaling['accelerator_type']}"] = 0.001
    return {k: float(v) for k, v in res.items() if v}


def alive_nodes() -> list[dict[str, float]]:
    """The resources of each alive node of the connected cluster (before trainflow's own Ray starts: its node)."""
    return nodes()


def workers_that_fit(bundle: dict[str, float], nodes: list[dict[str, float]]) -> int:
    """How many bundles the nodes' total resources can hold, each bundle on one node."""
    total = 0
    for node in nodes:
        total += min((math.floor(node.get(k, 0.0) / v + 1e-9) for k, v in bundle.items()), default=0)
    return total


def _describe(nodes: list[dict[str, float]], keys: list[str]) -> str:
    parts = []
    for i, node in enumerate(nodes):
        have = ", ".join(f"{k} {node.get(k, 0):g}" for k in keys)
        parts.append(f"node {i}: {have}")
    return "; ".join(parts) or "no alive nodes"


def check_fits(scaling: dict[str, Any], what: str = "training", nodes: list[dict[str, float]] | None = None) -> None:
    """Raise ConfigError naming the numbers when num_workers bundles can never be placed on the cluster.

    With scaling.wait_for_resources the check is skipped: an autoscaler may add the nodes.
    """
    if scaling.get("wait_for_resources") or not scaling.get("num_workers"):
        return
    nodes = alive_nodes() if nodes is None else nodes
    bundle = worker_bundle(scaling)
    elastic = not isinstance(scaling["num_workers"], int)
    n, fit = min(scaling["num_workers"]) if elastic else int(scaling["num_workers"]), workers_that_fit(bundle, nodes)
    if fit >= n:
        return
    asked = ", ".join(f"{k} {v:g}" for k, v in bundle.items())
    missing = [k for k in bundle if not any(node.get(k, 0) >= bundle[k] for node in nodes)]
    hint = ""
    if any(k.startswith("accelerator_type:") for k in missing):
        have = sorted({k.split(":", 1)[1] for node in nodes for k in node if k.startswith("accelerator_type:")})
        hint = f" No node has accelerator type {scaling['accelerator_type']!r} (types present: {have or 'none'})."
    elif "GPU" in missing:
        hint = " No node has a GPU of that size: set use_gpu: false, or a fraction such as resources_per_worker: {GPU: 0.5}."
    raise ConfigError(
        f"{what} asks for {'at least ' if elastic else ''}{n} worker(s) x ({asked}) but this cluster can place only {fit} "
        f"({_describe(nodes, [k for k in bundle if not k.startswith('accelerator_type:')])}).{hint} "
        "Lower scaling.num_workers or the per-worker resources, or set scaling.wait_for_resources: true "
        "to wait for an autoscaler."
    )


def concurrent_runs(scaling: dict[str, Any], nodes: list[dict[str, float]] | None = None) -> int:
    """How many training runs of num_workers workers each the cluster holds at once (at least 1)."""
    nodes = alive_nodes() if nodes is None else nodes
    workers = scaling.get("num_workers") or 1
    return max(
        1,
        workers_that_fit(worker_bundle(scaling), nodes)
        // max(1, workers if isinstance(workers, int) else max(workers)),
    )
