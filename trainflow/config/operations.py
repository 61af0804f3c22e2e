"""What happens around training: the gate, calibration, validation, monitoring, MLflow, drift, inference, services."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (
    field_validator,
    model_validator,
)

from trainflow.config.base import _Section, key


class PromotionSection(_Section):
    metric: str | None = key(
        None,
        "the metric of the champion/challenger gate, scored on the test rows",
        shown="`checkpoint.metric` (`val_loss` if that is `train_loss`)",
    )
    mode: Literal["min", "max"] | None = key(None, "`min` or `max`", shown="from the metric")
    margin: float = key(0.0, "the challenger must beat the champion by more than this", ge=0.0)
    min_score: float | None = key(
        None,
        "the floor: a model worse than this on `promotion.metric` is registered and tagged "
        "(`trainflow.promotion.floor`) but never made `@champion`, the first one included; with no champion yet "
        "nothing is predicted",
    )
    confidence: float | None = key(
        0.95,
        "the challenger must beat the champion by more than the margin in at least this share of 100 paired "
        "bootstrap resamples of the judged test rows (about 5% false promotions, `python -m bench "
        "gate-honesty`); `null`: one comparison on the whole split decides",
        gt=0.0,
        lt=1.0,
    )
    slices: list[str] = key(
        doc="columns whose values slice the test rows: every metric per value, with row counts", default_factory=list
    )
    max_slice_drop: float | None = key(
        None,
        "reject a challenger whose `promotion.metric` is more than this worse "
        "than the champion's on any slice of `min_slice_rows` rows or more",
        ge=0.0,
    )
    min_slice_rows: int = key(30, "slices with fewer rows are reported, not judged", ge=1)
    min_test_rows: int = key(
        30,
        "the fewest test rows, held out from both the challenger and the champion, that a "
        "promotion may rest on; fewer: not promoted",
        ge=1,
    )
    approval: Literal["none", "required"] = key(
        "none",
        "`required`: once the gate decides to promote, the flow run suspends until a person approves or rejects the "
        "promotion in Prefect (a deployment's run; `trainflow retrain --approve` approves on the command line); "
        "`none`: the gate decides alone ([operations.md](operations.md#a-persons-approval))",
    )
    approval_timeout_h: float = key(
        72.0, "hours a suspended promotion waits for its answer; unanswered, it is not promoted", gt=0.0
    )

    @field_validator("margin", "min_score")
    @classmethod
    def _finite_margin(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v


class CalibrationSection(_Section):
    """Classification: probabilities calibrated on the validation split, stored in the checkpoint as data and
    applied wherever the model predicts. auto: when train.class_weight is set or the validation ECE is above
    max_ece, the family's method (a temperature for networks, Platt scaling for boosters' two classes), kept only
    when it lowers the ECE; temperature | platt: always that one; none: never."""

    method: Literal["auto", "temperature", "platt", "none"] = key(
        "auto",
        "classification: `auto` recalibrates on the out-of-fold or validation predictions when "
        "`train.class_weight` is set or their expected calibration error is above `max_ece` (a temperature for "
        "networks, Platt scaling for boosters; kept only when it lowers the ECE); `temperature`, `platt`, `none`",
    )
    max_ece: float = key(0.03, "`auto` recalibrates above this expected calibration error", ge=0.0, le=1.0)
    decision_threshold: Literal["none", "f1"] | float = key(
        "none",
        "two classes: the `prediction` column is the positive class when its probability reaches this; `f1`: "
        "the threshold that maximises F1 on the out-of-fold or validation predictions; `none`: the most "
        "probable class",
    )

    @field_validator("decision_threshold")
    @classmethod
    def _probability(cls, v: str | float) -> str | float:
        if isinstance(v, float) and not 0.0 < v < 1.0:
            raise ValueError("a number must lie between 0 and 1")
        return v


class ValidationSection(_Section):
    """Checks of the training data against the current champion's training baseline, before any training."""

    on_anomaly: Literal["fail", "warn"] = key(
        "fail",
        "`fail` or `warn` when the training data departs from the champion's "
        "([monitoring.md](monitoring.md) lists the checks)",
    )
    min_row_ratio: float = key(0.5, "training rows below this share of the champion's are a collapse", ge=0.0, le=1.0)
    max_null_increase: float = key(0.1, "a column's null rate rising by more than this is an anomaly", ge=0.0, le=1.0)
    max_label_shift: float = key(
        0.1,
        "class shares moving by more than this (L-infinity; a number label: Jensen-Shannon) is an anomaly",
        ge=0.0,
        le=1.0,
    )
    max_numeric_drift: float = key(
        0.2, "a number column's Jensen-Shannon divergence (base 2) above this is an anomaly", ge=0.0, le=1.0
    )
    max_category_drift: float = key(
        0.2, "a text column's category shares moving by more than this (L-infinity) is an anomaly", ge=0.0, le=1.0
    )
    min_rows: int = key(
        100, "distributions of fewer training rows are not judged (the row count and columns are)", ge=1
    )


