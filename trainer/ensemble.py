"""A weighted ensemble of several families' best checkpoints: greedy ensemble selection (Caruana et al., 2004, as
AutoGluon's WeightedEnsemble) on the validation split, an honest score for it, and its checkpoint folder.

The folder (trainer/serving/servable.py reads it: EnsemblePredictor) holds
    members/<family>/   each member's checkpoint files as selected (no training state, no calibration)
    ensemble.json       {"members": [{"family", "weight"}, ...], "rounds": ...}
    metrics.json, preprocessor.json, config.json (model.type ensemble), lineage.json, as every checkpoint
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import torch

from trainflow.data import Rows, arrow_batches
from trainflow.preprocessors.tabular import TabularPreprocessor
from trainflow.run.storage import is_uri, join, list_dir, localize, staging_folder, upload_dir, write_text
from trainflow.trainer.serving.checkpoint import write_common
from trainflow.trainer.serving.servable import ENSEMBLE, ENSEMBLE_FILE, combine, member_dir

ROUNDS = 25  # greedy picks (with replacement): weights are multiples of 1/25, as AutoGluon's default
LEFT_OUT = ("train_state.pt", "train_state.json", "calibration.json")  # what serving a member does not read


def member_outputs(
    predictors: dict[str, Callable[[np.ndarray], np.ndarray]],
    prep: TabularPreprocessor,
    ds: Rows,
    batch_size: int = 65536,
    keep: tuple[str, ...] = (),
    plan=None,
) -> tuple[dict[str, np.ndarray], np.ndarray, dict[str, pa.ChunkedArray], np.ndarray | None]:
    """Every member's raw outputs on every row of ds, the same rows in one pass, the encoded labels, the raw values
    of the columns in keep (a time column), and with a fold plan each row's number in it (FoldPlan.keys: its hash, or
    minus its time), in the same row order."""
    outs: dict[str, list[np.ndarray]] = {f: [] for f in predictors}
    labels, kept, keys = [], {c: [] for c in keep}, []
    plan_columns = ([plan.time_column] if plan.time_column else list(plan.key_columns)) if plan is not None else []
    wanted = list(dict.fromkeys([*prep.feature_order, prep.label, *keep, *plan_columns]))
    for batch in arrow_batches(ds, wanted, batch_size):
        x = prep.transform_features(batch, strict=False)
        labels.append(prep.transform_label(batch))
        for c in keep:
            kept[c].extend(batch[c].chunks)
        if plan is not None:
            keys.append(plan.keys(batch))
        for family, predict in predictors.items():
            outs[family].append(predict(x))
    if not labels:
        raise ValueError("the validation split has no rows to weight the ensemble on")
    return (
        {f: np.concatenate(o) for f, o in outs.items()},
        np.concatenate(labels),
        {c: pa.chunked_array(v) for c, v in kept.items() if v},
        np.concatenate(keys) if keys else None,
    )


def _columns(task: str, outputs: list[np.ndarray], labels: np.ndarray) -> list[np.ndarray]:
    """What the greedy loss needs of each member per row: the probability of the true class, or the value."""
    if task == "regression":
        return [np.asarray(o, np.float64).reshape(-1) for o in outputs]
    rows = np.arange(len(labels))
    probs = [torch.softmax(torch.from_numpy(np.asarray(o, np.float32)), dim=1).double().numpy() for o in outputs]
    return [p[rows, labels.astype(np.int64)] for p in probs]


def greedy_weights(task: str, outputs: list[np.ndarray], labels: np.ndarray, rounds: int = ROUNDS) -> list[float]:
    """Caruana's ensemble selection with replacement: rounds times, add the member whose addition gives the lowest
    validation loss (log loss of the averaged probabilities, or squared error of the averaged values); a member's
    weight is the share of rounds that picked it (the best single member first, ties to the earlier member)."""
    cols = _columns(task, outputs, labels)
    y = np.asarray(labels, np.float64)
    total, counts = np.zeros(len(labels)), np.zeros(len(outputs))
    for k in range(1, rounds + 1):
        if task == "regression":
            losses = [np.mean(((total + c) / k - y) ** 2) for c in cols]
        else:
            losses = [-np.mean(np.log(np.clip((total + c) / k, 1e-12, 1.0))) for c in cols]
        best = int(np.argmin(losses))
        counts[best] += 1
        total += cols[best]
    return (counts / rounds).tolist()


def halves(keys: np.ndarray) -> np.ndarray:
    """Each row's half (0 or 1) by its number in the fold plan (FoldPlan.keys): below or from the median, so the
    halves are the plan's seeded hash halves, or by time the newer and the older half; whatever the rows' order."""
    return (keys >= np.median(keys)).astype(np.int8) if len(keys) else np.zeros(0, np.int8)


def cross_fitted(task: str, outputs: list[np.ndarray], labels: np.ndarray, half: np.ndarray) -> np.ndarray:
    """The ensemble's outputs on each row with weights fitted on the other half of the rows (half: each row's, from
    halves): a score from these is not flattered by weights fitted on the very rows scored, as the members' are not."""
    out = np.empty_like(outputs[0], dtype=np.float32)
    for k in (0, 1):
        fit, held = half != k, half == k
        if not held.any():
            continue
        weights = (
            greedy_weights(task, [o[fit] for o in outputs], labels[fit])
            if fit.any()
            else [1.0 / len(outputs)] * len(outputs)
        )
        out[held] = combine(task, [o[held] for o in outputs], weights)
    return out


