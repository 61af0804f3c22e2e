"""The one typed config: a YAML file plus dotted overrides, validated by pydantic."""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import math
import os
import re
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from trainflow.errors import ConfigError
from trainflow.folds import AUTO_FOLD_ROWS, AUTO_FOLDS, EXACT_TEST_ROWS, MAX_FOLDS, MAX_TEST_ROWS
from trainflow.limits import (
    AUTO_FLOOR_S,
    HANG_FACTOR,
    HANG_FIRST_S,
    HANG_MIN_S,
    MAX_AUTO_EPOCHS,
    MAX_BATCH,
    MIN_AUTO_EPOCHS,
    MIN_BATCH,
    MIN_PATIENCE,
    MIN_RUN_S,
    PATIENCE_SHARE,
    ROWS_PER_STEP,
    TARGET_STEPS,
)
from trainflow.redact import protect
from trainflow.storage import is_uri

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
    and docs/configuration.md's key table (`python -m trainflow.config_schema`) are made from it. The first clause of
    doc (up to the first `;`) stands alone: init's comments are that clause."""
    extra = {"x-default": shown} if shown else None
    if "default_factory" in constraints:
        return Field(description=doc, json_schema_extra=extra, **constraints)
    return Field(default, description=doc, json_schema_extra=extra, **constraints)


class CsvSection(_Section):
    """How CSV files are parsed (pyarrow.csv): a delimiter, a quote character and the text encoding."""

    delimiter: str = key(",", 'the character between a CSV file\'s values (a tab: `"\\t"`)', min_length=1, max_length=1)
    quote_char: str = key(
        '"', "the character that quotes a CSV value holding the delimiter", min_length=1, max_length=1
    )
    encoding: str = key("utf8", "the CSV files' text encoding, e.g. `latin-1`, `cp1252`")

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, v: str) -> str:
        import codecs

        try:
            codecs.lookup(v)
        except LookupError:
            raise ValueError(f"unknown text encoding {v!r} (e.g. utf8, latin-1, cp1252)") from None
        return v


class DataSection(_Section):
    path: str = key(
        doc="file, folder, glob or URI (`s3://...`) of the training table; files are picked by their "
        "extension (`.csv`, `.tsv`, `.parquet`, `.parq`, `.pq`, optionally compressed)"
    )
    format: Literal["parquet", "csv"] | None = key(
        None, "`parquet` or `csv`", shown="from the extension (`.csv` → csv, else parquet)"
    )
    csv: CsvSection = key(doc="how CSV files are parsed (pyarrow.csv)", default_factory=CsvSection)
    label: str = key(doc="label column (any name, spaces and punctuation allowed)")
    features: list[str] | None = key(
        None, "feature columns: numbers, text, dates/timestamps", shown="every column but label and id"
    )
    id_column: str | None = key(
        None, "carried into the predictions; also the split's key when given (not `prediction` or `proba_*`)"
    )
    materialize: Literal["auto", "always", "never"] = key(
        "auto",
        "keep the table in Ray's object store (`always`) or stream it from its files every epoch (`never`); "
        "`auto`: materialize when its in-memory size (from the files' metadata) is under a quarter of the store "
        "([pipeline.md](pipeline.md))",
    )

    _not_features: set[str] = PrivateAttr(default_factory=set)  # split.group_column (Config sets it)

    def default_features(self, names: list[str]) -> list[str]:
        """The feature columns: data.features, else every column of names but the label, the id and the split's group."""
        skip = {self.label, self.id_column, *self._not_features}
        return list(self.features) if self.features else [c for c in names if c not in skip]

    @model_validator(mode="after")
    def _infer_format(self) -> DataSection:
        if self.format is None:
            self.format = infer_format(self.path)
        if self.features is not None:
            if not self.features:
                raise ValueError("features: give at least one column, or leave it out to use every column")
            for bad in (self.label, self.id_column):
                if bad is not None and bad in self.features:
                    raise ValueError(f"features: {bad!r} is the label or id column and cannot be a feature")
            if len(set(self.features)) != len(self.features):
                raise ValueError("features: a column is listed twice")
        if self.id_column is not None and self.id_column == self.label:
            raise ValueError(f"id_column: {self.id_column!r} is also the label")
        if self.id_column is not None and (self.id_column == "prediction" or self.id_column.startswith("proba_")):
            raise ValueError(
                f"id_column: {self.id_column!r} is a name the predictions use for their own columns "
                "(prediction, proba_<class>); rename the column"
            )
        return self


class PreprocessSection(_Section):
    """How text and date columns become features."""

    max_onehot: int = key(
        16, "text columns with at most this many distinct values are one-hot; wider ones get a learned embedding", ge=1
    )
    min_frequency: int = key(
        5, "embedded columns: values seen fewer times share the unknown code with unseen ones", ge=1
    )
    max_categories: int = key(100_000, "embedded columns keep at most this many (most frequent) values", ge=1)
    parse_dates: bool = key(True, "text columns whose values parse as ISO-8601 dates or timestamps become date parts")


class SplitSection(_Section):
    test_fraction: float = key(
        0.2,
        "fraction of rows in the test role, read once by the final scoring and the gate, 0 <= f < 1, at most "
        f"{MAX_TEST_ROWS:,} rows; a seeded hash of each row's id (or of its values) decides, so a table of over "
        f"{EXACT_TEST_ROWS:,} rows that grows keeps its test rows; 0: no test role",
        ge=0.0,
        lt=1.0,
    )
    validation_fraction: float = key(
        0.2,
        "fraction of the non-test rows held out for early stopping, the family choice, the ensemble's weights and "
        "calibration when `train.folds` is 1, 0 < f < 1; a class with too few rows for a role keeps them in "
        "training",
        gt=0.0,
        lt=1.0,
    )
    seed: int = key(42, "seeds the split and training")
    time_column: str | None = key(
        None,
        "a date, datetime or numeric column: the test role is then the newest rows (the last `test_fraction` of "
        "them in time), validation the newest before them, training the rest (cross-fitting: blocks of time); "
        "rows of one time are never split between roles; a missing time is refused "
        "([pipeline.md](pipeline.md#roles-by-time-and-by-group))",
        shown="none: roles by a seeded hash of each row's id or values",
    )
    group_column: str | None = key(
        None,
        "rows of one group (customer, patient, store) stay in one role and fold: a model is judged on groups it "
        "never saw; not a feature unless `data.features` names it. With `time_column` the time cut decides, and "
        "the groups it splits are counted",
    )
    backtest_fit: bool = key(
        True,
        "with `time_column`: the backtest trains the chosen family once more, cut off one validation block "
        "earlier, and scores both on the test rows (how much quality a model's age costs; one extra fit within "
        "the time budget); false: the backtest by test-row age only "
        "([pipeline.md](pipeline.md#the-backtest))",
    )


