"""What a family's worker loop reads from and reports to Ray Train, and the loop that trains several folds inside one
Ray Train run.

Cross-fitting trains K fold models per family. Each used to be a Ray Train run of its own, and each run paid Ray
Train's start (a controller, a worker group, a synchronization actor: about 12 s on two cores) for under a second of
fitting on a small table. `fold_loop` trains a family's folds one after another inside one run: the worker group
starts once, each fold reads its own datasets (`train_<k>`, `val_<k>`), reports its checkpoints into its own folder
(`<run>/fold<k>/checkpoint_...`, Ray Train's `checkpoint_dir_name`) with `fold` among the metrics, and keeps its own
folder for what the family writes beside them (trainflow's events, CatBoost's snapshot). A restarted worker group
(a dead worker, a lost node, a rerun of the run name) resumes the fold Ray Train's latest checkpoint belongs to,
from that checkpoint; the folds before it are finished and are not trained again.

A small table's families can share one run too (`FamiliesLoop`): one worker trains every family's folds one after
another, each family in its own folder of the run (`<run>/<family run>/fold<k>/checkpoint_...`), so Ray Train's start
is paid once per retrain. A restart resumes the family and fold of the latest checkpoint; a family whose code raises
is recorded as failed (FAILED_FILE in its folder) and the next family trains. Where model.type auto may leave out a
family that does not earn its time (`not_earning`), the same run trains the first family's folds, then every other
family's first fold, then the other folds of those the rule keeps (a family left out: LEFT_OUT_FILE in its folder,
with why): the rule is applied in the worker, so it costs no second start.

A family's code calls `dataset_shard`, `get_checkpoint` and `report` here instead of `ray.train`'s: outside a fold
loop they are Ray Train's own.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator
from typing import Any, Callable

import ray.train

from trainflow.trainer.shards import table_shard

FOLD = "fold"  # the metric that names a report's fold
# a fold run's loop config: {fold: its training rows} (the non-test rows less its own), which a fold's loop counts as
# its training rows ("train_rows") where the preprocessor's count (every non-test row) is not what it trains on
FOLD_TRAIN_ROWS = "fold_train_rows"
FAMILY = "family"  # in a run several families share: the metric that names a report's family
FOLD_FOLDER = re.compile(r"^fold(\d+)$")
FAILED_FILE = "trainflow_failed.json"  # in a family's folder of a shared run: why its code raised
LEFT_OUT_FILE = "trainflow_left_out.json"  # in a family's folder of a shared run: why its other folds did not train

# auto, cross-fitted: a family whose first fold gains less than this share of the best first fold's gain over a model
# with no skill (its validation loss against the loss of predicting the training rows' class shares, or their mean)
# trains no more folds: greedy ensemble selection seldom gives such a member weight. A ratio of losses was tried
# first: a network that learnt nothing (log loss 0.684 against the class shares' 0.69) was within 1.5x of CatBoost's
# 0.515 and kept. Only where the fold holds enough rows to tell (on iris' 19 rows the first folds' log losses were
# 0.027 for LightGBM and 0.134 for XGBoost, while LightGBM was the weaker on the held-out rows)
NOT_EARNING = 0.5
NOT_EARNING_MIN_ROWS = 200

# while a fit runs in Ray Train's local mode (trainer/runner.py local_fit): (the run's folder, the caller's on_report).
# Local mode persists no checkpoint (Ray 2.60's LocalTrainFnUtils keeps the last one reported, in memory), so report
# writes each into the folder Ray Train would have, and the run's latest on disk is the one a fit resumes from
_local: contextvars.ContextVar[tuple[str, Callable[[dict[str, Any]], None]] | None] = contextvars.ContextVar(
    "trainflow_local", default=None
)

# (fold, the checkpoint it resumes from, (family, its folder in a shared run) or None) while a fold loop trains a fold
_fold: contextvars.ContextVar[tuple[int, Any, tuple[str, str] | None] | None] = contextvars.ContextVar(
    "trainflow_fold", default=None
)


def fold_folder(fold: int) -> str:
    """The folder of fold k inside its family's run: its checkpoints, events and snapshots."""
    return f"fold{fold}"