class MonitorSection(_Section):
    """Live performance once labels arrive (trainflow monitor)."""

    max_drop: float = key(
        0.05,
        "degraded when the live (or, before labels, estimated) `promotion.metric` is worse "
        "than the version's held-out score by more",
        ge=0.0,
    )
    min_rows: int = key(
        100, "the fewest labelled predictions a verdict (ok or degraded) rests on; fewer are reported without one", ge=1
    )


class MlflowSection(_Section):
    tracking_uri: str | None = key(
        None,
        "the MLflow tracking server or store",
        shown="`$MLFLOW_TRACKING_URI`, else `sqlite:///<storage_path>/../mlflow.db`",
    )
    experiment: str = key("trainflow", "the MLflow experiment of the runs")
    registered_model: str = key(
        "trainflow-model", "the registered model: its versions, and the `@champion` alias the gate moves"
    )


class DriftSection(_Section):
    """Drift of a scoring table from the serving model's training baseline, per feature (TFDV's measures)."""

    enabled: bool = key(True, "measure drift in the prediction pass")
    numeric_threshold: float = key(
        0.1, "a number feature drifts above this Jensen-Shannon divergence (base 2; 0 same, 1 disjoint)", gt=0.0, le=1.0
    )
    categorical_threshold: float = key(
        0.1, "a text feature drifts above this L-infinity distance of its category frequencies", gt=0.0, le=1.0
    )
    min_rows: int = key(100, "fewer scoring rows are reported as too few, not judged", ge=1)


class InferenceSection(_Section):
    input: str | None = key(None, "the table to score after each retrain (give both input and output, or neither)")
    on_unseen: Literal["unknown", "error"] = key(
        "unknown",
        "a text value never seen in training: predict with the unknown code and count it (`unknown`), or "
        "fail the run (`error`)",
    )
    output: str | None = key(
        None,
        "where the predictions go: a Parquet output folder (local or URI); with `output_format`, a Delta table's "
        "location, an Iceberg table's identifier or a PostgreSQL table (`schema.name`)",
    )
    output_format: Literal["parquet", "delta", "iceberg", "postgres"] = key(
        "parquet",
        "`parquet` (a folder trainflow replaces whole), or a table each scoring run appends to as one commit with "
        "its `model_version` and `scoring_run` columns: `delta`, `iceberg` (of `inference.catalog`) or `postgres` "
        "(on `inference.connection`) ([sources.md](sources.md#predictions-into-a-table))",
    )
    catalog: dict[str, Any] | None = key(
        None, "`output_format: iceberg`: the pyiceberg catalog's properties", shown="data.catalog"
    )
    connection: str | None = key(
        None,
        "`output_format: postgres`: `postgresql://user@host:port/database`, never with a password",
        shown="data.connection",
    )
    password_secret: str | None = key(
        None,
        "`output_format: postgres`: a Prefect Secret block holding the password",
        shown="data.password_secret, else PGPASSWORD",
    )
    batch_size: int = key(4096, "rows per inference batch", ge=1)
    num_actors: int = key(1, "inference actors, for a table too large to score in the calling process", ge=1)
    use_gpu: bool = key(False, "each inference actor asks for a GPU and predicts on it")
    drift: DriftSection = key(
        doc="drift of the scoring table from the model's training baseline, per feature", default_factory=DriftSection
    )

    @model_validator(mode="after")
    def _both_or_neither(self) -> InferenceSection:
        if (self.input is None) != (self.output is None):
            raise ValueError("give both inference.input and inference.output, or neither")
        if self.output_format == "postgres" and self.output is not None:
            from trainflow.tables.postgres import check_table_name

            try:
                check_table_name(self.output)
            except ValueError as exc:
                raise ValueError("output" + str(exc).removeprefix("table")) from None
        if self.output_format == "iceberg" and self.output is not None and "/" in self.output:
            raise ValueError(f"output: {self.output!r}: an Iceberg table is named by its identifier, e.g. `crm.scores`")
        if self.connection is not None:
            from trainflow.tables.postgres import check_connection

            check_connection(self.connection)
        if self.catalog is not None and self.output_format != "iceberg":
            raise ValueError(f"catalog: an Iceberg catalog, for output_format iceberg (it is {self.output_format})")
        return self


