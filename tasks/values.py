"""The values that cross task boundaries: what each step of the retrain hands the next (the flows chain the tasks;
no task module imports another)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import ray

from trainflow.data import Rows
from trainflow.roles.folds import FoldPlan
from trainflow.preprocessors.tabular import TabularPreprocessor
from trainflow.tables.files import TableSpec
from trainflow.trainer.evaluate import Scored
from trainflow.trainer.serving.servable import combine


@dataclass
class Ingested:
    dataset: Rows  # a small Parquet table: read by this process, cut by the split here
    spec: TableSpec
    materialized: bool = True  # kept in memory; else streamed from the files each time it is read
    table_bytes: int = 0  # in-memory size, from the files' metadata


@dataclass
class Split:
    """The rows of each role: Ray Datasets, or pyarrow tables for a small table read by this process (ingest's
    rule); training wraps them as Datasets when it starts (preprocess's pack)."""

    train: Rows
    val: Rows | None  # None with folds: each fold's held-out rows are its validation rows (folds)
    train_rows: int
    val_rows: int
    materialized: bool = True
    test: Rows | None = None  # read once: the final scoring and the gate
    test_rows: int = 0
    plan: FoldPlan | None = None
    split_path: str | None = None  # the assignment (key -> role and fold), Parquet
    # cross-fitting (plan.folds > 1): per fold model, its (training rows, held-out rows); train holds every non-test row
    folds: list[tuple[Rows, Rows]] | None = None
    note: str | None = None  # what the roles do not know: a table with dates split by a hash (time_hint)

    @property
    def fold_count(self) -> int:
        return len(self.folds) if self.folds else 1


@dataclass
class Prepared:
    preprocessor: TabularPreprocessor
    train: ray.data.Dataset | None  # None: validate's checks only (preprocess(packed=False))
    val: ray.data.Dataset | None
    materialized: bool
    budgets: dict[str, Any]  # per model family that trains: its budget (batch size, epochs, patience; or rounds)
    fingerprint: str = ""  # the training table's, recorded in every checkpoint
    left_out: dict[str, str] = field(default_factory=dict)  # model.type auto: family -> why it does not fit
    folds: list[tuple[ray.data.Dataset, ray.data.Dataset]] | None = None  # cross-fitting: each fold's, packed
    fold_rows: list[int] = field(default_factory=list)  # cross-fitting: each fold's rows (FoldPlan.fold_rows)
    warm: dict[str, Any] | None = None  # train.warm_start's record (tasks/warm.py): a continuation, or why not
    rows: int = 0  # the training and validation rows (the non-test rows): scaling.local_mode auto's size

    def warm_start_for(self, family: str) -> dict[str, Any] | None:
        """The source model a family's fit continues (its files, its rounds), or None."""
        return self.warm if self.warm and self.warm.get("family") == family else None


@dataclass
class TrainOutcome:
    run_name: str
    family: str  # the model.type this run trained
    run_path: str
    checkpoints: list[dict[str, Any]]  # {"path", "epoch", "metrics"}, as kept by CheckpointConfig
    history: list[dict[str, float]]
    resumed_from_epoch: int | None = None
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    resizes: list[dict[str, Any]] = field(default_factory=list)  # an elastic run's worker-count changes
    budget: dict[str, Any] = field(default_factory=dict)  # the resolved batch size, epochs and patience
    time_limited_at: int | None = None  # the epoch or round after which its train.time_limit share ran out
    train_s: float | None = None  # wall time of its fit in this flow run (worker start included)


@dataclass
class Selected:
    path: str  # a local folder (a download when the run lives in remote storage)
    epoch: int
    metrics: dict[str, Any]
    skipped: list[dict[str, str]]
    uri: str = ""  # where the checkpoint lives in storage_path


@dataclass
class Decisions:
    """The rows the choices after training read: each candidate's uncalibrated outputs and the encoded labels, in one
    row order (the out-of-fold predictions; an ensemble's added once it is built)."""

    prep: TabularPreprocessor
    outputs: dict[str, np.ndarray]
    labels: np.ndarray
    times: dict[str, pa.ChunkedArray] = field(default_factory=dict)  # roles by time: the time column, row by row
    keys: np.ndarray | None = None  # each row's number in the fold plan (FoldPlan.keys), for the ensemble's halves

    def scored(self, family: str) -> Scored:
        """A candidate's out-of-fold outputs as calibration reads them."""
        return Scored(self.prep, self.outputs[family], self.labels)

    def by_time(self, family: str) -> Scored | None:
        """Roles by time: a candidate's out-of-fold outputs with each row's time (the backtest's rows by time)."""
        return Scored(self.prep, self.outputs[family], self.labels, dict(self.times)) if self.times else None

    def with_ensemble(self, name: str, members: dict[str, float]) -> Decisions:
        """The ensemble's out-of-fold outputs (its members' weighted) beside the families'."""
        combined = combine(self.prep.task, [self.outputs[f] for f in members], list(members.values()))
        return Decisions(self.prep, {**self.outputs, name: combined}, self.labels, self.times, self.keys)


@dataclass
class EarlierFit:
    family: str
    recent: str | None  # the recent model's checkpoint folder (local), None when skipped
    earlier: str | None  # the earlier model's
    shift: float = 0.0  # the recent model's last training time minus the earlier one's (time_number units)
    run_name: str | None = None
    skipped: str | None = None  # why there is no earlier model


@dataclass
class Registered:
    run_id: str
    model_name: str
    model_version: str
    model_uri: str


@dataclass
class Promotion:
    decision: str
    reason: str
    metric: str
    mode: str
    margin: float
    min_score: float | None  # the floor (promotion.min_score)
    below_floor: bool  # the challenger scored worse than the floor: registered, never champion
    model_name: str
    challenger_version: str
    challenger_score: float | None
    champion_version: str | None
    champion_score: float | None
    serving_version: str | None  # the @champion version after the gate (None: no model has met the floor yet)
    serving_checkpoint: str  # its local checkpoint folder, for the flow's inference step
    confidence: dict | None = None  # the paired bootstrap of the gain (when both models scored)
    slices: dict | None = None  # column -> value -> the challenger's metrics, rows, judged, the champion's metric
    calibration: dict | None = None  # the challenger's ECE, Brier score and reliability bins (classification)
    judged_on: str = "test"  # the rows the scores come from: the test role (validation where the plan has none)
    rows: int = 0  # how many: with a champion, the rows held out from both models
    judged_rows_note: str | None = None  # by time or group: which rows those are, and why they tell the models apart
    checks: list = field(default_factory=list)  # the gate's rules' lines (tasks/gate_rules.py): rule, line

    def record(self) -> dict:
        """The summary JSON's `promotion` entry (slices and calibration have their own summary keys)."""
        return {k: v for k, v in asdict(self).items() if k not in ("serving_checkpoint", "slices", "calibration")}


@dataclass
class Predictions:
    path: str
    input_rows: int
    output_rows: int
    unseen: dict[str, int] = field(default_factory=dict)  # text column -> rows with a value never seen in training
    drift: dict[str, Any] = field(default_factory=dict)  # per feature: score, threshold, verdict; drifted_columns
    model: str = ""  # the model that predicted (a registry URI or a checkpoint folder)
    # a classifier scored in this process: its metrics estimated from the calibrated probabilities (CBPE, no labels)
    estimated: dict[str, float] = field(default_factory=dict)


def fit_history(family: str, trained: dict[tuple[str, int], Any]) -> dict[str, list[dict[str, Any]]]:
    """What a family's fits went through in this retrain: where each fit resumed (its fold, the epoch or round, the
    Ray Train run), each recovery (a dead worker or node, a hang, a killed process: the error and where it resumed)
    and each resize; empty lists when none did."""
    resumed, recovered, resized = [], [], []
    for (f, fold), outcome in sorted(trained.items(), key=lambda item: item[0][1]):
        if f != family:
            continue
        unit = outcome.budget.get("unit", "epoch")
        where = {"fold": fold, "run": outcome.run_name}
        if outcome.resumed_from_epoch is not None:
            resumed.append({**where, "unit": unit, "from": outcome.resumed_from_epoch})
        recovered += [{**where, "unit": unit, **r} for r in outcome.recoveries]
        resized += [{**where, **r} for r in outcome.resizes]
    return {"resumed": resumed, "recoveries": recovered, "resizes": resized}


def recovered_families(trained: dict[tuple[str, int], Any]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """fit_history of every family whose fits resumed, recovered or resized (the summary's `recovered`)."""
    out = {}
    for family in dict.fromkeys(f for f, _ in trained):
        history = fit_history(family, trained)
        if any(history.values()):
            out[family] = history
    return out


def describe_recovered(recovered: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """One line of what recovered: per family, its resumes and recoveries, fold by fold."""
    parts = []
    for family, h in recovered.items():
        said = [f"fold {r['fold']} resumed from {r['unit']} {r['from']}" for r in h["resumed"]]
        said += [
            f"fold {r['fold']} recovered from {_first_words(r['error'])} (resumed from {r['unit']} "
            f"{r['resumed_from_epoch']})"
            for r in h["recoveries"]
        ]
        if h["resizes"]:
            said.append(f"{len(h['resizes'])} resize(s)")
        parts.append(f"{family}: " + "; ".join(dict.fromkeys(said)))
    return " | ".join(parts)


def _first_words(text: str, most: int = 160) -> str:
    """An error's first line, cut to most characters (the whole one is in the summary's recoveries)."""
    line = " ".join(str(text).split())
    return line if len(line) <= most else line[: most - 3].rstrip() + "..."
