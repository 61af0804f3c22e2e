"""model: the families a run trains and their keys. This section knows no family by name: model.type's choices, which
family takes each model.params key, each family's own block (model.params.<family>), the network's keys in this
section and the checks on them all come from the families (trainer/families/), found through the catalogue
(trainflow/catalogue.py); a new family's keys appear here, in the schema and in the docs' key table with no change
to this file."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    create_model,
    model_validator,
)
from pydantic.fields import FieldInfo

from trainflow.catalogue import families as catalogue
from trainflow.config.base import _Section, key

ENSEMBLE = "ensemble"  # what a checkpoint's model.type says when it weights several families' checkpoints
_CATALOGUE = catalogue()
FAMILIES = tuple(_CATALOGUE)
FamilyName = Literal[FAMILIES]  # type: ignore[valid-type]
# model.type auto: the families it trains, and those it trains when train.time_limit is given in seconds
AUTO_FAMILIES = tuple(n for n, f in _CATALOGUE.items() if f.auto_rank is not None and f.auto_when != "timed")
AUTO_TIMED_FAMILIES = tuple(n for n, f in _CATALOGUE.items() if f.auto_rank is not None and f.auto_when != "untimed")
_OWN_PARAMS = {name: family.params for name, family in _CATALOGUE.items() if family.params is not None}
# the families whose keys their runs read from the model section itself (the networks': their checkpoints' layout);
# model.params.<family> is where a user writes them, copied there before validation
_MODEL_KEYS = {name: family.model_keys for name, family in _CATALOGUE.items() if family.model_keys is not None}
# which families take each model.params key (a key several take means the same for each)
KEY_TAKERS: dict[str, tuple[str, ...]] = {}
for _name, _params in _OWN_PARAMS.items():
    for _key in _params.model_fields:
        KEY_TAKERS[_key] = (*KEY_TAKERS.get(_key, ()), _name)
# which families read each key of this section itself (the networks', kept there: their checkpoints' layout)
MODEL_KEY_READERS: dict[str, tuple[str, ...]] = {}
for _name, _family in _CATALOGUE.items():
    for _key in _family.model_keys.model_fields if _family.model_keys else ():
        MODEL_KEY_READERS[_key] = (*MODEL_KEY_READERS.get(_key, ()), _name)
# those of them that were train.<key> before they moved into the model section (Family.train_keys: the networks'
# optimizer and schedule), read from there with a warning (train_keys_moved) and hashed as train keys
TRAIN_KEYS_MOVED = frozenset(k for f in _CATALOGUE.values() for k in f.train_keys)


def _listed(names: tuple[str, ...] | list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _typed(field: FieldInfo) -> Any:
    """A field's type with its bounds (ge, le, ...), to declare it again elsewhere."""
    return Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation


def _shared_field(name: str) -> tuple[Any, FieldInfo]:
    """model.params.<name>: the key as the first family taking it declares it. A library's own key (unset by default)
    is described by who takes it, and under which of their own names."""
    takers = KEY_TAKERS[name]
    field = _OWN_PARAMS[takers[0]].model_fields[name]
    extra = dict(field.json_schema_extra or {}) if isinstance(field.json_schema_extra, dict) else {}
    extra.pop("x-library-name", None)
    description = field.description
    if field.default is None:
        renamed = [
            f"{t}'s `{own}`"
            for t in takers
            if (own := (_OWN_PARAMS[t].model_fields[name].json_schema_extra or {}).get("x-library-name"))
        ]
        description = f"{_listed(takers)}'s own `{name}`" + (f" ({', '.join(renamed)})" if renamed else "")
        extra.setdefault("x-default", "the library's")
    if field.default_factory is not None:
        made = Field(default_factory=field.default_factory, description=description, json_schema_extra=extra or None)
    else:
        made = Field(field.default, description=description, json_schema_extra=extra or None)
    return _typed(field), made


_SHARED = {name: _shared_field(name) for name in KEY_TAKERS}


