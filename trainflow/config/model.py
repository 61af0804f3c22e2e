"""model: the families a run trains and their keys (model.type, the network's keys, model.params and its blocks)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from trainflow.config.base import _Section, key


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

    def hashed(self, family: str) -> dict[str, Any]:
        """The keys of this section that decide family's weights (Config.training_hash): a booster's library keys
        as its run reads them, a network's own keys; another family's keys never change it."""
        if family in BOOSTERS:
            return {"type": family, "params": self.params.resolved(family).for_family(family)}
        dumped = self.model_dump(mode="json")
        model = {"type": family, **{k: dumped[k] for k in NETWORK_KEYS[family]}}
        if model.get("architecture") == "mlp":  # keys only TabM reads never change a plain MLP's hash
            del model["architecture"], model["tabm_k"]
        return model

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
        for name in NETWORK_KEYS["mlp"]:  # set to something else than its default, for a run without the network
            default = type(self).model_fields[name].get_default(call_default_factory=True)
            if name in self.model_fields_set and getattr(self, name) != default and "mlp" not in scope:
                raise ValueError(f"model.{name}: applies to mlp, which model.type {families} does not train")
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
        for name, value in self.params.model_dump().items():
            # a default written back by model_dump (a tune trial's config) is not the user's choice
            if (
                name not in BOOSTER_KEYS
                or value is None
                or name not in self.params.model_fields_set
                or value == BoosterParams.model_fields[name].default
            ):
                continue
            takers = [f for f in BOOSTER_KEYS[name] if f in boosters]
            if not takers:
                takes = BOOSTER_KEYS[name]
                named = " and ".join(takes) if len(takes) < 3 else ", ".join(takes[:-1]) + " and " + takes[-1]
                raise ValueError(f"model.params.{name}: applies to {named}, which model.type {families} does not train")
        return self

    @field_validator("hidden_sizes")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(h <= 0 for h in v):
            raise ValueError("every hidden size must be a positive integer")
        return v