def ensemble_dir(storage_path: str, run_name: str, weights: dict[str, float], members: dict[str, str]) -> str:
    """Where this ensemble lives: <storage>/<run>-ensemble/ensemble_<digest of its members and weights>, so a rerun
    over the same best checkpoints (a resumed run) finds the one it wrote."""
    digest = hashlib.blake2b(json.dumps([weights, members], sort_keys=True).encode(), digest_size=8).hexdigest()
    return join(storage_path, f"{run_name}-{ENSEMBLE}", f"{ENSEMBLE}_{digest}")


def write_ensemble(
    target: str,
    members: dict[str, str],
    weights: dict[str, float],
    metrics: dict[str, Any],
    preprocessor: dict[str, Any],
    config: dict[str, Any],
    lineage: dict[str, str],
) -> str:
    """The ensemble checkpoint at target (local or a storage URI), written whole or not at all; a local folder
    holding its files (target itself when local). An existing one (the same digest) is kept as it is."""
    model = {**config["model"], "type": ENSEMBLE, "members": list(weights)}
    marker = json.dumps(
        {"members": [{"family": f, "weight": w} for f, w in weights.items()], "rounds": ROUNDS}, indent=1
    )
    return write_bundle(
        target,
        {member_dir("", f): path for f, path in members.items()},
        ENSEMBLE_FILE,
        marker,
        metrics,
        preprocessor,
        {**config, "model": model},
        lineage,
    )


def write_bundle(
    target: str,
    parts: dict[Path, str],
    marker_file: str,
    marker: str,
    metrics: dict[str, Any],
    preprocessor: dict[str, Any],
    config: dict[str, Any],
    lineage: dict[str, str],
) -> str:
    """A checkpoint made of other checkpoints (parts: relative folder -> a local checkpoint to copy there, without
    training state or calibration) at target, written whole or not at all, its marker file last; a local folder
    holding its files (target itself when local). An existing one (its marker present) is kept as it is."""
    if not is_uri(target) and Path(target, marker_file).exists():
        return target
    if is_uri(target) and any(name == marker_file for name, _ in list_dir(target)):
        return localize(target)
    parent = Path(tempfile.mkdtemp(prefix="trainflow-bundle-")) if is_uri(target) else Path(target).parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = staging_folder(parent, Path(target).name)
    for where, path in parts.items():
        shutil.copytree(path, staging / where, ignore=shutil.ignore_patterns(*LEFT_OUT))
    write_common(staging, 0, metrics, [], preprocessor, config, lineage)
    if is_uri(target):  # the marker last: a folder without it is an upload cut short, never read, written again
        upload_dir(str(staging), target)
        write_text(join(target, marker_file), marker)
        (staging / marker_file).write_text(marker)
        return str(staging)
    (staging / marker_file).write_text(marker)
    try:
        os.rename(staging, target)
    except OSError:  # another run wrote the same checkpoint meanwhile: theirs is the same, ours goes
        shutil.rmtree(staging)
    return target
