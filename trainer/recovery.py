"""A run's recovery log: worker-group failures, hangs and resumes, one small JSON file per event.

Ray Train's controller calls RecoveryLog.after_exception when a worker group fails; rank 0 of the
next attempt appends a resume event when it starts from a checkpoint. Read back, each failure is
paired with the epoch that the run resumed from.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import ray
from ray.train import UserCallback

# Ray Train's own hooks on its controller (RunConfig(callbacks=) passes every callback that is not a UserCallback to
# them): the worker group's start and the controller's state changes, which UserCallback lacks
from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback
from ray.train.v2._internal.execution.scaling_policy.elastic import ElasticScalingPolicy

from trainflow.run.storage import join, list_dir, read_text, write_text

if TYPE_CHECKING:
    from trainflow.config import Config, ScalingSection

EVENTS_DIR = "trainflow_events"
RESTART = "the restart of training after a lost node"  # check_fits's subject when a fixed-size restart cannot fit


def append_event(run_dir: str, event: dict[str, Any]) -> None:
    """Record an event under <run_dir>/trainflow_events/ (local or a storage URI; object stores cannot append)."""
    now = time.time()
    name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
    write_text(join(run_dir, EVENTS_DIR, name), json.dumps({"time": now, **event}))


def read_events(run_dir: str) -> list[dict[str, Any]]:
    """The run's events in the order they happened."""
    folder = join(run_dir, EVENTS_DIR)
    events = []
    for name, is_dir in sorted(list_dir(folder)):
        if is_dir or not name.endswith(".json"):
            continue
        try:
            events.append(json.loads(read_text(join(folder, name))))
        except (OSError, json.JSONDecodeError):  # a file cut short by a killed process
            continue
    return events


