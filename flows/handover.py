"""Configs handed to a flow called in this process (the Python API): the flow gets a key as its config_path, so a
config object, which may hold secrets, never becomes a flow parameter that Prefect stores. Every flow reads its
config through flow_config."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from trainflow.config import Config, apply_overrides, config_from_dict, load_config
from trainflow.errors import ConfigError

IN_PROCESS = "in-process:"
_handed_over: dict[str, Config] = {}


def hand_over(cfg: Config) -> str:
    """A config_path under which flow_config in this process returns cfg (until forget(key))."""
    key = f"{IN_PROCESS}{uuid.uuid4().hex}"
    _handed_over[key] = cfg
    return key


def forget(key: str) -> None:
    _handed_over.pop(key, None)


def flow_config(path: str | Path, overrides: dict[str, Any] | None = None) -> Config:
    """The config a flow was given: the one hand_over gave this key, or the file's (load_config)."""
    if not str(path).startswith(IN_PROCESS):
        return load_config(path, overrides)
    if str(path) not in _handed_over:
        raise ConfigError(
            f"config_path {path}: a config handed over in another process (the Python API's); give a config file's path"
        )
    cfg = _handed_over[str(path)]
    return config_from_dict(apply_overrides(cfg.as_given(), overrides)) if overrides else cfg