def _family_block(family: str) -> type[_Section]:
    """model.params.<family>: the keys this family takes, each unset (None) unless written, so only what the user
    wrote there overrides the shared value (a network's: its default); another family's key is refused naming whose
    it is."""
    if family in _OWN_PARAMS:
        taken = list(_OWN_PARAMS[family].model_fields)
        fields: dict[str, Any] = {
            name: (
                _SHARED[name][0] | None,
                Field(
                    None, description=_SHARED[name][1].description, json_schema_extra={"x-default": "the shared value"}
                ),
            )
            for name in taken
        }
    else:
        own = _MODEL_KEYS[family].model_fields
        taken = list(own)
        fields = {
            name: (_typed(field) | None, Field(None, description=field.description)) for name, field in own.items()
        }

    def _own_keys(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            for name in raw:
                if name not in taken and name in KEY_TAKERS:
                    raise ValueError(
                        f"{name}: {family} does not take it (it is {' and '.join(KEY_TAKERS[name])}'s); "
                        f"set it under model.params or model.params.{KEY_TAKERS[name][0]}"
                    )
                if name not in taken and name in MODEL_KEY_READERS:
                    readers = MODEL_KEY_READERS[name]
                    raise ValueError(
                        f"{name}: {family} does not take it (it is {' and '.join(readers)}'s); "
                        f"set it under model.params.{readers[0]}"
                    )
        return raw

    return create_model(
        f"{family.title()}Params",
        __base__=_Section,
        __module__=__name__,
        __doc__=f"{family}'s own values of model.params' keys, over the shared ones",
        __validators__={"_own_keys": model_validator(mode="before")(classmethod(_own_keys))},
        **fields,
    )


def _error(e: ValidationError) -> str:
    """A family's validation error as one line: the key and the message."""
    first = e.errors()[0]
    msg = first["msg"].removeprefix("Value error, ")
    return f"{'.'.join(map(str, first['loc']))}: {msg}" if first["loc"] else msg


class _ParamsWithBlocks(_Section):
    """model.params: every family's keys, shared by every family the run trains that takes the key, and one block per
    family (model.params.xgboost, ...) whose keys override the shared ones for that family alone."""

    def family_block(self, family: str) -> BaseModel | None:
        return getattr(self, family, None)

    def resolved(self, family: str) -> _ParamsWithBlocks:
        """The params as this family's run reads them: the shared keys the user set, overridden by the family's own
        block, validated by the family's own Params (e.g. external_memory against tree_method); no blocks."""
        chosen = {k: getattr(self, k) for k in self.model_fields_set if family in KEY_TAKERS.get(k, ())}
        block = self.family_block(family)
        if block is not None:
            chosen.update({k: getattr(block, k) for k in block.model_fields_set if getattr(block, k) is not None})
        _OWN_PARAMS[family].model_validate({k: v for k, v in chosen.items() if v is not None})
        return ParamsSection(**chosen)

    def for_family(self, family: str) -> dict[str, Any]:
        """The library keys this family takes, without the unset ones (trainflow's own keys are not passed on)."""
        own = _CATALOGUE[family].trainflow_keys
        return {
            k: v
            for k, v in self.model_dump().items()
            if family in KEY_TAKERS.get(k, ()) and v is not None and k not in own
        }

    @model_validator(mode="after")
    def _shared_values(self) -> _ParamsWithBlocks:
        """A shared key's value, checked as the first family taking it checks it (its validators)."""
        for name in self.model_fields_set & set(KEY_TAKERS):
            value = getattr(self, name)
            if value is not None:
                try:
                    _OWN_PARAMS[KEY_TAKERS[name][0]].model_validate({name: value})
                except ValidationError as e:
                    raise ValueError(_error(e)) from None
        return self


# each family's block class, a name of this module as any class (pickle finds it by reference)
_BLOCKS = {family: _family_block(family) for family in (*_OWN_PARAMS, *_MODEL_KEYS)}
globals().update({block.__name__: block for block in _BLOCKS.values()})
# the class above with every family's keys and one optional block per family that has params
ParamsSection = create_model(
    "ParamsSection",
    __base__=_ParamsWithBlocks,
    __module__=__name__,
    __doc__=_ParamsWithBlocks.__doc__,
    **_SHARED,
    **{
        family: (
            _BLOCKS[family] | None,
            Field(
                None,
                description=f"{family}'s own values of the keys above (those it takes), over the shared ones, e.g. "
                f"`model.params.{family}.{next(iter(_OWN_PARAMS[family].model_fields))}`; a key it does not take is "
                "refused",
                json_schema_extra={"x-family-block": True},
            ),
        )
        for family in _OWN_PARAMS
    },
    **{
        family: (
            _BLOCKS[family] | None,
            Field(
                None,
                description=f"{family}'s keys: {', '.join(f'`{k}`' for k in _MODEL_KEYS[family].model_fields)} "
                f"(described at `model.<key>`, their earlier place, still read with a warning), e.g. "
                f"`model.params.{family}.{next(iter(_MODEL_KEYS[family].model_fields))}`",
                json_schema_extra={"x-family-block": True},
            ),
        )
        for family in _MODEL_KEYS
    },
)


class _Model(_Section):
    """The model families: each trains as its own Ray Train run; a list trains each and keeps the best."""

    type: Literal["auto"] | FamilyName | list[FamilyName] = key(  # type: ignore[valid-type]
        "auto",
        f"the families trained: `auto` (`[{', '.join(AUTO_FAMILIES)}]`; with `train.time_limit` in seconds "
        f"`[{', '.join(AUTO_TIMED_FAMILIES)}]`), one of "
        f"{_listed([f'`{f}`' for f in FAMILIES]).replace(' and ', ' or ')}, or a list of them; each family "
        "trains as its own Ray Train run, with their weighted ensemble (`model.ensemble`), and the best on rows "
        "its training never saw goes on ([families.md](families.md)). `auto` leaves out a family that cannot "
        "fit or fails (summary `families_left_out`); a single family you name fails the run instead. A sweep "
        "(`tune`) trains one family per trial and searches the family when there are several",
    )
    allowed_class_paths: list[str] = key(
        doc="module classes a model read from the registry or storage may import besides `model.class_path` (the "
        "gate's champion, `predict --model`); any other is refused, never imported: storage someone else can write "
        "to never chooses the code",
        default_factory=list,
    )
    params: ParamsSection = key(  # type: ignore[valid-type]
        doc="the families' own parameters: each key shared by every trained family that takes it, with a block per "
        "family over them (`model.params.xgboost`, ...); a key no trained family takes is refused",
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
        """The families in the order their runs start: the config's, or under auto by each family's auto_rank (when
        cross-fitting, and on one split)."""
        if self.auto:
            slot = 0 if folds > 1 else 1
            return sorted(self.families, key=lambda f: _CATALOGUE[f].auto_rank[slot])
        return self.families

    def for_family(self, family: str) -> dict[str, Any]:
        """This section as one family's config (model.type a single name, model.params as that family reads them)."""
        return self.family_section(family).model_dump(mode="json")

    def family_section(self, family: str) -> _Model:
        """This section as one family's run reads it: model.type that family; its params resolved (its own block
        over the shared keys, no blocks)."""
        update: dict[str, Any] = {"type": family}
        if family in _OWN_PARAMS:
            update["params"] = self.params.resolved(family)
        return self.model_copy(update=update)

    def hashed(self, family: str) -> dict[str, Any]:
        """The keys of this section that decide family's weights (Config.training_hash), as the family says: its
        library keys as its run reads them, its keys in this section; another family's keys never change it."""
        model: dict[str, Any] = {"type": family}
        if family in _OWN_PARAMS:
            model["params"] = self.params.resolved(family).for_family(family)
        own = _CATALOGUE[family].model_keys
        if own is not None:
            dumped = self.model_dump(mode="json")
            model.update({k: dumped[k] for k in own.model_fields})
        return _CATALOGUE[family].hashed(model)

    _auto: bool = PrivateAttr(False)

    @model_validator(mode="wrap")
    @classmethod
    def _expand_auto(cls, raw: Any, handler: Any) -> _Model:
        auto = isinstance(raw, dict) and raw.get("type", "auto") == "auto"
        if isinstance(raw, dict):
            raw = {**raw, **network_keys(raw)}
        # validated as every family auto may train (their keys accepted: the time limit decides which, Config)
        section = handler({**raw, "type": list(dict.fromkeys(AUTO_FAMILIES + AUTO_TIMED_FAMILIES))} if auto else raw)
        for family in _MODEL_KEYS:  # copied onto the keys its run reads (what a dump, a trial's base, holds)
            if section.params.family_block(family) is not None:
                setattr(section.params, family, None)
        section._auto = auto or section._auto
        return section

    def under(self, time_limit: float | str) -> _Model:
        """This section as a run with train.time_limit trains it: under auto, AUTO_FAMILIES, or AUTO_TIMED_FAMILIES
        when the limit is given in seconds; any other section as it is."""
        wanted = list(AUTO_TIMED_FAMILIES if not isinstance(time_limit, str) else AUTO_FAMILIES)
        if not self.auto or self.type == wanted:
            return self
        section = self.model_copy(update={"type": wanted})
        section.model_fields_set.discard("type")  # still auto's choice: a dump of the keys given leaves it out
        return section

    @property
    def auto(self) -> bool:
        """model.type auto (or left out): a family whose training data cannot fit the cluster is left out, not
        refused, as long as one remains."""
        return self._auto

    @model_validator(mode="after")
    def _family_keys(self, info: ValidationInfo) -> _Model:
        families = self.families
        if not families:
            raise ValueError(f"model.type: give a family or a list of them, from {list(FAMILIES)}")
        if len(set(families)) != len(families):
            raise ValueError(f"model.type: {families} names a family more than once")
        # a sweep's trial of one family keeps the user's keys of the sweep's other families (each reads only its own)
        scope = [*families, *((info.context or {}).get("sweep_families") or ())]
        for family in _MODEL_KEYS:
            if self.params.family_block(family) is not None and family not in scope:
                raise ValueError(
                    f"model.params.{family}: applies to {family}, which model.type {families} does not train"
                )
        for family in _CATALOGUE.values():  # each family's own checks of this section
            if family.check_config is not None:
                family.check_config(self, families)
        self._keys_for_nobody(families, scope)
        return self

    def _keys_for_nobody(self, families: list[str], scope: list[str]) -> None:
        """A key set (to something else than its default) that no family in scope reads is refused, naming who
        reads it; each family in scope's own parameters validated by its Params."""
        for name, readers in MODEL_KEY_READERS.items():  # set to something else than its default, for nobody
            default = type(self).model_fields[name].get_default(call_default_factory=True)
            if name in self.model_fields_set and getattr(self, name) != default and not set(readers) & set(scope):
                raise ValueError(
                    f"model.{name}: applies to {_listed(readers)}, which model.type {families} does not train"
                    + _auto_note(readers)
                )
        for family in _OWN_PARAMS:
            if self.params.family_block(family) is not None and family not in scope:
                raise ValueError(
                    f"model.params.{family}: applies to {family}, which model.type {families} does not train"
                    + _auto_note([family])
                )
            if family in scope:
                try:  # what this family's run reads, validated by the family's own Params
                    self.params.resolved(family)
                except ValidationError as e:
                    raise ValueError(f"model.params.{family}: {_error(e)}") from None
        for name in self.params.model_fields_set & set(KEY_TAKERS):
            value = getattr(self.params, name)
            # a default written back by model_dump (a tune trial's config) is not the user's choice
            if value is None or value == ParamsSection.model_fields[name].default:
                continue
            if not [f for f in KEY_TAKERS[name] if f in scope]:
                raise ValueError(
                    f"model.params.{name}: applies to {_listed(KEY_TAKERS[name])}, which model.type {families} "
                    "does not train"
                )


def _auto_note(families: list[str] | tuple[str, ...]) -> str:
    """Why auto does not train these families in this run, where the time limit decides it."""
    if set(families) & (set(AUTO_TIMED_FAMILIES) - set(AUTO_FAMILIES)):
        return " (auto trains it with train.time_limit in seconds)"
    if set(families) & (set(AUTO_FAMILIES) - set(AUTO_TIMED_FAMILIES)):
        return " (auto trains it unless train.time_limit is in seconds)"
    return ""


def network_keys(model: dict[str, Any]) -> dict[str, Any]:
    """The keys a raw model section's model.params.<family> blocks set for the families that read them from the
    model section itself (the networks'); each wins over the same key written at model.<key>."""
    params = model.get("params")
    found: dict[str, Any] = {}
    for family in _MODEL_KEYS if isinstance(params, dict) else ():
        block = params.get(family)
        if isinstance(block, dict):
            found.update({k: v for k, v in block.items() if k in _MODEL_KEYS[family].model_fields and v is not None})
    return found


def deprecated_keys(model: dict[str, Any]) -> list[str]:
    """The keys a raw model section sets at their earlier place (model.<key>, a network's) to something else than the
    default and not in its model.params.<family> block: one line each, naming where to write it."""
    moved = network_keys(model)
    lines = []
    for name, readers in MODEL_KEY_READERS.items():
        field = _MODEL_KEYS[readers[0]].model_fields[name]
        if name in model and name not in moved and model[name] != field.get_default(call_default_factory=True):
            lines.append(
                f"model.{name} is deprecated: write it as model.params.{readers[0]}.{name} (model.{name} is read "
                "until the next release)"
            )
    return lines


def train_keys_moved(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A raw config with the networks' keys written at their earlier place (train.epochs, train.learning_rate, ...:
    the model keys of mlp and torch) moved into its model section, where those families read them: (the config, one
    line per key moved, naming where to write it). It replaces model.<key> (the other earlier spelling, and what a
    config's dump holds: a trial's or a test's train.<key> over a dumped config wins), and model.params.<family>.<key>,
    the place to write it, wins over it; where no family model.type trains reads it, it is dropped and its line says
    so."""
    train = raw.get("train")
    found = [k for k in train if k in TRAIN_KEYS_MOVED] if isinstance(train, dict) else []
    if not found:
        return raw, []
    model = raw.get("model") if isinstance(raw.get("model"), dict) else {}
    kind = model.get("type", "auto")
    trained = list(AUTO_FAMILIES + AUTO_TIMED_FAMILIES) if kind == "auto" else [kind] if isinstance(kind, str) else kind
    trained = trained if isinstance(trained, list) else []
    given = network_keys(model)
    moved, lines = dict(model), []
    for name in found:
        readers = MODEL_KEY_READERS[name]
        where = f"model.params.{next((f for f in readers if f in trained), readers[0])}.{name}"
        if not set(readers) & set(trained):
            lines.append(
                f"train.{name} is deprecated: it is {_listed(readers)}'s, which model.type does not train; ignored "
                f"(write it as {where})"
            )
            continue
        lines.append(f"train.{name} is deprecated: write it as {where} (train.{name} is read until the next release)")
        try:  # a bad value is named where it was written
            _MODEL_KEYS[readers[0]].model_validate({name: train[name]})
        except ValidationError as e:
            raise ValueError(f"train.{name}: {_error(e).split(': ', 1)[-1]} (got {train[name]!r})") from None
        if name not in given:
            moved[name] = train[name]
    return {**raw, "train": {k: v for k, v in train.items() if k not in found}, "model": moved}, lines


# the section: _Model and the keys each family reads from it (the networks'), declared by the families
ModelSection = create_model(
    "ModelSection",
    __base__=_Model,
    __module__=__name__,
    __doc__=_Model.__doc__,
    **{
        name: (field.annotation, field)
        for family in _CATALOGUE.values()
        if family.model_keys is not None
        for name, field in family.model_keys.model_fields.items()
    },
)