def recoveries(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """[{error, resumed_from_epoch}] — one per resume; a resume with no error before it followed a killed process."""
    out, pending = [], None
    for e in events:
        if e.get("event") in ("error", "hang"):
            # a hang is logged by the watchdog before Ray reports the killed worker; keep the first cause
            pending = e["error"] if pending is None else pending
        elif e.get("event") == "restart" and e.get("preempted"):  # counted on failure.max_preemption_failures
            drained = ", ".join(n[:12] for n in e.get("draining") or e.get("nodes", []))
            pending = f"a preemption: node {drained} drained (not counted against failure.max_failures)"
        elif e.get("event") == "resume":
            out.append(
                {
                    "error": pending
                    or "the previous attempt ended without reporting an error (process or node killed)",
                    "resumed_from_epoch": e["epoch"],
                    **{k: e[k] for k in ("family", "fold") if k in e},
                }
            )
            pending = None
    return out


def fold_events(run_dir: str, folders: dict[Any, str], seen: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """A fold run's events in the order they happened: the run's own (Ray Train's failures, hangs, resizes) and
    each fold's (folders: fold -> its folder, or (family, fold) -> its folder in a run several families share; its
    resumes, starts and time limits, each tagged with the fold and family). seen: the count of events each folder
    held before, left out (an invocation's own events)."""
    seen = seen or {}
    events = read_events(run_dir)[seen.get(run_dir, 0) :]
    for key, folder in folders.items():
        tag = {"family": key[0], "fold": key[1]} if isinstance(key, tuple) else {"fold": key}
        events += [{**e, **tag} for e in read_events(folder)[seen.get(folder, 0) :]]
    return sorted(events, key=lambda e: float(e.get("time", 0.0)) if isinstance(e.get("time"), (int, float)) else 0.0)


def started_from(events: list[dict[str, Any]]) -> int | None:
    """The first epoch resumed from among an invocation's events (None if none resumed)."""
    for e in events:
        if e.get("event") == "resume":
            return e["epoch"]
    return None


class _ControllerLog:
    """An event log written from Ray Train's controller, a process of its own: it waits out an absent object store
    as the run's config says (services.storage_wait_s), not for the default."""

    def __init__(self, run_dir: str, config: Config | None = None):
        self.run_dir, self.config = run_dir, config

    def _append(self, event: dict[str, Any]) -> None:
        if self.config is not None:
            from trainflow.config import apply_to_process

            apply_to_process(self.config)
        append_event(self.run_dir, event)


class RecoveryLog(_ControllerLog, UserCallback):
    """Records each worker-group failure that Ray Train handles (or gives up on)."""

    def after_exception(self, run_context, worker_exceptions: dict[int, Exception]) -> None:
        rank, exc = sorted(worker_exceptions.items())[0]
        msg = str(exc).strip().splitlines()
        detail = next((ln for ln in reversed(msg) if ln.strip()), type(exc).__name__)
        self._append({"event": "error", "error": f"worker {rank}: {type(exc).__name__}: {detail}"[:500]})


class AttemptLog(_ControllerLog, ControllerCallback, WorkerGroupCallback):
    """On Ray Train's controller: each worker group it starts (how many workers, on which nodes), the resize checks
    of an elastic run that change its size, a preemption it detects (a drained node) and each restart (whether a
    preemption or a failure caused it, and which of the group's nodes Ray Core was draining then). Read back by
    `resizes`, which tells a drained node from a dead one."""

    def __init__(self, run_dir: str, config: Config | None = None, scaling: ScalingSection | None = None):
        """scaling: what the run's worker group asks for (a one-process family's one worker), else config's."""
        super().__init__(run_dir, config)
        self.scaling = scaling if scaling is not None else (config.scaling if config is not None else None)
        self.nodes: list[str] = []

    def after_worker_group_start(self, worker_group) -> None:
        workers = worker_group.get_workers()
        self.nodes = sorted({w.metadata.node_id for w in workers})
        self._append({"event": "attempt", "workers": len(workers), "nodes": self.nodes})

    def before_controller_execute_resize_decision(self, resize_decision) -> None:
        """A fixed-size run restarting on a cluster that lost the nodes it needs fails here, in seconds, naming what
        the cluster holds against what the config asks for (trainflow's pre-start check, again), instead of Ray
        Train waiting out failure.worker_start_timeout_s once per remaining restart. Elastic runs size themselves;
        with scaling.wait_for_resources an autoscaler may bring the nodes back."""
        scaling = self.scaling
        if scaling is None or not self.nodes or scaling.elastic or scaling.wait_for_resources:
            return  # before the first group: trainflow checked the cluster before training
        from trainflow.trainer.resources import check_fits

        check_fits(scaling.model_dump(), what=RESTART)

    def after_controller_state_update(self, previous_state, current_state) -> None:
        kind = type(current_state).__name__
        if kind == "PreemptingState" and type(previous_state).__name__ != "PreemptingState":
            info = current_state.preemption_info
            self._append({"event": "preemption", "nodes": sorted(info.preempted_node_to_ranks)})
        elif kind in ("RestartingState", "ReschedulingState"):
            from ray.train.v2.api.exceptions import PreemptionError

            error = current_state.training_failed_error
            event = {
                "event": "restart",
                "preempted": isinstance(error, PreemptionError),
                "nodes": self.nodes,
                "draining": sorted(set(self.nodes) & set(draining_nodes())),
            }
            if self.scaling is not None and not self.scaling.wait_for_resources:
                event["gone"] = settle(self.nodes, event["draining"] if event["preempted"] else [])
            self._append(event)
        elif kind == "ResizingState" and type(previous_state).__name__ == "RunningState":
            self._append({"event": "resize_check", "workers": int(current_state.scaling_decision.num_workers)})


SETTLE_S = 90.0  # the longest a restart waits for Ray Core to declare an unreachable node dead
# a little longer than Ray Train's elastic policy reuses the reserved resources it read (1 s in Ray 2.60)
POLICY_CACHE_S = ElasticScalingPolicy.GET_RESERVED_RESOURCES_INTERVAL_S + 0.5


def settle(node_ids: list[str], drained: list[str] = (), limit_s: float = SETTLE_S) -> list[str]:
    """Before an elastic run's group restarts: wait until Ray Core has declared dead each of node_ids whose raylet
    no longer answers (it does so only after its health checks fail, 15-30 s by default), and each drained node of a
    preemption (its deadline has passed: the cloud takes it now), so that the restart is sized by the nodes that are
    there. Without the wait Ray Train counted the dead or draining node's resources, asked for the old size and
    waited out failure.worker_start_timeout_s (180 s) for a worker that could never start there. Returns the nodes
    found gone."""
    import socket

    def answers(node: dict[str, Any]) -> bool:
        try:
            socket.create_connection((node["NodeManagerAddress"], int(node["NodeManagerPort"])), timeout=2).close()
            return True
        except (OSError, KeyError, ValueError):
            return False

    nodes = _node_table(node_ids)
    gone = [n for n, node in nodes.items() if n in drained or not node.get("Alive") or not answers(node)]
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and any(_node_table(gone).get(n, {}).get("Alive") for n in gone):
        time.sleep(0.5)
    if gone:
        # Ray Train's elastic policy reads the nodes from Ray Data's AutoscalingCoordinator, which looks again only
        # every 20 s: make it look now (a recompute, as its callers that pin nodes ask for)
        try:
            coordinator = ray.get_actor("AutoscalingCoordinator", namespace="AutoscalingCoordinator")
            ray.get(coordinator.get_reserved_resources.remote("trainflow-settle", recompute=True), timeout=30)
        except Exception:  # noqa: BLE001 - none (a fixed-size run) or unreachable: Ray Train looks at its next tick
            pass
        # and the policy reuses what it read within the last POLICY_CACHE_S: its restart decision, made once this
        # returns, must read anew (a read from just before the loss sized a restart by the lost node, and the group
        # waited out failure.worker_start_timeout_s: 180 s in about one elastic run in two, 2026-12-06)
        time.sleep(POLICY_CACHE_S)
    return sorted(gone)


def draining_nodes() -> list[str]:
    """The nodes Ray Core is draining (a preemption notice, `ray drain-node`); none where it cannot say."""
    try:
        return list(ray._private.state.state.get_draining_nodes())  # Ray Train's preemption watcher reads the same
    except Exception:  # noqa: BLE001 - an old or unreachable GCS: no drains known
        return []


def _node_table(node_ids) -> dict[str, dict[str, Any]]:
    """Ray Core's node table rows of node_ids; none where Ray Core cannot be reached."""
    try:
        return {n["NodeID"]: n for n in ray.nodes() if n.get("NodeID") in node_ids}
    except Exception:  # noqa: BLE001 - not connected: nothing known
        return {}


def node_states(node_ids: set[str]) -> dict[str, dict[str, str]]:
    """{node id: {state: alive|dead, reason}} from Ray Core's node table (Ray's death reason and message)."""
    out: dict[str, dict[str, str]] = {}
    for node_id, node in _node_table(node_ids).items():
        alive = bool(node.get("Alive"))
        reason = "" if alive else str(node.get("DeathReasonMessage") or node.get("DeathReason") or "")
        out[node_id] = {"state": "alive" if alive else "dead", "reason": reason}
    return out


def resizes(events: list[dict[str, Any]], states: dict[str, dict[str, str]] | None = None) -> list[dict[str, Any]]:
    """Each change of the worker count between attempts: {time, epoch (where the new group started), from, to, why}.
    why names the nodes the group lost: drained (a preemption: Ray Train's watcher saw it, or Ray Core was draining
    it when the group restarted) or dead (with Ray's reason, from `states`: node_states at the time of reading),
    or says that an elastic run's resize check found room for more (or fewer) workers."""
    states = states or {}
    out: list[dict[str, Any]] = []
    previous: dict[str, Any] | None = None
    between: list[dict[str, Any]] = []
    for i, e in enumerate(events):
        if e.get("event") != "attempt":
            between.append(e)
            continue
        if previous is not None and e["workers"] != previous["workers"]:
            start = next((s for s in events[i + 1 :] if s.get("event") == "worker_start" and s.get("rank") == 0), {})
            out.append(
                {
                    "time": e["time"],
                    "epoch": start.get("from_epoch"),
                    "from": previous["workers"],
                    "to": e["workers"],
                    "why": _why(previous, e, between, states),
                }
            )
        previous, between = e, []
    return out


def _why(before: dict[str, Any], after: dict[str, Any], between: list[dict[str, Any]], states) -> str:
    drained = {n for b in between if b.get("event") == "preemption" for n in b.get("nodes", [])}
    drained |= {n for b in between if b.get("event") == "restart" for n in b.get("draining", [])}
    restarts = [b for b in between if b.get("event") == "restart"]
    lost = sorted(set(before.get("nodes", [])) - set(after.get("nodes", [])))
    if restarts or drained:
        parts = []
        for node in lost or sorted(drained):
            if node in drained or any(r.get("preempted") for r in restarts):
                parts.append(f"node {node[:12]} drained (a preemption)")
            elif states.get(node, {}).get("state") == "dead":
                reason = states[node].get("reason")
                parts.append(f"node {node[:12]} died" + (f" ({reason})" if reason else ""))
            else:
                parts.append(f"node {node[:12]} lost its worker(s)")
        failure = next((b["error"] for b in between if b.get("event") in ("error", "hang")), None)
        if not parts:
            parts.append(f"a worker failed: {failure}" if failure else "the worker group restarted")
        return "; ".join(parts) + f"; restarted with the {after['workers']} worker(s) the cluster held"
    if after["workers"] > before["workers"]:
        return f"capacity returned: a resize check found room for {after['workers']} worker(s)"
    return f"a resize check found room for only {after['workers']} worker(s)"


def run_resizes(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """resizes() with the nodes' states read from Ray Core now (a dead node's reason), when the run resized."""
    attempts = [e for e in events if e.get("event") == "attempt"]
    if len({a.get("workers") for a in attempts}) < 2:
        return []
    return resizes(events, node_states({n for a in attempts for n in a.get("nodes", [])}))


def describe_resize(r: dict[str, Any]) -> str:
    """'epoch 3: 2 -> 1 worker(s): node 5f2c... died (...)' (the progress log line and MLflow's tag)."""
    return f"epoch {r.get('epoch')}: {r['from']} -> {r['to']} worker(s): {r['why']}"
