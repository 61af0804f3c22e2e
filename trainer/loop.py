"""The per-worker train loop run by Ray Train's TorchTrainer, and the trainer factory."""

from __future__ import annotations

import copy
import functools
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from torch import nn

from trainflow.config import Config, TrainSection
from trainflow.preprocessors.tabular import FEATURES, LABEL, TabularPreprocessor
from trainflow.trainer import session
from trainflow.trainer.budget import EarlyStopping, fusable, lr_factor, resolve_budget
from trainflow.trainer.families import family_for
from trainflow.trainer.families.base import Family
from trainflow.trainer.metrics import compute_metrics
from trainflow.trainer.serving.checkpoint import (
    load_train_state,
    load_weights,
    read_metrics,
    save_checkpoint,
    warm_files,
    warm_record,
)
from trainflow.trainer.reporting import record_start, report_step
from trainflow.trainer.steps import Steps
from trainflow.trainer.watchdog import heartbeat


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _loss_fn(task: str, class_weight: torch.Tensor | None = None, label_smoothing: float = 0.0) -> nn.Module:
    return (
        nn.CrossEntropyLoss(weight=class_weight, label_smoothing=label_smoothing)
        if task == "classification"
        else nn.MSELoss()
    )


def iter_minibatches(shard, batch_size: int, device, generator: torch.Generator | None = None):
    """Mini-batches of batch_size rows (the last one may be smaller), in the shard's order.

    Ray Data hands over whole blocks (batch_size=None: zero-copy views of the object store, no
    re-batching), and the mini-batches are slices of them; only a mini-batch that straddles two
    blocks is copied together: Ray Data's own re-batching is slower (training-parity, docs/performance.md).

    With a generator each block's rows are visited in a fresh seeded order: the shuffle of a streamed
    shard, whose blocks already arrive in a random order of the files. Ray's local shuffle buffer
    (iter_torch_batches(local_shuffle_buffer_size=...)) mixes across block boundaries but re-batches every
    1,024 rows in Python, several times slower; a block (a 32nd of the object store) is a larger window anyway.
    """
    held_x: list[torch.Tensor] = []  # the rows left over from earlier blocks, fewer than batch_size
    held_y: list[torch.Tensor] = []
    held = 0
    for batch in shard.iter_torch_batches(batch_size=None, device=device, prefetch_batches=1):
        heartbeat()
        x, y = batch[FEATURES], batch[LABEL]
        if generator is not None:
            order = torch.randperm(len(y), generator=generator).to(y.device)
            x, y = x.index_select(0, order), y.index_select(0, order)  # several times faster than x[order]
        start = 0
        if held:
            start = min(batch_size - held, len(y))
            held_x.append(x[:start])
            held_y.append(y[:start])
            held += start
            if held < batch_size:
                continue
            yield torch.cat(held_x), torch.cat(held_y)
            held_x, held_y, held = [], [], 0
        end = start + (len(y) - start) // batch_size * batch_size
        for i in range(start, end, batch_size):
            heartbeat()  # per mini-batch too: one block can hold minutes of steps on a slow device
            yield x[i : i + batch_size], y[i : i + batch_size]
        if end < len(y):
            held_x, held_y, held = [x[end:]], [y[end:]], len(y) - end
    if held:
        yield torch.cat(held_x), torch.cat(held_y)


CHUNKS_PER_BATCH = 16  # a shuffled mini-batch draws its rows from at least this many places of the shard
GATHER_BYTES = 4 * 2**20  # a shuffled epoch copies its rows in pieces of about this size, several batches each


def run_length(batch_size: int) -> int:
    """Rows per run of a shuffled epoch: the largest divisor of batch_size that is at most
    batch_size // CHUNKS_PER_BATCH, so every mini-batch is whole runs (1: permute single rows)."""
    top = batch_size // CHUNKS_PER_BATCH
    return next((r for r in range(top, 1, -1) if batch_size % r == 0), 1)