def dataset_shard(name: str):
    """This worker's shard of dataset name ("train", "val"): the current fold's own inside a fold loop; a table this
    process holds (trainer/shards.py InProcessRows) is read where it is."""
    current = _fold.get()
    name = name if current is None else f"{name}_{current[0]}"
    return table_shard(name) or ray.train.get_dataset_shard(name)


def get_checkpoint():
    """The checkpoint to resume from: Ray Train's latest, or inside a fold loop the current fold's (None for a fold
    that starts fresh)."""
    current = _fold.get()
    return run_checkpoint() if current is None else current[1]


def run_checkpoint():
    """The run's latest checkpoint: Ray Train's, or in local mode the newest complete one in the run's folder."""
    local = _local.get()
    if local is None:
        return ray.train.get_checkpoint()
    from trainflow.trainer.serving.checkpoint import latest_in_run

    return latest_in_run(local[0])


def check_stop() -> None:
    """In local mode, end the fit once its process was asked to stop (SIGTERM: a cancelled flow run, Ctrl-C's
    kill): a worker group ends when the stop shuts Ray down, a loop in the flow's own process would train on. Raised
    between steps: the latest checkpoint in storage is where a rerun of the run name resumes."""
    if _local.get() is None:
        return
    from trainflow.run.runtime import stop_requested

    if stop_requested():
        raise RuntimeError("training stopped: this process was asked to stop (SIGTERM)")


@contextlib.contextmanager
def local_threads(config: Any) -> Iterator[None]:
    """In local mode, torch's intra-op threads for the fit: as many as the family's own worker would have had (its
    `scaling.resources_per_worker.CPU`, default 1; Ray gives a worker of N CPUs OMP_NUM_THREADS=N), the process's
    count restored after. On 2 cores a small network trained its 5 folds of 1,500 rows in 8.5-9.4 s on one thread
    against 17.5-19.7 s on two (its batches are too small to split). Elsewhere nothing changes."""
    if _local.get() is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(float((config.scaling.resources_per_worker or {}).get("CPU", 1)))))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def worker_cpus() -> int:
    """The CPUs this worker may use: those Ray assigned it, or in local mode those of the process it runs in."""
    if _local.get() is not None:
        import os

        return max(1, len(os.sched_getaffinity(0)))
    return max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))


def report(metrics: dict[str, Any], checkpoint=None, **kwargs: Any) -> None:
    """ray.train.report; inside a fold loop the metrics name the fold and a checkpoint goes into the fold's folder.
    In local mode the checkpoint is written into the run's folder here and the metrics handed to the caller."""
    from ray.train.v2._internal.execution.storage import StorageContext

    current, name = _fold.get(), None
    if current is not None:
        fold, _, shared = current
        metrics = {**metrics, FOLD: fold, **({FAMILY: shared[0]} if shared else {})}
        name = f"{fold_folder(fold)}/{StorageContext.make_default_checkpoint_dir_name()}"
        if shared:
            name = f"{shared[1]}/{name}"
    local = _local.get()
    if local is not None:
        if checkpoint is not None:
            from trainflow.run.storage import join
            from trainflow.trainer.serving.checkpoint import persist

            persist(checkpoint.path, join(local[0], name or StorageContext.make_default_checkpoint_dir_name()))
            if kwargs.get("delete_local_checkpoint_after_upload"):
                import shutil

                shutil.rmtree(checkpoint.path, ignore_errors=True)
        local[1](metrics)
        ray.train.report(metrics)  # Ray's own record of the last metrics (the fit's result)
        return
    if name is not None:
        kwargs["checkpoint_dir_name"] = name  # every rank passes a name; Ray Train keeps rank 0's
    ray.train.report(metrics, checkpoint=checkpoint, **kwargs)


