"""The config's building blocks: a section that refuses unknown keys, `key` (a key's default and its one description)
and the metrics each task reports."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)


CLASSIFICATION_METRICS = {
    "val_loss": "min",
    "train_loss": "min",
    "val_accuracy": "max",
    "val_f1": "max",
    "val_roc_auc": "max",
}
REGRESSION_METRICS = {"val_loss": "min", "train_loss": "min", "val_rmse": "min", "val_mae": "min", "val_r2": "max"}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def key(default: Any = ..., doc: str = "", *, shown: str | None = None, **constraints: Any) -> Any:
    """A config key: its default, its meaning and (shown) its default as a person reads it where the value alone does
    not say it. The one place a key is described: the schema (`trainflow config schema`), `trainflow init`'s comments
    and docs/configuration.md's key table (`python -m trainflow.config.schema`) are made from it. The first clause of
    doc (up to the first `;`) stands alone: init's comments are that clause."""
    extra = {"x-default": shown} if shown else None
    if "default_factory" in constraints:
        return Field(description=doc, json_schema_extra=extra, **constraints)
    return Field(default, description=doc, json_schema_extra=extra, **constraints)