class RetentionSection(_Section):
    """What a retrain removes from storage_path (and, asked, from the registry) once it has published
    (trainflow/retention.py; `trainflow gc`)."""

    keep_runs: int | None = key(
        None,
        "keep the run folders of this many newest retrains of the registered model; older ones are removed unless "
        "an alias, the champion's recent history, or a start in progress needs them",
        shown="all: nothing is removed",
        ge=1,
    )
    max_age_days: float | None = key(
        None,
        "remove the run folders of retrains started more than this many days ago (with `keep_runs`: only runs "
        "both limits let go); the same runs are never removed",
        shown="no age limit",
        gt=0,
    )
    alias_history_days: float = key(
        30.0,
        "a version that an alias pointed at within this many days (the champion's recorded history) keeps its run",
        ge=0,
    )
    delete_versions: bool = key(
        False,
        "also delete the removed runs' model versions through MLflow's API (never one an alias points at or the "
        "history window keeps) and mark their MLflow runs deleted; false: versions and runs stay",
    )

    @property
    def limited(self) -> bool:
        """Whether a limit is set (keep_runs or max_age_days); unset, every run is kept and nothing is collected."""
        return self.keep_runs is not None or self.max_age_days is not None


class ServicesSection(_Section):
    """How long a run waits out a service that does not answer before it fails naming it (trainflow/run/services.py)."""

    mlflow_wait_s: float = key(
        300.0,
        "seconds a run waits for an MLflow tracking server (HTTP) that does not answer, retrying with growing "
        "pauses and saying what it waits for, before failing with exit 1 naming it; a rerun resumes (MLflow's "
        "client retries at most 10 times, 120 s apart: at most 1,080)",
        ge=0.0,
        le=1080.0,
    )
    prefect_wait_s: float = key(
        300.0,
        "seconds a run waits for a configured Prefect API (`PREFECT_API_URL`) that does not answer, before it "
        "starts and in the middle, before failing with exit 1 naming it",
        ge=0.0,
    )
    storage_wait_s: float = key(
        300.0,
        "seconds trainflow's own reads and writes of an object store (`s3://`, `gs://`, ...) wait for it to "
        "answer before the run fails with exit 1 naming it; Ray's workers read and write with their own "
        "retries (a training run then resumes from its last checkpoint)",
        ge=0.0,
    )
    database_wait_s: float = key(
        300.0,
        "seconds a PostgreSQL source's server that refuses connections is waited for (saying so) before the run "
        "fails with exit 1 naming it; a refused login or query fails at once",
        ge=0.0,
    )
    database_read_s: float = key(
        300.0,
        "seconds a PostgreSQL source's read may go without a batch of rows (the first one included) before it is "
        "cancelled and the run fails with exit 1 naming the server (a frozen backend, a host gone without a "
        "reset); a rerun of the run name copies again",
        gt=0.0,
    )