FAMILIES = ("mlp", "torch", "xgboost", "lightgbm", "catboost")
FamilyName = Literal["mlp", "torch", "xgboost", "lightgbm", "catboost"]
BOOSTERS = ("xgboost", "lightgbm", "catboost")
AUTO_FAMILIES = ("mlp", "xgboost", "lightgbm", "catboost")  # model.type auto
# the order auto trains them in, which is their priority for time (a time limit gives each family what the ones before
# it left, trainer/deadline.py). Cross-fitting (small tables): the strongest defaults first, the network, whose fits
# cost most there, last. One split (larger tables): the fastest first, because its time sets train.time_limit auto's
# budget for the rest (at most max(twice that time, 300 s) in all), then the family least like it (the ensemble gains
# most from it), then CatBoost (strong, but one process a fit) and LightGBM, the booster most like XGBoost. Measured on
# 4M streamed rows (docs/performance.md, beyond-memory-default): XGBoost 170 s, the network 317 s, LightGBM 364 s,
# CatBoost over 380 s
AUTO_FOLDED_ORDER = ("catboost", "lightgbm", "xgboost", "mlp")
AUTO_SPLIT_ORDER = ("xgboost", "mlp", "catboost", "lightgbm")
ENSEMBLE = "ensemble"  # what a checkpoint's model.type says when it weights several families' checkpoints
_ALL, _BOTH, _XGB, _LGB = BOOSTERS, ("xgboost", "lightgbm"), ("xgboost",), ("lightgbm",)
# which booster library takes each model.params key (trainflow passes the ones a family takes to it; CatBoost under
# its own names: max_depth as depth, reg_lambda as l2_leaf_reg, max_bin as border_count)
BOOSTER_KEYS: dict[str, tuple[str, ...]] = {
    "num_boost_round": _ALL,
    "early_stopping_rounds": _ALL,
    "learning_rate": _ALL,
    "max_depth": _ALL,
    "min_child_weight": _BOTH,
    "subsample": _ALL,
    "colsample_bytree": _BOTH,
    "reg_lambda": _ALL,
    "reg_alpha": _BOTH,
    "max_bin": _ALL,
    "gamma": _XGB,
    "colsample_bynode": _XGB,
    "tree_method": _XGB,
    "max_leaves": _XGB,
    "grow_policy": _XGB,
    "max_cat_to_onehot": _XGB,
    "external_memory": _XGB,
    "num_leaves": _LGB,
    "min_data_in_leaf": _LGB,
    "min_split_gain": _LGB,
    "cat_smooth": _LGB,
}


TRAINFLOW_KEYS = ("num_boost_round", "early_stopping_rounds", "external_memory")  # read by trainflow, not the library
NETWORK_KEYS = {
    "mlp": ("hidden_sizes", "dropout", "numeric_embedding", "architecture", "tabm_k"),
    "torch": ("class_path", "init_args"),
}  # the model keys each reads


def _library(name: str, shown: str = "the library's", **constraints: Any) -> Any:
    """A booster key passed as it is to the libraries that take it (BOOSTER_KEYS; CatBoost's under its own names)."""
    takes = BOOSTER_KEYS[name]
    libs = takes[0] if len(takes) == 1 else ", ".join(takes[:-1]) + " and " + takes[-1]
    own = {"max_depth": "depth", "reg_lambda": "l2_leaf_reg", "max_bin": "border_count"}.get(name)
    return key(None, f"{libs}'s own `{name}`" + (f" (catboost's `{own}`)" if own else ""), shown=shown, **constraints)


class BoosterParams(_Section):
    """Gradient-boosted trees (model.type xgboost / lightgbm / catboost); unset keys keep each library's default
    (CatBoost's learning rate, unless set, is the one CatBoost picks for the table)."""

    num_boost_round: int = key(1000, "the most boosting rounds; early stopping ends most runs well before", ge=1)
    early_stopping_rounds: int | Literal["off"] = key(
        50, "rounds without a better validation loss before stopping, or `off`"
    )
    learning_rate: float = key(
        0.1,
        "the boosters' step size (HistGradientBoosting's and LightGBM's default; "
        "XGBoost's own is 0.3; CatBoost picks its own for the table unless this is set)",
        gt=0.0,
    )
    max_depth: int | None = _library("max_depth", ge=-1)
    min_child_weight: float | None = _library("min_child_weight", ge=0.0)
    subsample: float | None = _library("subsample", gt=0.0, le=1.0)
    colsample_bytree: float | None = _library("colsample_bytree", gt=0.0, le=1.0)
    reg_lambda: float | None = _library("reg_lambda", ge=0.0)
    reg_alpha: float | None = _library("reg_alpha", ge=0.0)
    max_bin: int | None = _library("max_bin", ge=2)
    gamma: float | None = _library("gamma", ge=0.0)
    colsample_bynode: float | None = _library("colsample_bynode", "`0.5` (trainflow's)", gt=0.0, le=1.0)
    tree_method: Literal["hist", "approx", "exact"] | None = _library("tree_method")
    max_leaves: int | None = _library("max_leaves", ge=0)
    grow_policy: Literal["depthwise", "lossguide"] | None = _library("grow_policy")
    max_cat_to_onehot: int | None = _library("max_cat_to_onehot", ge=1)
    num_leaves: int | None = _library("num_leaves", ge=2)
    min_data_in_leaf: int | None = _library("min_data_in_leaf", ge=0)
    min_split_gain: float | None = _library("min_split_gain", ge=0.0)
    cat_smooth: float | None = _library("cat_smooth", ge=0.0)
    external_memory: Literal["auto", "always", "never"] = key(
        "auto",
        "xgboost: read the shard into XGBoost's external-memory matrix (ExtMemQuantileDMatrix, pages on the "
        "worker's disk) instead of an in-memory one; `auto`: when the in-memory matrices would not fit",
    )

    @field_validator("early_stopping_rounds")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be at least 1, or 'off'")
        return v

    @model_validator(mode="after")
    def _external_memory_hist(self) -> BoosterParams:
        if self.external_memory == "always" and self.tree_method not in (None, "hist"):
            raise ValueError(
                f"external_memory 'always' needs tree_method 'hist' (XGBoost's external-memory "
                f"matrix is built for it), not {self.tree_method!r}"
            )
        return self

    def for_family(self, family: str) -> dict[str, Any]:
        """The library keys this family takes, without the unset ones (trainflow's own keys are not passed on)."""
        return {
            k: v
            for k, v in self.model_dump().items()
            if k in BOOSTER_KEYS and v is not None and family in BOOSTER_KEYS[k] and k not in TRAINFLOW_KEYS
        }


