"""The root config: every section, the checks across sections, and what a family's run reads of it."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import (
    PrivateAttr,
    model_validator,
)

from trainflow.config.base import CLASSIFICATION_METRICS, REGRESSION_METRICS, _Section, key
from trainflow.config.data import DataSection, PreprocessSection, SplitSection
from trainflow.catalogue import families
from trainflow.config.model import ENSEMBLE, TRAIN_KEYS_MOVED, ModelSection, train_keys_moved
from trainflow.config.operations import (
    CalibrationSection,
    InferenceSection,
    MlflowSection,
    MonitorSection,
    PromotionSection,
    RetentionSection,
    ServicesSection,
    ValidationSection,
)
from trainflow.config.training import (
    CheckpointSection,
    FailureSection,
    RaySection,
    ScalingSection,
    TrainSection,
    TuneSection,
)
from trainflow.errors import ConfigError


class Config(_Section):
    data: DataSection = key(doc="the training table: where it is, its label, features and id column")
    task: Literal["classification", "regression"] = key(
        doc="`classification` or `regression`; may be left out when the label decides it: text or true/false values "
        "are classes, fractional numbers a quantity, two distinct whole numbers a binary class (more whole "
        "numbers: set it)",
        shown="from the label",
    )
    split: SplitSection = key(doc="the seeded test/validation/train split of the rows", default_factory=SplitSection)
    preprocess: PreprocessSection = key(
        doc="how text and date columns become features", default_factory=PreprocessSection
    )
    model: ModelSection = key(doc="the model families and their settings", default_factory=ModelSection)
    train: TrainSection = key(
        doc="the training: folds, the time limit, early stopping, class weights, the refit and a warm start (a "
        "network's epochs, batch size, optimizer and schedule are its own: `model.params.mlp`, ...)",
        default_factory=TrainSection,
    )
    scaling: ScalingSection = key(
        doc="Ray Train's workers: how many, CPU or GPU, resources per worker", default_factory=ScalingSection
    )
    checkpoint: CheckpointSection = key(
        doc="which checkpoints are kept and which one is best", default_factory=CheckpointSection
    )
    failure: FailureSection = key(
        doc="retries of failed workers and tasks, and the hang watchdog", default_factory=FailureSection
    )
    promotion: PromotionSection = key(
        doc="the champion gate: when a new version becomes `@champion`", default_factory=PromotionSection
    )
    calibration: CalibrationSection = key(
        doc="classification: probabilities recalibrated where training distorted them, and the decision threshold",
        default_factory=CalibrationSection,
    )
    validation: ValidationSection = key(
        doc="checks of the training data against the champion's training baseline, before any training",
        default_factory=ValidationSection,
    )
    monitor: MonitorSection = key(
        doc="the served model's performance, measured once labels arrive and estimated before (`trainflow monitor`)",
        default_factory=MonitorSection,
    )
    storage_path: str = key(
        "runs",
        "where Ray Train writes runs and checkpoints (local or URI); the root folder and the home folder are refused",
    )
    mlflow: MlflowSection = key(doc="MLflow tracking and the model registry", default_factory=MlflowSection)
    ray: RaySection = key(doc="the Ray cluster to use", default_factory=RaySection)
    tune: TuneSection | None = key(None, "a Ray Tune sweep (`trainflow tune`)", shown="the sweep's defaults")
    inference: InferenceSection = key(
        doc="batch inference after a retrain (and `trainflow predict`)", default_factory=InferenceSection
    )
    retention: RetentionSection = key(
        doc="which earlier runs' folders a retrain removes from storage_path ([operations.md](operations.md#retention))",
        default_factory=RetentionSection,
    )
    services: ServicesSection = key(
        doc="how long a run waits out the MLflow server, the Prefect API and the object "
        "store when they do not answer ([operations.md](operations.md))",
        default_factory=ServicesSection,
    )
    # the config file's folder (load_config), which an output must not replace; not part of the config's data
    _source_dir: str | None = PrivateAttr(default=None)
    # why `task` is what it is, when the config left it out and the label decided it
    _task_inferred: str | None = PrivateAttr(default=None)
    # an approval given with the run (`trainflow retrain --approve`): approve, reason, by (tasks/approval.py)
    _approved: dict | None = PrivateAttr(default=None)

    @property
    def approved(self) -> dict | None:
        return self._approved

    def with_approval(self, answer: dict | None) -> Config:
        """A copy of this config carrying an approval given with the run (not part of the config's data)."""
        copied = self.model_copy()
        copied._approved = answer
        return copied

    @property
    def task_inferred(self) -> str | None:
        return self._task_inferred

    @property
    def source_dir(self) -> str | None:
        return self._source_dir

    @model_validator(mode="before")
    @classmethod
    def _network_keys_from_train(cls, raw: Any) -> Any:
        """The networks' keys written at their earlier place, train.<key>, read from there (config_from_dict warns)."""
        return train_keys_moved(raw)[0] if isinstance(raw, dict) else raw

    @model_validator(mode="after")
    def _auto_with_its_time(self) -> Config:
        """model.type auto: its families (validated as every family auto may train: their keys are accepted), those
        that earn their place given time when train.time_limit is in seconds (trainer/families/base.py auto_when)."""
        section = self.model.under(self.train.time_limit)
        if section is not self.model:
            self.model = section
        return self

    @model_validator(mode="after")
    def _metric_fits_task(self) -> Config:
        known = CLASSIFICATION_METRICS if self.task == "classification" else REGRESSION_METRICS
        if self.task == "regression" and self.train.class_weight is not None:
            raise ValueError("train.class_weight: class weights apply to classification only")
        if self.checkpoint.metric not in known:
            raise ValueError(
                f"checkpoint.metric: {self.checkpoint.metric!r} is not reported for {self.task}; "
                f"choose one of {sorted(known)}"
            )
        if self.checkpoint.mode is None:
            self.checkpoint.mode = known[self.checkpoint.metric]
        if self.promotion.metric is None:
            # the gate scores both models on held-out rows, so a training-loss checkpoint metric maps to val_loss
            self.promotion.metric = "val_loss" if self.checkpoint.metric == "train_loss" else self.checkpoint.metric
        if self.promotion.metric not in known or self.promotion.metric == "train_loss":
            raise ValueError(
                f"promotion.metric: {self.promotion.metric!r} is not a validation metric for {self.task}; "
                f"choose one of {sorted(k for k in known if k.startswith('val_'))}"
            )
        if self.promotion.mode is None:
            self.promotion.mode = known[self.promotion.metric]
        if self.tune is not None:
            if self.tune.metric is None:
                self.tune.metric = self.checkpoint.metric
            if self.tune.metric not in known:
                raise ValueError(
                    f"tune.metric: {self.tune.metric!r} is not reported for {self.task}; choose one of {sorted(known)}"
                )
            if self.tune.mode is None:
                self.tune.mode = known[self.tune.metric]
        return self

    @model_validator(mode="after")
    def _roles_fit(self) -> Config:
        """The split's columns are neither the label nor the id, folds leave test rows, a table sink's server is
        named."""
        for name in ("time_column", "group_column"):
            column = getattr(self.split, name)
            if column is not None and column in (self.data.label, self.data.id_column):
                raise ValueError(f"split.{name}: {column!r} is the label or id column")
        if self.split.group_column is not None and self.split.group_column == self.split.time_column:
            raise ValueError(f"split.group_column: {self.split.group_column!r} is also split.time_column")
        if (
            self.split.group_column is not None
        ):  # a group's id is no feature unless named: it cannot carry to new groups
            self.data._not_features = {self.split.group_column}
        self._sink_defaults()
        if self.inference.output and self.inference.output_format == "postgres" and not self.inference.connection:
            raise ValueError("inference.connection: output_format postgres needs postgresql://user@host:port/database")
        if isinstance(self.train.folds, int) and self.train.folds > 1 and self.split.test_fraction == 0:
            raise ValueError(
                f"train.folds: {self.train.folds} folds with split.test_fraction 0 leave no row that the "
                "served model (every fold model averaged) did not train on, so nothing could judge it: "
                "set split.test_fraction above 0, or train.folds: 1"
            )
        return self

    def _sink_defaults(self) -> None:
        """A table sink's server or catalog defaults to the source's, resolved here, once: the source's own keys go
        when a PostgreSQL source is read from its copy (DataSection.as_copy), the sink's stay."""
        inf = self.inference
        if inf.output_format == "postgres":
            if inf.connection is None and self.data.connection is not None:
                inf.connection = self.data.connection
            if inf.password_secret is None and self.data.password_secret is not None:
                inf.password_secret = self.data.password_secret
        if inf.output_format == "iceberg" and inf.catalog is None and self.data.catalog is not None:
            inf.catalog = self.data.catalog

    def require_tune(self) -> TuneSection:
        """The sweep's settings: the tune section, or its defaults (its metric the checkpoint's, in its direction, as
        a tune section without them gets). Without tune.search_space each family searches its own default space, and
        with several families (auto, a list) the family is a search dimension too (trainer/tune.py sweep_space)."""
        if self.tune is not None:
            return self.tune
        return TuneSection(metric=self.checkpoint.metric, mode=self.checkpoint.mode)

    @property
    def ray_start(self) -> dict[str, Any]:
        """ensure_ray's arguments for this config: the cluster to join, or how to start a local Ray."""
        return {
            "address": self.ray.address,
            "runtime_env": self.ray.runtime_env,
            "worker_env": dict(self.scaling.env_vars),
            "temp_dir": self.ray.temp_dir,
        }

    def require_workers(self) -> None:
        """The retrain pipeline keeps checkpoints, which Ray Train's local mode (num_workers=0) does not."""
        if self.scaling.min_workers < 1:
            raise ConfigError(
                "scaling.num_workers: the retrain pipeline needs at least 1 Ray Train worker "
                "(0 is Ray Train's local mode, which keeps no checkpoints to select, resume or register)"
            )

    def require_inference(self) -> None:
        if not self.inference.input:
            raise ConfigError("inference.input and inference.output must be set to run batch inference")

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def as_given(self) -> dict[str, Any]:
        """The keys that were given (or derived while the config was read), as to_dict shows them: config_from_dict
        reads it back to this config, a key left unset still unset (a default that depends on the table reads
        whether it was: scaling.num_workers, tasks/cross_fit.py train_config)."""
        return self.model_dump(mode="json", exclude_unset=True)

    def for_family(self, family: str) -> Config:
        """The config as one family's training run sees it (model.type that family): what its workers get. The
        ensemble's is the whole config (it weights every family's best checkpoint)."""
        if family == ENSEMBLE:
            return self
        return self.model_copy(update={"model": self.model.family_section(family)})

    def training_hash(self, family: str) -> str:
        """A hash of what decides a model's weights, so a resume onto other settings is caught: the task, label,
        features, split, preprocessing, the keys of the model section this family reads and (networks) the optimiser;
        another family's keys never change it. Left out: what only extends
        or stops a run (epochs, early stopping, rounds, the time limit), scaling, storage, gate and inference settings. The ensemble's:
        every member family's."""
        if family == ENSEMBLE:
            members = [self.training_hash(f) for f in self.model.families]
            return "config:" + hashlib.blake2b(json.dumps(members).encode(), digest_size=12).hexdigest()
        model = self.model.hashed(family)
        if not families()[family].uses_minibatches:  # the networks' optimiser never reaches another family
            train: dict[str, Any] = {"folds": self.train.folds}
        else:
            exclude = {"early_stopping", "time_limit", "warm_start", "refit"}
            train = self.train.model_dump(mode="json", exclude=exclude)
            # the networks' optimizer keys, as the hash took them from train.* before they moved (runs resume)
            dumped = self.model.model_dump(mode="json")
            train.update({k: dumped[k] for k in TRAIN_KEYS_MOVED if k != "epochs"})
            model = {k: v for k, v in model.items() if k not in TRAIN_KEYS_MOVED}
        if self.train.warm_start != "none":  # a continuation is another fit (unset: the hash of runs before the key)
            train["warm_start"] = self.train.warm_start
        relevant = {
            "task": self.task,
            "label": self.data.label,
            "features": self.data.features,
            # an unset key leaves the hash alone (runs trained before the key existed resume); the backtest's extra fit
            # changes no model
            "split": self.split.model_dump(mode="json", exclude_none=True, exclude={"backtest_fit"}),
            "preprocess": self.preprocess.model_dump(mode="json"),
            "model": model,
            "train": train,
        }
        return "config:" + hashlib.blake2b(json.dumps(relevant, sort_keys=True).encode(), digest_size=12).hexdigest()