def train_rows(loop_config: dict[str, Any], preprocessor_rows: int) -> int:
    """The rows this fit trains on: a fold's own (FOLD_TRAIN_ROWS), else the preprocessor's count."""
    return int(loop_config.get("train_rows") or preprocessor_rows)


def fold_of(checkpoint) -> int | None:
    """The fold a checkpoint of a fold loop belongs to (from its folder's parent), or None."""
    if checkpoint is None:
        return None
    parts = str(checkpoint.path).rstrip("/").split("/")
    found = FOLD_FOLDER.match(parts[-2]) if len(parts) >= 2 else None
    return int(found.group(1)) if found else None


def family_folder_of(checkpoint) -> str | None:
    """The family folder a checkpoint of a shared run belongs to (the fold folder's parent), or None."""
    if fold_of(checkpoint) is None:
        return None
    parts = str(checkpoint.path).rstrip("/").split("/")
    return parts[-3] if len(parts) >= 3 else None


def not_earning(mine: float, others: dict[str, float], base: float, fold_rows: int, k: int) -> str | None:
    """Why a family whose first fold's best validation loss is `mine` is not worth its other folds, against the
    first folds of the families before it (others: family -> loss) and a model with no skill (base); None: keep it."""
    if not others or fold_rows < NOT_EARNING_MIN_ROWS:
        return None
    best = min(others, key=others.get)
    gain, best_gain = base - mine, base - others[best]
    if best_gain <= 0 or gain >= NOT_EARNING * best_gain:
        return None
    return (
        f"its first fold's validation loss {mine:.4g} gains {gain:.3g} over a model with no skill ({base:.4g}), "
        f"under {NOT_EARNING:g} of the best first fold's gain ({best} {others[best]:.4g}: {best_gain:.3g}); its "
        f"folds of {k} not yet started were not trained"
    )


def best_val_loss(history: list[dict[str, Any]]) -> float | None:
    """The lowest validation loss of a run's history (None: it reported none)."""
    losses = [h["val_loss"] for h in history if isinstance(h.get("val_loss"), (int, float))]
    return min(losses) if losses else None


class FoldLoop:
    """A family's per-worker loop run once per fold of loop_config["folds"], in order, inside one Ray Train run
    (picklable, so Ray can ship it to the workers). Each fold's loop config names its fold, its own folder as its
    run_dir, the run's folder for the deadline (trainer/deadline.py) and the folds left with it, which share the
    run's deadline."""

    def __init__(self, train_fn: Callable[[dict[str, Any]], Any]):
        self.train_fn = train_fn

    def __call__(self, loop_config: dict[str, Any]) -> None:
        self.train(loop_config, run_checkpoint(), loop_config["run_dir"])

    def train(
        self,
        loop_config: dict[str, Any],
        latest,
        deadline_dir: str,
        later: int = 0,
        shared: tuple[str, str] | None = None,
    ) -> None:
        """The folds, resuming the one latest belongs to from it (earlier ones finished); later: this family's folds
        that a later fit of a shared run trains (they share its time); shared: (family, its folder)."""
        from trainflow.run.storage import join

        folds = list(loop_config["folds"])
        rows = loop_config.get(FOLD_TRAIN_ROWS) or {}
        at = fold_of(latest)
        if at not in folds:  # no checkpoint, or one of a fold another fit of this run trained (finished)
            at = None
        for n, fold in enumerate(folds):
            if at is not None and fold < at:  # finished before the restart: its checkpoints are in storage
                continue
            token = _fold.set((fold, latest if fold == at else None, shared))
            try:
                self.train_fn(
                    {
                        **loop_config,
                        "run_dir": join(loop_config["run_dir"], fold_folder(fold)),
                        "deadline_dir": deadline_dir,
                        "folds_left": len(folds) - n + later,
                        FOLD: fold,
                        **({"train_rows": rows[fold]} if fold in rows else {}),
                    }
                )
            finally:
                _fold.reset(token)