def _family_block(family: str) -> type[_Section]:
    """model.params.<family>: the keys of BoosterParams this family takes, each unset (None) unless written, so only
    what the user wrote there overrides the shared value; another family's key is refused naming whose it is."""
    taken = [k for k, takes in BOOSTER_KEYS.items() if family in takes]
    fields: dict[str, Any] = {}
    for name in taken:
        shared = BoosterParams.model_fields[name]
        typed = Annotated[(shared.annotation, *shared.metadata)] if shared.metadata else shared.annotation  # its bounds
        fields[name] = (
            typed | None,
            Field(None, description=shared.description, json_schema_extra={"x-default": "the shared value"}),
        )

    def _own_keys(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            for name in raw:
                if name not in taken and name in BOOSTER_KEYS:
                    raise ValueError(
                        f"{name}: {family} does not take it (it is {' and '.join(BOOSTER_KEYS[name])}'s); "
                        f"set it under model.params or model.params.{BOOSTER_KEYS[name][0]}"
                    )
        return raw

    return create_model(
        f"{family.title()}Params",
        __base__=_Section,
        __doc__=f"{family}'s own values of model.params' keys, over the shared ones",
        __validators__={"_own_keys": model_validator(mode="before")(classmethod(_own_keys))},
        **fields,
    )


class _ParamsWithBlocks(BoosterParams):
    """model.params: the boosters' keys, shared by every booster the run trains that takes the key, and one block per
    booster (model.params.xgboost, ...) whose keys override the shared ones for that family alone."""

    def family_block(self, family: str) -> BaseModel | None:
        return getattr(self, family, None)

    def resolved(self, family: str) -> _ParamsWithBlocks:
        """The params as this family's run reads them: the shared keys the user set, overridden by the family's own
        block (validated again as one booster's, e.g. external_memory against tree_method); no blocks."""
        chosen = {k: getattr(self, k) for k in self.model_fields_set if k in BOOSTER_KEYS}
        block = self.family_block(family)
        if block is not None:
            chosen.update({k: getattr(block, k) for k in block.model_fields_set if getattr(block, k) is not None})
        return ParamsSection(**chosen)


# each booster's block class, a name of this module as any class (pickle finds it by reference)
_BLOCKS = {family: _family_block(family) for family in BOOSTERS}
globals().update({block.__name__: block for block in _BLOCKS.values()})
# the class above with one optional block per booster
ParamsSection = create_model(
    "ParamsSection",
    __base__=_ParamsWithBlocks,
    __doc__=_ParamsWithBlocks.__doc__,
    **{
        family: (
            _BLOCKS[family] | None,
            Field(
                None,
                description=f"{family}'s own values of the keys above (those it takes), over the shared ones, e.g. "
                f"`model.params.{family}.learning_rate`; a key it does not take is refused",
                json_schema_extra={"x-family-block": True},
            ),
        )
        for family in BOOSTERS
    },
)


class ModelSection(_Section):
    """The model family: `mlp` (trainflow's network), `torch` (a user's nn.Module imported from class_path,
    LightningCLI style), `xgboost`, `lightgbm` or `catboost` (gradient-boosted trees); a list trains each and keeps the
    best."""

    type: Literal["auto"] | FamilyName | list[FamilyName] = key(
        "auto",
        "the families trained: `auto` (`[mlp, xgboost, lightgbm, catboost]`), `mlp` (trainflow's network), "
        "`xgboost`, `lightgbm`, `catboost` or `torch` (your own `nn.Module`), or a list of them; each family "
        "trains as its own Ray Train run, with their weighted ensemble (`model.ensemble`), and the best on rows "
        "its training never saw goes on ([families.md](families.md)). `auto` leaves out a family that cannot "
        "fit or fails (summary `families_left_out`); a single family you name fails the run instead. A sweep "
        "(`tune`) trains one family per trial and searches the family when there are several",
    )
    hidden_sizes: list[int] = key(doc="mlp: the hidden layers' widths", default_factory=lambda: [256, 128])
    dropout: float = key(0.3, "mlp: dropout after each hidden layer", ge=0.0, lt=1.0)
    numeric_embedding: Literal["auto", "none", "periodic"] = key(
        "auto",
        "mlp: `periodic` passes each continuous value (numbers, date parts) through a periodic embedding "
        "(`rtdl_num_embeddings`' PLR: learned frequencies, sin and cos, a linear layer) before the layers; "
        "`none`: the standardized value as it is; `auto`: periodic up to 1,000,000 training rows "
        "([families.md](families.md#the-network))",
    )
    architecture: Literal["mlp", "tabm"] = key(
        "mlp",
        "mlp: the layers over the features: `mlp`, one MLP of `model.hidden_sizes`; `tabm`, TabM (the `tabm` "
        "package): an ensemble of `model.tabm_k` MLPs of len(hidden_sizes) layers of max(hidden_sizes) units "
        "that share their weights, trained together, served as their mean ([families.md](families.md#tabm-modelarchitecture-tabm))",
    )
    tabm_k: int = key(32, "mlp with `architecture: tabm`: the ensemble's members", ge=2, le=128)
    class_path: str | None = key(
        None,
        "torch: `package.module:ClassName` of your module, built as "
        "`ClassName(in_features, out_features, **init_args)`",
    )
    init_args: dict[str, Any] = key(doc="torch: keyword arguments of your module's constructor", default_factory=dict)
    allowed_class_paths: list[str] = key(
        doc="module classes a model read from the registry or storage may import besides `model.class_path` (the "
        "gate's champion, `predict --model`); any other is refused, never imported: storage someone else can write "
        "to never chooses the code",
        default_factory=list,
    )
    params: ParamsSection = key(
        doc="the gradient-boosted trees' parameters (xgboost, lightgbm, catboost), shared by "
        "each that takes the key, with a block per family over them "
        "(`model.params.xgboost`, ...); a key no trained family takes is refused",
        default_factory=ParamsSection,
    )
    ensemble: bool = key(
        True,
        "with two or more families: also a weighted ensemble of their best checkpoints (greedy "
        "ensemble selection on out-of-fold or validation predictions), a candidate beside them",
    )

    @property
    def families(self) -> list[str]:
        return [self.type] if isinstance(self.type, str) else list(self.type)

    @property
    def candidates(self) -> list[str]:
        """What may win the run: each family, and the ensemble of them when there are several."""
        families = self.families
        return families + [ENSEMBLE] if self.ensemble and len(families) > 1 else families

    def training_order(self, folds: int) -> list[str]:
        """The families in the order their runs start: the config's, or under auto AUTO_FOLDED_ORDER when
        cross-fitting and AUTO_SPLIT_ORDER on one split."""
        if self.auto:
            return [f for f in (AUTO_FOLDED_ORDER if folds > 1 else AUTO_SPLIT_ORDER) if f in self.families]
        return self.families

    def for_family(self, family: str) -> dict[str, Any]:
        """This section as one family's config (model.type a single name, model.params as that family reads them)."""
        return self.family_section(family).model_dump(mode="json")

    def family_section(self, family: str) -> ModelSection:
        """This section as one family's run reads it: model.type that family; a booster's params resolved (its own
        block over the shared keys, no blocks)."""
        update: dict[str, Any] = {"type": family}
        if family in BOOSTERS:
            update["params"] = self.params.resolved(family)
        return self.model_copy(update=update)

    _auto: bool = PrivateAttr(False)

    @model_validator(mode="wrap")
    @classmethod
    def _expand_auto(cls, raw: Any, handler: Any) -> ModelSection:
        auto = isinstance(raw, dict) and raw.get("type", "auto") == "auto"
        section = handler({**raw, "type": list(AUTO_FAMILIES)} if auto else raw)
        section._auto = auto or section._auto
        return section

    @property
    def auto(self) -> bool:
        """model.type auto (or left out): a family whose training data cannot fit the cluster is left out, not
        refused, as long as one remains."""
        return self._auto

    @model_validator(mode="after")
    def _family_keys(self, info: ValidationInfo) -> ModelSection:
        families = self.families
        if not families:
            raise ValueError(f"model.type: give a family or a list of them, from {list(FAMILIES)}")
        if len(set(families)) != len(families):
            raise ValueError(f"model.type: {families} names a family more than once")
        if "torch" in families and not self.class_path:
            raise ValueError(
                "model.type torch needs model.class_path, e.g. 'trainflow.examples.tabular_resnet:TabularResNet'"
            )
        if "torch" not in families and (self.class_path or self.init_args):
            raise ValueError("model.class_path and model.init_args are for model.type: torch")
        # a sweep's trial of one family keeps the user's keys of the sweep's other families (each reads only its own)
        scope = [*families, *((info.context or {}).get("sweep_families") or ())]
        for key in NETWORK_KEYS["mlp"]:  # set to something else than its default, for a run without the network
            default = type(self).model_fields[key].get_default(call_default_factory=True)
            if key in self.model_fields_set and getattr(self, key) != default and "mlp" not in scope:
                raise ValueError(f"model.{key}: applies to mlp, which model.type {families} does not train")
        boosters = [f for f in BOOSTERS if f in scope]
        for family in BOOSTERS:
            if self.params.family_block(family) is not None and family not in boosters:
                raise ValueError(
                    f"model.params.{family}: applies to {family}, which model.type {families} does not train"
                )
            if family in boosters:
                try:  # what this family's run reads, validated as one booster's block (e.g. external_memory)
                    self.params.resolved(family)
                except ValidationError as e:
                    msg = e.errors()[0]["msg"].removeprefix("Value error, ")
                    raise ValueError(f"model.params.{family}: {msg}") from None
        for key, value in self.params.model_dump().items():
            # a default written back by model_dump (a tune trial's config) is not the user's choice
            if (
                key not in BOOSTER_KEYS
                or value is None
                or key not in self.params.model_fields_set
                or value == BoosterParams.model_fields[key].default
            ):
                continue
            takers = [f for f in BOOSTER_KEYS[key] if f in boosters]
            if not takers:
                takes = BOOSTER_KEYS[key]
                named = " and ".join(takes) if len(takes) < 3 else ", ".join(takes[:-1]) + " and " + takes[-1]
                raise ValueError(f"model.params.{key}: applies to {named}, which model.type {families} does not train")
        return self

    @field_validator("hidden_sizes")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(h <= 0 for h in v):
            raise ValueError("every hidden size must be a positive integer")
        return v


class EarlyStoppingSection(_Section):
    """Stop when checkpoint.metric has not improved by min_delta for patience epochs."""

    patience: int | Literal["auto", "off"] = key(
        "auto",
        "epochs without an improvement of `checkpoint.metric` before stopping; `auto`: "
        f"max({MIN_PATIENCE}, epochs / {PATIENCE_SHARE}); "
        "`off`: never stop early",
    )
    min_delta: float = key(1e-4, "the smallest change that counts as an improvement", ge=0.0)

    @field_validator("patience")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be >= 1, 'auto' or 'off'")
        return v


class TrainSection(_Section):
    epochs: int | Literal["auto"] = key(
        "auto",
        f"the networks' most epochs (early stopping may end sooner); `auto`: about {TARGET_STEPS:,} optimizer "
        f"steps per worker, {MIN_AUTO_EPOCHS}-{MAX_AUTO_EPOCHS} epochs, from the training rows and the workers",
    )
    batch_size: int | Literal["auto"] = key(
        "auto",
        "the networks' rows per optimizer step per worker; `auto`: rows per worker / "
        f"{ROWS_PER_STEP} as a power of two, {MIN_BATCH}-{MAX_BATCH}",
    )
    learning_rate: float = key(1e-3, "the networks' AdamW peak learning rate", gt=0.0)
    weight_decay: float = key(0.01, "the networks' AdamW decoupled weight decay", ge=0.0)
    schedule: Literal["cosine", "constant"] = key(
        "cosine",
        "the networks' per-step learning rate after the warm-up: `cosine` (to 0 at the last epoch) or `constant`",
    )
    warmup_fraction: float = key(0.05, "the networks' linear warm-up, as a fraction of all steps", ge=0.0, lt=1.0)
    early_stopping: EarlyStoppingSection = key(
        doc="the networks stop when `checkpoint.metric` stops improving", default_factory=EarlyStoppingSection
    )
    class_weight: Literal["balanced"] | dict[str, float] | None = key(
        None,
        "classification: `balanced` (n / (classes x count), as scikit-learn) or `{class: weight}`; the loss of "
        "`mlp` and `torch` takes it (the boosters do not, and say so in the log); their probabilities are "
        "recalibrated (`calibration.method: auto`)",
    )
    label_smoothing: float = key(
        0.0,
        "classification, the networks: train on cross-entropy against labels smoothed by this much; validation "
        "metrics, early stopping and every choice read the plain loss",
        ge=0.0,
        lt=1.0,
    )
    folds: int | Literal["auto"] = key(
        "auto",
        f"cross-fitting: K (2-{MAX_FOLDS}) fold models per family on the non-test rows, each early-stopped on its own "
        "held-out fold; their out-of-fold predictions choose the family, weight the ensemble and fit "
        "calibration and the threshold, and the served model averages them; `1`: one validation split; `auto`: "
        f"{AUTO_FOLDS} folds up to {AUTO_FOLD_ROWS:,} non-test rows, else 1 "
        "([pipeline.md](pipeline.md#cross-fitting-every-non-test-row-trains-and-is-judged))",
    )
    time_limit: float | Literal["auto", "off"] = key(
        "auto",
        "seconds for all of the training, every family and fold; in the families' order each may use the time "
        "left, each of its runs the time left divided by the waves of its own runs still to start, and a run "
        "stops adding epochs or rounds when its share is spent, keeping its best so far; a family whose runs "
        f"would get under {MIN_RUN_S:.0f} s each is left out with the reason; `auto`: no limit until the first "
        "family's runs end, then the others share what keeps all of the training within max(twice that time, "
        f"{AUTO_FLOOR_S:.0f} s); `off`: "
        "no limit ([families.md](families.md#one-time-budget))",
    )

    @field_validator("time_limit")
    @classmethod
    def _time_limit(cls, v: float | str) -> float | str:
        if isinstance(v, (int, float)) and not (math.isfinite(v) and v > 0):
            raise ValueError("must be a positive number of seconds, 'auto' or 'off'")
        return v

    @field_validator("folds")
    @classmethod
    def _fold_count(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 20:
            raise ValueError("must be 1 (one validation split), 2 to 20 folds, or 'auto'")
        return v

    @field_validator("epochs", "batch_size")
    @classmethod
    def _at_least_one(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be >= 1 or 'auto'")
        return v

    @field_validator("learning_rate", "weight_decay")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @field_validator("class_weight", mode="before")
    @classmethod
    def _class_names_as_text(cls, v: Any) -> Any:
        # YAML reads `{0: 1, 1: 5}` with integer keys; classes are matched by their text form
        return {str(k): w for k, w in v.items()} if isinstance(v, dict) else v

    @field_validator("class_weight")
    @classmethod
    def _weights_positive(cls, v: Any) -> Any:
        if isinstance(v, dict):
            for cls_name, w in v.items():
                if not (math.isfinite(w) and w > 0):
                    raise ValueError(f"weight of class {cls_name!r} must be a positive number, got {w}")
        return v


DEPRECATED_SCALING = {
    "trainer_resources": "Ray 2.60 (Train V2) runs the trainer's controller with 0 CPUs and rejects "
    "trainer_resources; remove it and put what each worker needs in scaling.resources_per_worker",
    "max_retries": "use failure.max_failures",
}


def workers_share_gpus(num_workers: int, use_gpu: bool, resources_per_worker: dict[str, float] | None) -> bool:
    """Several workers with a fraction of a GPU each: Ray packs them onto the same device."""
    gpu = (resources_per_worker or {}).get("GPU", 0)
    return bool(use_gpu) and num_workers > 1 and 0 < gpu < 1


class ScalingSection(_Section):
    num_workers: int = key(2, "Ray Train workers, each a process with a share of the data", ge=0)
    use_gpu: bool = key(False, "one GPU per worker unless `resources_per_worker.GPU` says otherwise")
    resources_per_worker: dict[str, float] | None = key(
        None, "e.g. `{CPU: 2, GPU: 0.5}`; GPU needs `use_gpu: true`", shown="Ray's default"
    )
    accelerator_type: str | None = key(None, "the GPU type the workers ask for, e.g. `A100`")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = key(
        "PACK", "how the workers are placed on the nodes: `PACK`, `SPREAD`, `STRICT_PACK`, `STRICT_SPREAD`"
    )
    backend: Literal["gloo", "nccl", "hccl"] | None = key(
        None,
        "the networks' collective backend: `gloo`, `nccl` (needs `use_gpu`, and a whole GPU per worker when there "
        "are several), `hccl`",
        shown="Ray's: `nccl` with GPUs, `gloo` without; `gloo` for workers that share a GPU (NCCL refuses two ranks on "
        'one device, "Duplicate GPU detected")',
    )
    env_vars: dict[str, str] = key(
        doc="environment of every Train worker, e.g. `{NCCL_SOCKET_IFNAME: eth0}`; shown "
        "and logged with secret-looking values masked",
        default_factory=dict,
    )
    wait_for_resources: bool = key(False, "skip the pre-start fit check and wait for an autoscaler")

    @model_validator(mode="before")
    @classmethod
    def _deprecated(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            for key, instead in DEPRECATED_SCALING.items():
                if key in raw:
                    raise ValueError(f"{key} is not supported: {instead}")
        return raw

    @model_validator(mode="after")
    def _gpu_needs_use_gpu(self) -> ScalingSection:
        res = self.resources_per_worker or {}
        for key, val in res.items():
            if val < 0:
                raise ValueError(f"resources_per_worker.{key}: must be >= 0, got {val}")
        if res.get("GPU", 0) > 0 and not self.use_gpu:
            raise ValueError("resources_per_worker.GPU is set but use_gpu is false; set scaling.use_gpu: true")
        if self.backend == "nccl" and not self.use_gpu:
            raise ValueError("backend: nccl needs GPUs; set scaling.use_gpu: true or use gloo")
        if self.backend == "nccl" and workers_share_gpus(self.num_workers, self.use_gpu, res):
            raise ValueError(
                f"backend: nccl cannot train {self.num_workers} workers at resources_per_worker.GPU "
                f"{res['GPU']:g}: Ray places such workers on the same GPU and NCCL refuses two ranks on one "
                "device ('Duplicate GPU detected'); leave backend unset (trainflow then uses gloo) or give "
                "each worker a whole GPU"
            )
        return self


SEARCH_KINDS = {"loguniform": 2, "uniform": 2, "randint": 2, "choice": None, "grid": None}


class TuneSection(_Section):
    num_samples: int = key(4, "trials, each a full Ray Train run", ge=1)
    max_concurrent_trials: int | None = key(None, "the most trials at once", shown="as many as the cluster holds", ge=1)
    metric: str | None = key(None, "what the sweep optimises", shown="`checkpoint.metric`")
    mode: Literal["min", "max"] | None = key(None, "`min` or `max`", shown="from the metric")
    scheduler: Literal["asha", "fifo"] = key("asha", "`asha` (early stopping over epochs) or `fifo`")
    grace_period: int = key(1, "ASHA's minimum epochs", ge=1)
    reduction_factor: float = key(2.0, "ASHA's halving rate", gt=1.0)
    search_space: dict[str, dict[str, list[Any]]] = key(
        doc="dotted config key → `{loguniform: [lo, hi]}`, `{uniform: [lo, hi]}`, `{randint: [lo, hi]}`, "
        "`{choice: [...]}` or `{grid: [...]}`; left out: each family's own default space (the network: "
        "`train.learning_rate`, `train.weight_decay`, `model.dropout`, `model.hidden_sizes`; the boosters: "
        "`model.params.learning_rate`, `max_depth`, `subsample`, `reg_lambda`), the family searched too when there "
        "are several; a key one family does not read is ignored by it",
        shown="each family's default space",
        default_factory=dict,
    )

    @field_validator("search_space")
    @classmethod
    def _known_kinds(cls, space: dict[str, dict[str, list[Any]]]) -> dict[str, dict[str, list[Any]]]:
        for key, spec in space.items():
            if len(spec) != 1 or next(iter(spec)) not in SEARCH_KINDS:
                raise ValueError(
                    f"{key}: give exactly one of {sorted(SEARCH_KINDS)}, e.g. {{loguniform: [0.0001, 0.01]}}"
                )
            kind, args = next(iter(spec.items()))
            if not isinstance(args, list) or not args or (SEARCH_KINDS[kind] and len(args) != SEARCH_KINDS[kind]):
                raise ValueError(
                    f"{key}.{kind}: expected a list of {SEARCH_KINDS[kind] or 'one or more'} values, got {args!r}"
                )
            if kind in ("loguniform", "uniform", "randint") and not args[0] < args[1]:
                raise ValueError(f"{key}.{kind}: the lower bound must be below the upper bound, got {args!r}")
            if kind == "loguniform" and args[0] <= 0:
                raise ValueError(f"{key}.loguniform: bounds must be positive, got {args!r}")
        return space


class RaySection(_Section):
    address: str | None = key(
        None,
        "join an existing cluster (`auto`, `host:6379`, `ray://host:10001`)",
        shown="`$RAY_ADDRESS`, else start a local Ray (a cluster `ray start` left on the machine is joined only when "
        "named, e.g. `auto`)",
    )
    runtime_env: dict[str, Any] | None = key(
        None,
        "passed to `ray.init`, e.g. `{working_dir: .}` for a cluster "
        "without trainflow installed; on the local Ray trainflow starts, "
        "its `env_vars` reach Ray's processes through their environment "
        "(never Ray's logs)",
    )
    temp_dir: str | None = key(
        None,
        "the local Ray's session folder (logs, sockets, spilled objects), kept after the "
        "run; must be private to its owner (mode 700, created so)",
        shown="a new private folder under the system's temporary folder, removed when the run's Ray stops",
    )


class CheckpointSection(_Section):
    num_to_keep: int | None = key(3, "best checkpoints kept (the latest is always kept too)", ge=1)
    metric: str = key("val_loss", "the metric that ranks checkpoints; must be reported for the task")
    mode: Literal["min", "max"] | None = key(
        None, "`min` or `max`", shown="`min` for losses and errors, `max` otherwise"
    )
    # each Ray Train report waits for the controller's poll (0.5 s here)
    min_interval_s: float = key(
        2.0,
        "epochs shorter than this are grouped into one Ray Train report; the best epoch "
        "of each group is always reported with its checkpoint",
        ge=0.0,
    )


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


class FailureSection(_Section):
    max_failures: int = key(2, "Ray Train worker-group restarts (`-1`: unlimited)", ge=-1)
    hang_timeout_s: float | Literal["auto"] | None = key(
        "auto",
        f"a worker with no progress this long is killed and the group restarted (`null`: never); `auto`: "
        f"{HANG_FACTOR:.0f}x the longest gap between progress marks (mini-batches, blocks, reports, boosting "
        f"rounds) measured in that attempt, at least {HANG_MIN_S:.0f} s; start-up, until the first mark, is "
        f"allowed at least {HANG_FIRST_S:.0f} s whatever the value; a run whose attempts all stall ends with "
        "an error naming what to change (not retried)",
    )
    task_retries: int = key(2, "Prefect retries of the `train` task once Ray Train gives up", ge=0)
    retry_delay_s: float = key(5.0, "seconds between those retries", ge=0)
    worker_start_timeout_s: float = key(
        180.0,
        "seconds Ray Train waits for a worker group to start before that attempt fails (Ray's own default, "
        "60 s, expired on a loaded two-core machine after a worker died); a group that cannot be placed at all "
        "is caught before training",
        gt=0,
    )

    @field_validator("hang_timeout_s")
    @classmethod
    def _positive_timeout(cls, v: float | str | None) -> float | str | None:
        if isinstance(v, (int, float)) and v <= 0:
            raise ValueError("must be a positive number of seconds, 'auto', or null to disable the watchdog")
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
    output: str | None = key(None, "the Parquet output folder (local or URI)")
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
        return self


class ServicesSection(_Section):
    """How long a run waits out a service that does not answer before it fails naming it (trainflow/services.py)."""

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
        doc="the training: folds, the time limit, and the networks' epochs, batch size, optimizer "
        "and schedule (sized to the table by default)",
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
    services: ServicesSection = key(
        doc="how long a run waits out the MLflow server, the Prefect API and the object "
        "store when they do not answer ([operations.md](operations.md))",
        default_factory=ServicesSection,
    )
    # the config file's folder (load_config), which an output must not replace; not part of the config's data
    _source_dir: str | None = PrivateAttr(default=None)
    # why `task` is what it is, when the config left it out and the label decided it
    _task_inferred: str | None = PrivateAttr(default=None)

    @property
    def task_inferred(self) -> str | None:
        return self._task_inferred

    @property
    def source_dir(self) -> str | None:
        return self._source_dir

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
        if isinstance(self.train.folds, int) and self.train.folds > 1 and self.split.test_fraction == 0:
            raise ValueError(
                f"train.folds: {self.train.folds} folds with split.test_fraction 0 leave no row that the "
                "served model (every fold model averaged) did not train on, so nothing could judge it: "
                "set split.test_fraction above 0, or train.folds: 1"
            )
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

    def require_tune(self) -> TuneSection:
        """The sweep's settings: the tune section, or its defaults. Without tune.search_space each family searches
        its own default space, and with several families (auto, a list) the family is a search dimension too
        (trainer/tune.py sweep_space)."""
        return self.tune or TuneSection()

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
        if self.scaling.num_workers < 1:
            raise ConfigError(
                "scaling.num_workers: the retrain pipeline needs at least 1 Ray Train worker "
                "(0 is Ray Train's local mode, which keeps no checkpoints to select, resume or register)"
            )

    def require_inference(self) -> None:
        if not self.inference.input:
            raise ConfigError("inference.input and inference.output must be set to run batch inference")

    def apply_to_process(self) -> None:
        """This process waits out absent services as long as `services` says and masks this config's secrets in its
        log lines: load_config does it for the driver, each Ray Train worker for itself (trainer/watchdog.Watched)."""
        _apply_waits(self.services, self.mlflow.tracking_uri)
        protect(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

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
        if family in BOOSTERS:  # the library keys it takes; the networks' layers and optimiser never reach it
            model: dict[str, Any] = {"type": family, "params": self.model.params.resolved(family).for_family(family)}
            train: dict[str, Any] = {"folds": self.train.folds}
        else:  # a booster's params never reach a network
            dumped = self.model.model_dump(mode="json")
            model = {"type": family, **{k: dumped[k] for k in NETWORK_KEYS[family]}}
            if model.get("architecture") == "mlp":  # keys only TabM reads never change a plain MLP's hash
                del model["architecture"], model["tabm_k"]
            train = self.train.model_dump(mode="json", exclude={"epochs", "early_stopping", "time_limit"})
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


def infer_format(path: str) -> Literal["parquet", "csv"]:
    """Guess the table format from a path's extension; folders and globs default to parquet."""
    lower = path.lower().rstrip("/")
    for suffix in (".gz", ".bz2", ".zst"):
        lower = lower.removesuffix(suffix)
    return "csv" if lower.endswith(".csv") else "parquet"


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """Return a copy of raw with each dotted key (e.g. 'train.epochs') set to its value."""
    out = copy.deepcopy(raw)
    for dotted, value in (overrides or {}).items():
        parts = str(dotted).split(".")
        node = out
        for part in parts[:-1]:
            if node.get(part) is None:  # an unset block (model.params.xgboost: null) takes its first key
                node[part] = {}
            nxt = node[part]
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {dotted!r}: {part!r} is not a section")
            node = nxt
        node[parts[-1]] = value
    return out


def _resolve(path: str | None, base: Path) -> str | None:
    if path is None or is_uri(path):
        return path
    path = path.removeprefix("file://")
    p = Path(os.path.expanduser(path))
    return str(p if p.is_absolute() else (base / p).resolve())


def _format_errors(err: ValidationError, source: str) -> str:
    """One line per key: a misspelled key with the closest known one, and a value refused by every member of a
    union (e.g. model.type: a family or a list of them) as one line listing what each would take."""
    by_key: dict[str, list[dict]] = {}
    for e in err.errors():
        # pydantic names union members in the location (literal['mlp',...], list[...]): the key is the rest
        parts = [str(x) for x in e["loc"] if not (isinstance(x, str) and ("[" in x or "(" in x or x in _UNION_TAGS))]
        by_key.setdefault(".".join(parts) or "(top level)", []).append(e)
    lines = []
    for key, errors in by_key.items():
        if any(other.startswith(key + ".") for other in by_key):  # a list's item is named below: that line says it
            continue
        e = errors[0]
        if e["type"] == "extra_forbidden":
            parent, name = key.rpartition(".")[::2]
            lines.append(f"  {key}: unknown key" + _closest_key(name, parent))
        elif e["type"] == "missing":
            lines.append(f"  {key}: required key is missing")
        else:
            msgs = list(dict.fromkeys(x["msg"].removeprefix("Value error, ") for x in errors))
            msg = msgs[0] + "".join(f", or {m.removeprefix('Input should be ')}" for m in msgs[1:])
            got = e.get("input")
            choices = [c for x in errors for c in re.findall(r"'([^']*)'", (x.get("ctx") or {}).get("expected", ""))]
            close = difflib.get_close_matches(got, choices, n=1, cutoff=0.6) if isinstance(got, str) else []
            lines.append(
                (f"  {key}: {msg} (got {got!r})" if "input" in e and not isinstance(got, dict) else f"  {key}: {msg}")
                + (f"; did you mean {close[0]!r}?" if close else "")
            )
    return f"invalid config {source}:\n" + "\n".join(lines)


_UNION_TAGS = {"int", "float", "str", "bool", "none", "dict", "list"}  # how pydantic names a union's plain types


def _closest_key(name: str, parent: str) -> str:
    """'; did you mean <parent>.<key>?' for the known key of the section at parent closest to name."""
    import typing

    model: Any = Config
    for part in [p for p in parent.split(".") if p]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return ""
        found = [
            a
            for a in (field.annotation, *typing.get_args(field.annotation))
            if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        if not found:
            return ""
        model = found[0]
    close = difflib.get_close_matches(name, list(getattr(model, "model_fields", {})), n=1, cutoff=0.6)
    return f"; did you mean {'.'.join(filter(None, [parent, close[0]]))}?" if close else ""


def config_from_dict(raw: dict[str, Any], base_dir: str | Path = ".", source: str = "<dict>") -> Config:
    """Validate a raw mapping and resolve its relative paths against base_dir."""
    if not isinstance(raw, dict):
        raise ConfigError(f"invalid config {source}: expected a mapping of sections, got {type(raw).__name__}")
    base = Path(base_dir).resolve()
    _apply_waits(raw.get("services"), None)  # reading the table to infer the task already waits as the config says
    raw, task_note = _with_task(raw, base)
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None
    cfg._task_inferred = task_note
    cfg.data.path = _resolve(cfg.data.path, base)
    cfg.storage_path = _resolve(cfg.storage_path, base)
    if not is_uri(cfg.storage_path):
        resolved = os.path.realpath(os.path.expanduser(cfg.storage_path))
        if resolved in ("/", os.path.realpath(os.path.expanduser("~"))):
            raise ConfigError(
                f"storage_path {cfg.storage_path!r} is {'the root folder' if resolved == '/' else 'your home folder'}: "
                "trainflow writes run folders there and cleans its own; give it a folder of its own "
                "(e.g. storage_path: runs)"
            )
    cfg.inference.input = _resolve(cfg.inference.input, base)
    cfg.inference.output = _resolve(cfg.inference.output, base)
    uri = cfg.mlflow.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri is None:
        uri = (
            f"sqlite:///{Path(cfg.storage_path).parent / 'mlflow.db'}"
            if not is_uri(cfg.storage_path)
            else "sqlite:///mlflow.db"
        )
    elif uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + _resolve(uri.removeprefix("sqlite:///"), base)
    elif "://" not in uri:
        uri = _resolve(uri, base)
    cfg.mlflow.tracking_uri = uri
    cfg.ray.address = cfg.ray.address or os.environ.get("RAY_ADDRESS") or None
    if cfg.tune is not None:
        _check_search_space(cfg, source)
    cfg.apply_to_process()  # its waits from here on, and its secrets masked in every log line
    return cfg


def _apply_waits(services: ServicesSection | dict | None, tracking_uri: str | None) -> None:
    """This process waits out absent services for as long as the config says (an invalid section: the defaults, and
    validation names the problem)."""
    from trainflow import services as waits

    if not isinstance(services, ServicesSection):
        try:
            services = ServicesSection.model_validate(services or {})
        except ValidationError:
            services = ServicesSection()
    waits.apply(services.mlflow_wait_s, services.prefect_wait_s, services.storage_wait_s, tracking_uri)


def _with_task(raw: dict[str, Any], base: Path) -> tuple[dict[str, Any], str | None]:
    """raw with `task` set from the label's values when the config leaves it out, and the reason; raw unchanged when
    the data section itself is invalid (validation then names every problem)."""
    if raw.get("task") is not None:
        return raw, None
    try:
        data = DataSection.model_validate(raw.get("data"))
    except ValidationError:
        return raw, None
    from trainflow.tables import infer_task

    task, why = infer_task(_resolve(data.path, base), data.format, data.label, data.csv)
    return {**raw, "task": task}, f"task: {task} ({why}; set task to choose)"


def _check_search_space(cfg: Config, source: str) -> None:
    """Every searched key is a config key that accepts each choice / bound the space can produce."""
    base = cfg.to_dict()
    searched = next(iter(cfg.tune.search_space.get("model.type", {}).values()), [])
    sweep = [*cfg.model.families, *(f for f in searched if isinstance(f, str))]  # a key none of them reads is refused
    for key, spec in cfg.tune.search_space.items():
        if key.split(".")[0] in ("tune", "data", "task", "storage_path", "mlflow", "inference", "ray"):
            raise ConfigError(f"invalid config {source}:\n  tune.search_space.{key}: this key cannot be tuned")
        kind, args = next(iter(spec.items()))
        for value in args:
            try:
                trial_config(base, {key: value}, sweep)
            except ConfigError as exc:
                detail = str(exc).split("\n", 1)[-1].strip()
                raise ConfigError(
                    f"invalid config {source}:\n  tune.search_space.{key}.{kind}: {value!r} fails: {detail}"
                ) from None


def trial_config(base: dict[str, Any], sampled: dict[str, Any], sweep: list[str] | None = None) -> Config:
    """A resolved config (as a dict) with one trial's sampled values set at their dotted keys, validated. The trial
    trains one family of the sweep's; the keys of the others stay (each family reads only its own): sweep, the
    families whose keys are accepted (every family unless given: base was validated whole when it was loaded)."""
    try:
        return Config.model_validate(apply_overrides(base, sampled), context={"sweep_families": sweep or FAMILIES})
    except ValidationError as err:
        raise ConfigError(_format_errors(err, "(trial)")) from None


# configs handed to a flow called in this process (the Python API): the flow gets the key as its config_path, so a
# config object, which may hold secrets, never becomes a flow parameter that Prefect stores
IN_PROCESS = "in-process:"
_handed_over: dict[str, Config] = {}


def hand_over(cfg: Config) -> str:
    """A config_path under which load_config in this process returns cfg (until forget(key))."""
    key = f"{IN_PROCESS}{uuid.uuid4().hex}"
    _handed_over[key] = cfg
    return key


def forget(key: str) -> None:
    _handed_over.pop(key, None)


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader without aliases (an alias bomb expands exponentially; a config never needs one) and
    without duplicated keys (the last one would silently win)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None,
                None,
                "YAML aliases (*name) are not accepted in a trainflow config: write the value out",
                self.peek_event().start_mark,
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} appears twice (lines {seen[key]} and {line}); keep one",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep)


def load_yaml(text: str) -> Any:
    """A config's YAML: safe types only, no aliases, no duplicated keys (yaml.YAMLError naming the line)."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass


def storage_path_of(config: str | Path | dict[str, Any], overrides: dict[str, Any] | None = None) -> str:
    """The storage_path a config file or mapping names (resolved as load_config resolves it), read without
    validating the rest: the Python API writes a table handed over in memory there before data.path exists."""
    if isinstance(config, dict):
        raw, base = config, Path.cwd()
    else:
        path = Path(config).resolve()
        try:
            raw, base = load_yaml(path.read_text()) or {}, path.parent
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from None
    raw = apply_overrides(raw if isinstance(raw, dict) else {}, overrides)
    return _resolve(str(raw.get("storage_path") or Config.model_fields["storage_path"].default), base)


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> Config:
    """Read a YAML config file, apply dotted overrides, validate, and resolve paths (or return the config that
    hand_over gave this key)."""
    if str(path).startswith(IN_PROCESS):
        if str(path) not in _handed_over:
            raise ConfigError(
                f"config_path {path}: a config handed over in another process (the Python API's); "
                "give a config file's path"
            )
        cfg = _handed_over[str(path)]
        return config_from_dict(apply_overrides(cfg.to_dict(), overrides)) if overrides else cfg
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        raw = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    raw = apply_overrides(raw or {}, overrides)
    cfg = config_from_dict(raw, base_dir=path.resolve().parent, source=str(path))
    cfg._source_dir = str(path.resolve().parent)
    return cfg
