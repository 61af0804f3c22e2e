"""Loading a config: YAML (safe, no aliases, no duplicated keys), dotted overrides, the task from the label, paths
resolved against the file's folder, errors one line per key; and what a loaded config sets up in a process."""

from __future__ import annotations

import copy
import difflib
import os
import re
import warnings
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ValidationError,
)

from trainflow.config.data import DataSection
from trainflow.config.model import FAMILIES, MODEL_KEY_READERS, deprecated_keys, train_keys_moved
from trainflow.tables.sources import SOURCES
from trainflow.config.operations import ServicesSection
from trainflow.config.root import Config
from trainflow.errors import ConfigError
from trainflow.run.redact import protect
from trainflow.run.storage import is_uri


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """Return a copy of raw with each dotted key (e.g. 'train.time_limit') set to its value."""
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
                (
                    f"  {key}: {msg} (got {got!r})"
                    if "input" in e and not isinstance(got, (dict, BaseModel))
                    else f"  {key}: {msg}"
                )
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
    if not close and parent == "train":  # a network's key at its earlier place, misspelt: where it is now
        moved = difflib.get_close_matches(name, list(MODEL_KEY_READERS), n=1, cutoff=0.6)
        return f"; did you mean model.params.{MODEL_KEY_READERS[moved[0]][0]}.{moved[0]}?" if moved else ""
    return f"; did you mean {'.'.join(filter(None, [parent, close[0]]))}?" if close else ""


def config_from_dict(raw: dict[str, Any], base_dir: str | Path = ".", source: str = "<dict>") -> Config:
    """Validate a raw mapping and resolve its relative paths against base_dir."""
    if not isinstance(raw, dict):
        raise ConfigError(f"invalid config {source}: expected a mapping of sections, got {type(raw).__name__}")
    base = Path(base_dir).resolve()
    _apply_waits(raw.get("services"), None)  # reading the table to infer the task already waits as the config says
    raw, task_note = _with_task(raw, base)
    model = raw.get("model")
    earlier = deprecated_keys(model) if isinstance(model, dict) else []
    try:  # (the root validator moves them too: a config validated elsewhere)
        raw, moved = train_keys_moved(raw)
    except ValueError as err:
        raise ConfigError(f"invalid config {source}:\n  {err}") from None
    for line in (*moved, *earlier):  # read this release, with a warning
        warnings.warn(f"{source}: {line}", FutureWarning, stacklevel=2)
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None
    cfg._task_inferred = task_note
    if SOURCES[cfg.data.format].path_is_location:  # (an Iceberg table's path is its identifier in the catalog)
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
    if cfg.inference.output_format in ("parquet", "delta"):  # an Iceberg or PostgreSQL table is named, not a path
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
    apply_to_process(cfg)  # its waits from here on, and its secrets masked in every log line
    return cfg


def apply_to_process(cfg: Config) -> None:
    """This process waits out absent services as long as `services` says and masks this config's secrets in its
    log lines: config_from_dict does it for the driver, each Ray Train worker for itself (trainer/watchdog.Watched)."""
    _apply_waits(cfg.services, cfg.mlflow.tracking_uri)
    protect(cfg.to_dict())


def _apply_waits(services: ServicesSection | dict | None, tracking_uri: str | None) -> None:
    """This process waits out absent services for as long as the config says (an invalid section: the defaults, and
    validation names the problem)."""
    from trainflow.run import services as waits

    if not isinstance(services, ServicesSection):
        try:
            services = ServicesSection.model_validate(services or {})
        except ValidationError:
            services = ServicesSection()
    waits.apply(
        services.mlflow_wait_s,
        services.prefect_wait_s,
        services.storage_wait_s,
        tracking_uri,
        services.database_wait_s,
        services.database_read_s,
    )


def _with_task(raw: dict[str, Any], base: Path) -> tuple[dict[str, Any], str | None]:
    """raw with `task` set from the label's values when the config leaves it out, and the reason; raw unchanged when
    the data section itself is invalid (validation then names every problem)."""
    if raw.get("task") is not None:
        return raw, None
    try:
        data = DataSection.model_validate(raw.get("data"))
    except ValidationError:
        return raw, None
    from trainflow.tables.files import infer_task

    if SOURCES[data.format].kind != "files":  # the label column at the snapshot the run reads, or the query's
        from trainflow.tables.sources import source_dataset

        if SOURCES[data.format].path_is_location:
            data = data.model_copy(update={"path": _resolve(data.path, base)})
        task, why = infer_task(data.where, data.format, data.label, dataset=source_dataset(data))
        return {**raw, "task": task}, f"task: {task} ({why}; set task to choose)"
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


def _bool_or_switch(loader: _StrictLoader, node: yaml.ScalarNode) -> bool | str:
    """YAML 1.1 reads `off` and `on` as booleans; a config reads them as the words (`train.time_limit: off`,
    `train.refit: off`), which a boolean key still takes (pydantic reads "off" as false)."""
    value = loader.construct_scalar(node)
    return value if value.lower() in ("off", "on") else loader.construct_yaml_bool(node)


_StrictLoader.add_constructor("tag:yaml.org,2002:bool", _bool_or_switch)


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
    """Read a YAML config file, apply dotted overrides, validate, and resolve paths."""
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