class FamiliesLoop:
    """Several families' fold loops one after another in one worker of one Ray Train run (a small table's: see the
    module's docstring). jobs: (family, its folder in the run, its per-worker loop); loop_config["jobs"]: each
    folder's own loop config (its config, folds, lineage, folds_after: its folds a later fit trains) over the run's.

    The time budget is the families' as train.time_limit shares it (trainer/deadline.py TimeShare): a family may use
    all the time left, each of its folds its part of it, so the order is their priority; under auto
    (loop_config["auto_time"]: the training's start and the floor) there is no deadline until the first family has
    trained, then the others share max(T1, floor - T1), set on the driver's board as TimeShare would."""

    def __init__(self, jobs: list[tuple[str, str, Callable[[dict[str, Any]], Any]]]):
        self.jobs = jobs

    def __call__(self, loop_config: dict[str, Any]) -> None:
        latest = run_checkpoint()
        rule = loop_config.get("not_earning")
        phases = self.phases(loop_config["jobs"], rule)
        at = (family_folder_of(latest), fold_of(latest))
        start = next((n for n, (i, folds, _) in enumerate(phases) if self.jobs[i][1] == at[0] and at[1] in folds), 0)
        left_out: dict[str, str] | None = None
        # a family whose code raised in this fit before a restart (its FAILED_FILE) trains no more folds
        failed = {family for family, folder, _ in self.jobs if _failed_here(loop_config, folder)}
        for n, (i, folds, later) in enumerate(phases):
            family, folder, train_fn = self.jobs[i]
            if rule and left_out is None and folds[0] != rule["first_fold"]:  # every first fold trained: the rule
                left_out = _apply_not_earning(loop_config, rule)
            if n < start:  # trained (or failed) before the restart
                continue
            if family in failed or (left_out and family in left_out):
                continue
            # the latest checkpoint resumes its own family's fold only (one of a family not in this fit: none)
            if not self._train(
                loop_config, family, folder, train_fn, latest if folder == at[0] else None, folds, later
            ):
                failed.add(family)
            if n == 0 and loop_config.get("auto_time"):
                _first_family_ended(loop_config, family)

    def phases(self, own: dict[str, dict[str, Any]], rule: dict[str, Any] | None) -> list[tuple[int, list[int], int]]:
        """The order the jobs train in: (job, its folds, its folds a later phase or fit trains). Each family's folds
        in turn; under the not-earning rule the first family's folds, then every other family's first fold, then
        their other folds (those the rule keeps)."""
        if not rule:
            return [
                (i, list(own[folder]["folds"]), int(own[folder].get("folds_after", 0)))
                for i, (_, folder, _) in enumerate(self.jobs)
            ]
        head, firsts, rests = [], [], []
        for i, (family, folder, _) in enumerate(self.jobs):
            folds = list(own[folder]["folds"])
            if family == rule["first"] or folds[0] != rule["first_fold"]:
                head.append((i, folds, 0))
                continue
            firsts.append((i, folds[:1], len(folds) - 1))
            if len(folds) > 1:
                rests.append((i, folds[1:], 0))
        return [*head, *firsts, *rests]

    def _train(
        self, loop_config: dict[str, Any], family: str, folder: str, train_fn, latest, folds: list[int], later: int
    ) -> bool:
        """A family's folds; False: its code raised (recorded in FAILED_FILE, the next family trains)."""
        import json
        import traceback

        from trainflow.run.redact import redact_text
        from trainflow.run.storage import join, write_text

        config = {
            **loop_config,
            **loop_config["jobs"][folder],
            "folds": folds,
            "run_dir": join(loop_config["run_dir"], folder),
        }
        try:
            FoldLoop(train_fn).train(config, latest, loop_config["run_dir"], later, (family, folder))
        except Exception as exc:  # noqa: BLE001 - this family fails alone; the next one trains
            error = redact_text(f"{type(exc).__name__}: {exc}")
            print(f"trainflow: {family} failed in the shared run, the next family trains: {error}", flush=True)
            write_text(
                join(config["run_dir"], FAILED_FILE),
                json.dumps({"error": error[:4000], "traceback": redact_text(traceback.format_exc())[-8000:]}),
            )
            return False
        return True