class CachedShard:
    """A worker's whole shard held as two tensors after its first pass, for tables that fit in memory.

    Small tables train for hundreds of short epochs; re-reading them through Ray Data costs more per
    epoch than the epoch itself. Each epoch then visits the rows in a fresh seeded order.
    """

    def __init__(self, shard, device) -> None:
        xs, ys = [], []
        for xb, yb in iter_minibatches(shard, 1 << 30, device):
            xs.append(xb)
            ys.append(yb)
        self.x = torch.cat(xs) if xs else torch.zeros((0, 0), device=device)
        self.y = torch.cat(ys) if ys else torch.zeros((0,), device=device)

    def minibatches(self, batch_size: int, generator: torch.Generator | None = None):
        """ceil(rows / batch_size) mini-batches on every rank (DDP needs the same number of steps everywhere), in
        a fresh seeded order each epoch. The order permutes runs of consecutive rows (run_length: at least
        CHUNKS_PER_BATCH runs per batch) whose boundaries move by a random offset every epoch; the split shuffled
        the rows once already. Several batches' runs are copied at once as blocks of a (runs, run, features) view,
        near the cost of a memory copy, not gathered row by row per batch (training-parity, docs/performance.md).
        The rows outside whole batches of runs (the offset's head, the tail) make the last batch or two. Small
        batches permute single rows."""
        n = len(self.y)
        if generator is None:
            for i in range(0, n, batch_size):
                heartbeat()
                yield self.x[i : i + batch_size], self.y[i : i + batch_size]
            return
        run = run_length(batch_size)
        offset = int(torch.randint(run, (1,), generator=generator)) if run > 1 else 0
        count = (n - offset) // run  # whole runs after the offset
        per_batch = batch_size // run
        perm = torch.randperm(count, generator=generator).to(self.y.device)
        whole = count // per_batch * per_batch  # runs that fill whole batches
        if run > 1 and whole:
            xs = self.x[offset : offset + count * run].view(count, run, -1)
            ys = self.y[offset : offset + count * run].view(count, run)
            row_bytes = max(1, self.x[:1].numel() * self.x.element_size())
            step = max(1, GATHER_BYTES // (batch_size * row_bytes)) * per_batch  # runs per copy
            for j in range(0, whole, step):
                idx = perm[j : min(j + step, whole)]
                bx, by = xs.index_select(0, idx).flatten(0, 1), ys.index_select(0, idx).flatten()
                for i in range(0, len(by), batch_size):
                    heartbeat()
                    yield bx[i : i + batch_size], by[i : i + batch_size]
        else:
            whole = 0
        # the rest: runs short of a whole batch, then the rows before the offset and after the last run
        rows = torch.arange(run, device=self.y.device)
        rest = torch.cat(
            [
                (offset + perm[whole:, None] * run + rows).flatten(),
                torch.arange(offset, device=self.y.device),
                torch.arange(offset + count * run, n, device=self.y.device),
            ]
        )
        for i in range(0, len(rest), batch_size):
            heartbeat()
            idx = rest[i : i + batch_size]  # index_select: several times faster than x[idx]
            yield self.x.index_select(0, idx), self.y.index_select(0, idx)


def _batches(source, batch_size: int, device, generator: torch.Generator | None = None, streamed: bool = False):
    """A cached shard or a streamed one visits its rows in the generator's order; a materialized one (already
    shuffled once by the split) in its own."""
    if isinstance(source, CachedShard):
        return source.minibatches(batch_size, generator)
    return iter_minibatches(source, batch_size, device, generator if streamed else None)


def member_loss(loss_fn, out: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    """The training loss of a batch's outputs: [rows, outputs], or [rows, members, outputs] from an ensemble that
    trains its members in parallel (TabM), each member's loss on every row, averaged."""
    if out.dim() == 3:
        yb = yb.repeat_interleave(out.shape[1])
        out = out.flatten(0, 1)
    return loss_fn(out.squeeze(-1) if yb.dtype.is_floating_point else out, yb)


def train_epoch(
    model, shard, optimizer, loss_fn, batch_size: int, device, scheduler=None, generator=None, streamed: bool = False
) -> float:
    """One pass over this worker's shard; returns the mean loss over every rank's rows."""
    model.train()
    losses, sizes = [], []
    for xb, yb in _batches(shard, batch_size, device, generator, streamed):
        optimizer.zero_grad(set_to_none=True)
        loss = member_loss(loss_fn, model(xb), yb)
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        # note: .item() here would be a sync point every step; keep the losses on the device instead
        losses.append(loss.detach())
        sizes.append(len(yb))
    total = torch.zeros(2, dtype=torch.float64, device=device)
    if losses:
        weights = torch.tensor(sizes, dtype=torch.float64, device=device)
        total[0] = torch.stack(losses).double() @ weights
        total[1] = weights.sum()
    if _distributed():
        dist.all_reduce(total)
    return (total[0] / total[1].clamp(min=1)).item()


def _gather(arr: np.ndarray) -> np.ndarray:
    if not _distributed():
        return arr
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, arr)
    return np.concatenate([p for p in parts if p is not None and len(p)])


@torch.no_grad()
def validate_epoch(
    model, shard, loss_fn, task: str, prep: TabularPreprocessor, batch_size: int, device
) -> dict[str, float]:
    """Metrics over the whole validation set: every rank evaluates its shard, then all gather."""
    model.eval()
    # the module itself, not its DDP wrapper: the ranks' validation shards are unequal, and DDP's forward broadcasts
    # the module's buffers (the embedding index buffers) from rank 0, a collective the ranks would call unequally often
    net = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    outs, labels = [], []
    for xb, yb in _batches(shard, batch_size, device):
        outs.append(net(xb).float().cpu().numpy())
        labels.append(yb.cpu().numpy())
    width = prep.num_outputs
    out = _gather(np.concatenate(outs) if outs else np.zeros((0, width), np.float32))
    y = _gather(
        np.concatenate(labels) if labels else np.zeros((0,), np.int64 if task == "classification" else np.float32)
    )
    return compute_metrics(task, out, y, prep)


def class_weights(train: TrainSection, prep: TabularPreprocessor) -> torch.Tensor | None:
    """Per-class loss weights: 'balanced' is n / (k * count), as scikit-learn's class_weight='balanced'."""
    spec = train.class_weight
    if spec is None or prep.task != "classification":
        return None
    if spec == "balanced":
        counts = np.array([prep.class_counts.get(str(c), 0) for c in prep.classes], dtype=np.float64)
        weights = counts.sum() / (len(counts) * np.maximum(counts, 1))
    else:
        unknown = sorted(set(spec) - {str(c) for c in prep.classes})
        if unknown:
            raise ValueError(
                f"train.class_weight: {unknown} are not classes of label {prep.label!r}; classes are {prep.classes}"
            )
        weights = np.array([spec.get(str(c), 1.0) for c in prep.classes], dtype=np.float64)
    return torch.tensor(weights, dtype=torch.float32)


@dataclass
class EpochState:
    """Everything a checkpoint of one epoch holds besides the preprocessor and config (CPU copies)."""

    epoch: int
    metrics: dict[str, float]
    history: list[dict[str, float]]
    model: dict[str, torch.Tensor]
    train_state: dict[str, Any]


# train.warm_start: a network continued from the source's weights learns at this share of its learning rate (a
# full rate would undo much of what it starts from in the first epochs)
WARM_LR_FACTOR = 0.1


def make_optimizer(model: nn.Module, train: Any) -> torch.optim.Optimizer:
    """AdamW, with PyTorch's fused kernel where every parameter allows it (budget.fusable); train: a network's train
    section (Family.train_section: _torch.NetworkTrain)."""
    params = list(model.parameters())
    return torch.optim.AdamW(params, lr=train.learning_rate, weight_decay=train.weight_decay, fused=fusable(params))


def _snapshot(model, optimizer, scheduler, stopper: EarlyStopping, epoch, seed, metrics, history) -> EpochState:
    unwrapped = model.module if hasattr(model, "module") else model
    return EpochState(
        epoch=epoch,
        metrics=dict(metrics),
        history=list(history),
        model={k: v.detach().to("cpu", copy=True) for k, v in unwrapped.state_dict().items()},
        train_state=copy.deepcopy(
            {
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "epoch": epoch,
                "seed": seed,
                "early_stopping": stopper.state(),
            }
        ),
    )


def _report(state: EpochState, rank: int, loop_config: dict[str, Any], metrics: dict[str, Any]) -> None:
    """One Ray Train report of state with its checkpoint, written by rank 0 (uploaded as checkpoint.upload says)."""
    config = loop_config["config"]

    def write(folder: str) -> None:
        save_checkpoint(
            folder,
            state.model,
            state.train_state,
            metrics,
            state.history,
            loop_config["preprocessor"],
            config.to_dict(),
            loop_config.get("lineage"),
            warm_record(loop_config),
        )

    report_step(metrics, rank, write, config, loop_config.get("run_dir") or "")
    heartbeat(f"the report of epoch {state.epoch}")


def _agree(decision: list[int], device) -> list[int]:
    """Rank 0's decision on every rank: each rank must make the same ray.train.report calls."""
    if not _distributed():
        return decision
    t = torch.tensor(decision, dtype=torch.int64, device=device)
    dist.broadcast(t, src=0)
    return [int(v) for v in t.tolist()]


def train_fn_per_worker(loop_config: dict[str, Any]) -> list[dict[str, float]]:
    """Ray Train entry point: resume from get_checkpoint() if any, then train until the budget or early stopping ends."""
    with session.local_threads(loop_config["config"]):
        return _train(loop_config)


def _resume(loop_config: dict[str, Any], model, stopper, train_cfg) -> tuple:
    """(the first epoch, the history so far, the training state, the train section): from the attempt's checkpoint
    (the weights into model, the early stopping's state into stopper), else from train.warm_start's source network's
    weights at a smaller learning rate, else a fresh start."""
    checkpoint = session.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            model.load_state_dict(load_weights(d))
            state = load_train_state(d)
            if "early_stopping" in state:
                stopper.load(state["early_stopping"])
            return int(state["epoch"]) + 1, read_metrics(d)["history"], state, train_cfg
    if loop_config.get("warm_start"):
        with warm_files(loop_config["warm_start"]) as d:
            model.load_state_dict(load_weights(d))
        train_cfg = train_cfg.model_copy(update={"learning_rate": train_cfg.learning_rate * WARM_LR_FACTOR})
    return 0, [], None, train_cfg


def adamw_schedule(model: nn.Module, train_cfg: Any, total_steps: int) -> tuple:
    """The default optimizer and schedule of a torch family (Family.optimizer None): AdamW, the schedule key's
    learning-rate multiplier per step."""
    optimizer = make_optimizer(model, train_cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        functools.partial(
            lr_factor,
            total_steps=total_steps,
            warmup_fraction=train_cfg.warmup_fraction,
            schedule=train_cfg.schedule,
        ),
    )
    return optimizer, scheduler


def _optimizer(model, train_cfg, total_steps: int, state: dict | None, family: Family) -> tuple:
    """The family's optimizer and its learning-rate schedule, their state restored from a resumed attempt's."""
    optimizer, scheduler = (family.optimizer or adamw_schedule)(model, train_cfg, total_steps)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        if "scheduler" in state:
            scheduler.load_state_dict(state["scheduler"])
    return optimizer, scheduler


def _train(loop_config: dict[str, Any]) -> list[dict[str, float]]:
    cfg: Config = loop_config["config"]
    prep = TabularPreprocessor.from_dict(loop_config["preprocessor"])
    family = family_for(cfg)  # it builds its network and says its train section and optimizer (Family)
    task, seed, train_cfg = cfg.task, cfg.split.seed, family.train_section(cfg)
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    device = ray.train.torch.get_device()
    rows = session.train_rows(loop_config, prep.train_rows)
    budget = resolve_budget(train_cfg, rows, cfg.scaling.max_workers, ctx.get_world_size())
    batch_size, epochs = budget.batch_size, budget.limit

    torch.manual_seed(seed)
    model = family.build(prep, cfg.model.model_dump(mode="json"))  # the checkpoint's config.json form, as serving
    stopper = EarlyStopping(cfg.checkpoint.mode, budget.patience, train_cfg.early_stopping.min_delta)
    start_epoch, history, state, train_cfg = _resume(loop_config, model, stopper, train_cfg)
    record_start(loop_config, rank, start_epoch, state is not None)
    if rank == 0 and start_epoch == 0:
        print(f"trainflow budget: {budget.to_dict()} over {rows} training rows and {ctx.get_world_size()} worker(s)")
    model = ray.train.torch.prepare_model(model)
    # built after the model is on its device, so load_state_dict puts the optimizer's state next to the parameters
    optimizer, scheduler = _optimizer(model, train_cfg, epochs * budget.steps_per_epoch, state, family)
    weights = class_weights(train_cfg, prep)
    # validation metrics stay unweighted and unsmoothed
    loss_fn = _loss_fn(task, None if weights is None else weights.to(device), train_cfg.label_smoothing)
    train_shard = session.dataset_shard("train")
    val_shard = session.dataset_shard("val")
    cache = loop_config.get("cache_shards", False)
    steps = Steps(
        loop_config,
        "epoch",
        start_epoch,
        epochs,
        history,
        stopper,
        rank=rank,
        agree=functools.partial(_agree, device=device),
        metric=cfg.checkpoint.metric,
    )
    if steps.finished:
        return history

    def report(state: EpochState, epoch: int, limited: bool) -> None:
        _report(state, rank, loop_config, steps.limited(state.metrics, epoch, limited))

    for epoch in range(start_epoch, epochs):
        # the first epoch of an attempt waits for its shard's first block (a streaming split starting up): start-up
        heartbeat(f"the start of epoch {epoch}", startup=epoch == start_epoch)
        # Seeding per (seed, epoch, rank) makes dropout identical whether an epoch runs fresh or after a resume.
        torch.manual_seed(seed * 100_003 + epoch * 1009 + rank)
        generator = torch.Generator().manual_seed(seed * 100_003 + epoch * 1009 + rank)
        t0 = time.perf_counter()
        if cache and not isinstance(train_shard, CachedShard):
            train_shard, val_shard = CachedShard(train_shard, device), CachedShard(val_shard, device)
        streamed = loop_config.get("streamed", False)
        train_loss = train_epoch(
            model, train_shard, optimizer, loss_fn, batch_size, device, scheduler, generator, streamed
        )
        metrics = {
            "epoch": epoch,
            "train_loss": train_loss,
            "epoch_time_s": time.perf_counter() - t0,
            "learning_rate": optimizer.param_groups[0]["lr"],
            "workers": ctx.get_world_size(),  # an elastic run's worker count, epoch by epoch (MLflow's `workers`)
        }
        if not math.isfinite(train_loss):
            steps.diverged(epoch, metrics, f"train loss became {train_loss} at epoch {epoch}", report)
            return history
        metrics.update(validate_epoch(model, val_shard, _loss_fn(task), task, prep, max(batch_size * 4, 1024), device))

        def capture(epoch=epoch, metrics=metrics) -> EpochState:
            return _snapshot(model, optimizer, scheduler, stopper, epoch, seed, metrics, history)

        # an epoch that could not end before the run's deadline is not started (its time: this one's, validation included)
        if steps.after(epoch, metrics, report, capture, next_step_s=time.perf_counter() - t0):
            break
    return history
