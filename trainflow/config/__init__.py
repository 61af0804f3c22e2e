"""The one typed config: a YAML file plus dotted overrides, validated by pydantic. The sections are models that
validate themselves and do no I/O (base, data, model, training, operations, root); loading reads the file, applies
overrides, infers the task from the label and resolves paths (loading); the schema and the docs' key table are made
from the keys' descriptions (schema)."""

from trainflow.config.base import CLASSIFICATION_METRICS, REGRESSION_METRICS, key
from trainflow.config.data import CsvSection, DataSection, PreprocessSection, SplitSection, infer_format
from trainflow.config.loading import (
    apply_overrides,
    apply_to_process,
    config_from_dict,
    load_config,
    load_yaml,
    storage_path_of,
    trial_config,
)
from trainflow.config.model import (
    AUTO_FAMILIES,
    ENSEMBLE,
    FAMILIES,
    ModelSection,
    ParamsSection,
)
from trainflow.config.operations import (
    CalibrationSection,
    DriftSection,
    InferenceSection,
    MlflowSection,
    MonitorSection,
    PromotionSection,
    RetentionSection,
    ServicesSection,
    ValidationSection,
)
from trainflow.config.root import Config
from trainflow.config.training import (
    CheckpointSection,
    EarlyStoppingSection,
    FailureSection,
    RaySection,
    ScalingSection,
    TrainSection,
    TuneSection,
    workers_share_gpus,
)

__all__ = [
    "AUTO_FAMILIES",
    "CLASSIFICATION_METRICS",
    "ENSEMBLE",
    "FAMILIES",
    "REGRESSION_METRICS",
    "CalibrationSection",
    "CheckpointSection",
    "Config",
    "CsvSection",
    "DataSection",
    "DriftSection",
    "EarlyStoppingSection",
    "FailureSection",
    "InferenceSection",
    "MlflowSection",
    "ModelSection",
    "MonitorSection",
    "ParamsSection",
    "PreprocessSection",
    "PromotionSection",
    "RaySection",
    "ScalingSection",
    "RetentionSection",
    "ServicesSection",
    "SplitSection",
    "TrainSection",
    "TuneSection",
    "ValidationSection",
    "apply_overrides",
    "apply_to_process",
    "config_from_dict",
    "infer_format",
    "key",
    "load_config",
    "load_yaml",
    "storage_path_of",
    "trial_config",
    "workers_share_gpus",
]