def _first_family_ended(loop_config: dict[str, Any], family: str) -> None:
    """train.time_limit auto in a shared run: the first family trained in T1 seconds (since the training started),
    so the others share max(T1, floor - T1) from now: the deadline on the driver's board (as TimeShare sets it)."""
    import time

    board, rule = loop_config.get("deadline_board"), loop_config["auto_time"]
    if board is None:
        return
    done_s = time.time() - float(rule["started_at"])
    floor = float(rule["floor_s"])
    share = max(done_s, floor - done_s)
    why = (
        f"train.time_limit auto ({family} trained in {done_s:.0f} s, so the other families share {share:.0f} s: "
        f"training takes at most max(twice the first family's time, {floor:.0f} s))"
    )
    from trainflow.trainer.deadline import board_set

    try:
        board_set(board, loop_config["run_dir"], time.time() + share, why)
    except Exception:  # noqa: BLE001 - a board gone (the driver with it) is no deadline, never a failed run
        pass


def _failed_here(loop_config: dict[str, Any], folder: str) -> bool:
    """Whether a family's code raised in this fit (FAILED_FILE in its folder: the train task removes an earlier
    attempt's before the fit)."""
    from pyarrow.fs import FileType

    from trainflow.run.storage import filesystem_for, join

    fs, inner = filesystem_for(join(loop_config["run_dir"], folder, FAILED_FILE))
    return fs.get_file_info(inner).type == FileType.File


def _apply_not_earning(loop_config: dict[str, Any], rule: dict[str, Any]) -> dict[str, str]:
    """The not-earning rule over every family's first fold, in the training order (each against those before it, as
    their first folds were read): {family: why} for those whose other folds do not train, each also written to its
    folder (LEFT_OUT_FILE) for the driver. The losses come from each first fold's latest checkpoint in storage, so a
    restarted worker decides the same; a family whose first fold had time for one step only is left out too."""
    import json

    from trainflow.run.storage import join, read_text, write_text
    from trainflow.trainer.serving.checkpoint import METRICS_FILE, checkpoints_on_disk
    from trainflow.trainer.deadline import TIME_LIMITED

    seen: dict[str, float] = {}
    left_out: dict[str, str] = {}
    for family, folder in rule["order"]:
        if _failed_here(loop_config, folder):  # a family that failed is left out as failed, and beats no one
            continue
        found = checkpoints_on_disk(join(loop_config["run_dir"], folder, fold_folder(rule["first_fold"])))
        if not found:
            continue
        latest = found[-1]
        try:
            history = json.loads(read_text(join(latest["path"], METRICS_FILE)))["history"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        mine = best_val_loss(history if isinstance(history, list) else [])
        why = None
        if family != rule["first"]:
            if latest["metrics"].get(TIME_LIMITED) == 0:
                why = "its first fold had time for its first step only"
            elif mine is not None:
                why = not_earning(
                    mine, {f: v for f, v in seen.items() if f != family}, rule["base"], rule["fold_rows"], rule["k"]
                )
        if mine is not None:
            seen[family] = mine
        if why:
            left_out[family] = why
            write_text(join(loop_config["run_dir"], folder, LEFT_OUT_FILE), json.dumps({"why": why}))
            print(f"trainflow: {family} is left out after its first fold: {why}", flush=True)
    return left_out
