"""The per-worker train loop run by Ray Train's TorchTrainer, and the trainer factory."""

from __future__ import annotations

import math
import tempfile
import time
from typing import Any

import numpy as np
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from ray.train import DataConfig
from sklearn import metrics as skm
from torch import nn

from preprocessors.tabular import FEATURES, LABEL, TabularPreprocessor
from trainer.checkpoint import load_train_state, load_weights, read_metrics, save_checkpoint
from trainer.model import build_model
from trainer.recovery import append_event
from trainer.watchdog import heartbeat

STOP_REASON = "stop_reason"


class TrainValDataConfig(DataConfig):
    """Split 'train' in equal shards (DDP needs the same steps on every rank) and
    'val' in unequal ones, so every validation row is evaluated exactly once."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(datasets_to_split=["train"], **kwargs)

    def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
        rest = {k: v for k, v in datasets.items() if k != "val"}
        output = super().configure(rest, world_size, worker_handles, worker_node_ids, **kwargs)
        if "val" in datasets:
            val = datasets["val"]
            val.context.execution_options = self._resolve_execution_options("val")
            for i, shard in enumerate(val.streaming_split(world_size, equal=False)):
                output[i]["val"] = shard
        return output


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _loss_fn(task: str) -> nn.Module:
    return nn.CrossEntropyLoss() if task == "classification" else nn.MSELoss()


def iter_minibatches(shard, batch_size: int, device):
    """Mini-batches of batch_size rows (the last one may be smaller), in the shard's order.

    Ray Data hands over whole blocks (batch_size=None: zero-copy views of the object store, no
    re-batching), and the mini-batches are slices of them; only a mini-batch that straddles two
    blocks is copied together. Ray Data's own re-batching into 16 MB chunks cost 1.08-1.12 x the
    plain loop's epoch time (bench/training_parity.py), whole blocks 1.06-1.10.
    """
    held_x: list[torch.Tensor] = []  # the rows left over from earlier blocks, fewer than batch_size
    held_y: list[torch.Tensor] = []
    held = 0
    for batch in shard.iter_torch_batches(batch_size=None, device=device, prefetch_batches=1):
        heartbeat()
        x, y = batch[FEATURES], batch[LABEL]
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


def train_epoch(model, shard, optimizer, loss_fn, batch_size: int, device) -> float:
    """One pass over this worker's shard; returns the mean loss over every rank's rows."""
    model.train()
    losses, sizes = [], []
    for xb, yb in iter_minibatches(shard, batch_size, device):
        optimizer.zero_grad(set_to_none=True)
        out = model(xb)
        loss = loss_fn(out.squeeze(-1) if yb.dtype.is_floating_point else out, yb)
        loss.backward()
        optimizer.step()
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
def validate_epoch(model, shard, loss_fn, task: str, prep: TabularPreprocessor, batch_size: int, device) -> dict[str, float]:
    """Metrics over the whole validation set: every rank evaluates its shard, then all gather."""
    model.eval()
    outs, labels = [], []
    for xb, yb in iter_minibatches(shard, batch_size, device):
        outs.append(model(xb).float().cpu().numpy())
        labels.append(yb.cpu().numpy())
    width = prep.num_outputs
    out = _gather(np.concatenate(outs) if outs else np.zeros((0, width), np.float32))
    y = _gather(np.concatenate(labels) if labels else np.zeros((0,), np.int64 if task == "classification" else np.float32))
    return compute_metrics(task, out, y, prep)


def compute_metrics(task: str, out: np.ndarray, y: np.ndarray, prep: TabularPreprocessor) -> dict[str, float]:
    """Validation metrics from raw model outputs and encoded labels (sklearn)."""
    if len(y) == 0:
        return {"val_loss": float("nan")}
    if task == "classification":
        logits = torch.from_numpy(out)
        target = torch.from_numpy(y.astype(np.int64))
        probs = torch.softmax(logits, dim=1).numpy()
        pred = probs.argmax(axis=1)
        labels = list(range(prep.num_outputs))
        m = {
            "val_loss": float(nn.functional.cross_entropy(logits, target)),
            "val_accuracy": float(skm.accuracy_score(y, pred)),
            "val_f1": float(
                skm.f1_score(y, pred, average="binary" if len(labels) == 2 else "macro", labels=labels, zero_division=0)
            ),
        }
        if len(labels) == 2 and len(np.unique(y)) == 2:
            m["val_roc_auc"] = float(skm.roc_auc_score(y, probs[:, 1]))
        return m
    pred_std = out.reshape(-1)
    m = {"val_loss": float(np.mean((pred_std - y) ** 2))}
    pred = pred_std * prep.label_std + prep.label_mean
    truth = y * prep.label_std + prep.label_mean
    m["val_rmse"] = float(math.sqrt(skm.mean_squared_error(truth, pred)))
    m["val_mae"] = float(skm.mean_absolute_error(truth, pred))
    m["val_r2"] = float(skm.r2_score(truth, pred)) if len(truth) > 1 else float("nan")
    return m


def train_fn_per_worker(loop_config: dict[str, Any]) -> list[dict[str, float]]:
    """Ray Train entry point: resume from get_checkpoint() if any, then train the remaining epochs."""
    cfg = loop_config["config"]
    prep = TabularPreprocessor.from_dict(loop_config["preprocessor"])
    task, seed = cfg["task"], int(cfg["split"]["seed"])
    epochs, batch_size, lr = cfg["train"]["epochs"], cfg["train"]["batch_size"], cfg["train"]["learning_rate"]
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    device = ray.train.torch.get_device()

    torch.manual_seed(seed)
    model = build_model(prep.num_features, prep.num_outputs, cfg["model"]["hidden_sizes"], cfg["model"]["dropout"])
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    start_epoch, history = 0, []
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            model.load_state_dict(load_weights(d))
            state = load_train_state(d)
            optimizer.load_state_dict(state["optimizer"])
            start_epoch = int(state["epoch"]) + 1
            history = read_metrics(d)["history"]
        if rank == 0 and loop_config.get("run_dir"):
            append_event(loop_config["run_dir"], {"event": "resume", "epoch": start_epoch})
    if loop_config.get("run_dir"):
        # which node each rank ran on, per attempt: where a run spread, and where it restarted after a failure
        append_event(loop_config["run_dir"], {
            "event": "worker_start", "rank": rank, "node_id": ray.get_runtime_context().get_node_id(),
            "from_epoch": start_epoch,
        })
    model = ray.train.torch.prepare_model(model)
    # optimizer state was loaded on CPU; move it next to the (possibly GPU) parameters
    for st in optimizer.state.values():
        for k, v in st.items():
            if torch.is_tensor(v) and k != "step":
                st[k] = v.to(device)

    loss_fn = _loss_fn(task)
    train_shard = ray.train.get_dataset_shard("train")
    val_shard = ray.train.get_dataset_shard("val")
    for epoch in range(start_epoch, epochs):
        heartbeat(f"the start of epoch {epoch}")
        # Seeding per (seed, epoch, rank) makes dropout identical whether an epoch runs fresh or after a resume.
        torch.manual_seed(seed * 100_003 + epoch * 1009 + rank)
        t0 = time.perf_counter()
        train_loss = train_epoch(model, train_shard, optimizer, loss_fn, batch_size, device)
        epoch_time = time.perf_counter() - t0
        metrics = {"epoch": epoch, "train_loss": train_loss, "epoch_time_s": epoch_time}
        if not math.isfinite(train_loss):
            # Reported, not raised: a raise would be retried by FailureConfig, and NaN does not heal.
            ray.train.report({**metrics, STOP_REASON: f"train loss became {train_loss} at epoch {epoch}"}, checkpoint=None)
            return history
        metrics.update(validate_epoch(model, val_shard, loss_fn, task, prep, batch_size * 4, device))
        history.append(metrics)
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = None
            if rank == 0:
                save_checkpoint(tmp, model, optimizer, epoch, seed, metrics, history, loop_config["preprocessor"], cfg)
                ckpt = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report(metrics, checkpoint=ckpt)
        heartbeat(f"the report of epoch {epoch}")
    return history
