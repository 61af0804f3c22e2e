"""Checkpoint layout: everything needed to resume training or to serve the model.

Every family writes
    metrics.json     this epoch's (boosting round's) metrics and the history of every one so far
    preprocessor.json  the fitted preprocessor, as data
    config.json      the resolved trainflow config (secrets masked); its model.type names the family that reads the rest
    lineage.json     the training data's fingerprint and the hash of the training-relevant config (a resume checks them)
    warm_start.json  a warm-started fit's: the model it continued (train.warm_start: its URI, version, rounds)
torch families (mlp, torch)
    model.pt         weights (unwrapped from DDP), loaded with torch.load(weights_only=True)
    train_state.pt   optimizer and LR-schedule state, epoch, seed, early-stopping state (weights_only too)
boosted trees
    model.ubj (xgboost) or model.txt (lightgbm), the library's own model format, cut at the round
    train_state.json round, seed, early-stopping state
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from trainflow.preprocessors.tabular import TabularPreprocessor
from trainflow.run.redact import redact_config

if TYPE_CHECKING:  # torch is imported where a torch checkpoint is written or read: a booster's worker never needs it
    import torch

MODEL_FILE = "model.pt"
STATE_FILE = "train_state.pt"
METRICS_FILE = "metrics.json"
CONFIG_FILE = "config.json"
LINEAGE_FILE = "lineage.json"


def save_checkpoint(
    directory: str | Path,
    model_state: dict[str, torch.Tensor],
    train_state: dict[str, Any],
    metrics: dict[str, float],
    history: list[dict[str, float]],
    preprocessor: dict[str, Any],
    config: dict[str, Any],
    lineage: dict[str, str] | None = None,
    warm: dict[str, Any] | None = None,
) -> None:
    """Write a complete torch checkpoint into directory (rank 0 only); train_state holds at least 'epoch'."""
    import torch

    d = Path(directory)
    torch.save(model_state, d / MODEL_FILE)
    torch.save(train_state, d / STATE_FILE)
    write_common(d, int(train_state["epoch"]), metrics, history, preprocessor, config, lineage, warm)


def write_common(
    directory: str | Path,
    epoch: int,
    metrics: dict[str, Any],
    history: list[dict[str, float]],
    preprocessor: dict[str, Any],
    config: dict[str, Any],
    lineage: dict[str, str] | None = None,
    warm: dict[str, Any] | None = None,
) -> None:
    """The files every family's checkpoint holds: metrics and history, the preprocessor, the config, the lineage; and
    a warm-started fit's source (warm: train.warm_start's URI, version and rounds)."""
    d = Path(directory)
    if lineage:
        (d / LINEAGE_FILE).write_text(json.dumps(lineage))
    if warm:
        (d / WARM_FILE).write_text(json.dumps(warm))
    (d / METRICS_FILE).write_text(json.dumps({"epoch": epoch, "metrics": metrics, "history": history}, indent=1))
    TabularPreprocessor.from_dict(preprocessor).save(d)
    (d / CONFIG_FILE).write_text(json.dumps(redact_config(config), indent=1))  # no secrets in storage or the registry


WARM_FILE = "warm_start.json"  # a warm-started fit's checkpoints: the model it continued (train.warm_start)


def read_warm(directory: str | Path) -> dict[str, Any] | None:
    """The source model a checkpoint's fit continued ({"from", "version", "offset"}), or None."""
    path = Path(directory) / WARM_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def load_train_state(directory: str | Path) -> dict[str, Any]:
    import torch

    """Optimizer state, epoch and seed of a checkpoint."""
    return torch.load(Path(directory) / STATE_FILE, map_location="cpu", weights_only=True)


def load_weights(directory: str | Path) -> dict[str, torch.Tensor]:
    import torch

    return torch.load(Path(directory) / MODEL_FILE, map_location="cpu", weights_only=True)


def read_metrics(directory: str | Path) -> dict[str, Any]:
    """{'epoch', 'metrics', 'history'} of a checkpoint."""
    return json.loads((Path(directory) / METRICS_FILE).read_text())


def read_config(directory: str | Path) -> dict[str, Any]:
    return json.loads((Path(directory) / CONFIG_FILE).read_text())


def metric_value(metrics: dict[str, Any], name: str) -> float | None:
    """The metric as a finite float, or None when it is missing or NaN/inf."""
    v = metrics.get(name)
    if v is None:
        return None
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def warm_record(loop_config: dict[str, Any]) -> dict[str, Any] | None:
    """The source model a warm-started fit continues (its URI, version and rounds), for its checkpoints."""
    warm = loop_config.get("warm_start")
    return None if not warm else {k: warm.get(k) for k in ("from", "version", "offset")}


@contextlib.contextmanager
def warm_files(warm: dict[str, Any]) -> Iterator[Path]:
    """A warm start's source checkpoint files (shipped in the loop's config by tasks/warm.py) in a temporary folder."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="trainflow-warm-") as d:
        for name, data in warm["files"].items():
            (Path(d) / Path(name).name).write_bytes(data)
        yield Path(d)


def checkpoints_on_disk(run_path: str) -> list[dict[str, Any]]:
    """The run's readable checkpoints as {"path", "epoch", "metrics"}, oldest epoch first (local or URI)."""
    from trainflow.run.storage import join, list_dir, read_text

    found = []
    for name, is_dir in list_dir(run_path):
        if not (is_dir and name.startswith("checkpoint_")):
            continue
        path = join(run_path, name)
        try:
            meta = json.loads(read_text(join(path, METRICS_FILE)))
            found.append({"path": path, "epoch": int(meta["epoch"]), "metrics": dict(meta["metrics"])})
        except (OSError, ValueError, KeyError):
            continue
    return sorted(found, key=lambda c: c["epoch"])


def persist(folder: str, uri: str) -> None:
    """Copy a reported checkpoint's folder to uri (a fit in Ray Train's local mode, which persists none), its
    metrics.json last: a copy cut short has none, so no reader takes it for a checkpoint (the train task removes it
    as left over). The folder is left as it was."""
    from trainflow.run.storage import upload_files

    upload_files(uri, folder, METRICS_FILE)


def latest_in_run(run_path: str):
    """The newest complete checkpoint anywhere in a run's folder (its own, a fold's, a shared run's family's fold's)
    as a ray.train.Checkpoint, or None: what Ray Train restores a run from, for a fit in local mode. Ray Train names
    checkpoint folders by the time they were reported, so the newest name is the latest report."""
    from pyarrow.fs import FileSelector, FileType
    from ray.train import Checkpoint

    from trainflow.run.storage import filesystem_for

    fs, inner = filesystem_for(run_path)
    found = [
        info.path.rsplit("/", 1)[0]
        for info in fs.get_file_info(FileSelector(inner, recursive=True, allow_not_found=True))
        if info.type == FileType.File
        and info.base_name == METRICS_FILE
        and info.path.rsplit("/", 2)[-2].startswith("checkpoint_")
    ]
    if not found:
        return None
    return Checkpoint(max(found, key=lambda p: p.rsplit("/", 1)[-1]), filesystem=fs)
