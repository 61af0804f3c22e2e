"""What the commands' arguments share: parent parsers for the options most commands take, and --set's values."""

from __future__ import annotations

import argparse
from typing import Any

from trainflow.errors import TrainflowError

ANSWER_JSON = "also write the answer as JSON to this file"


def _shared(*options: tuple[str, dict[str, Any]]) -> argparse.ArgumentParser:
    """A parent parser holding options (flag, add_argument's keywords) that several commands take."""
    parent = argparse.ArgumentParser(add_help=False)
    for flag, kwargs in options:
        parent.add_argument(flag, **kwargs)
    return parent


CONFIG = _shared(("--config", {"required": True, "help": "the YAML config file (trainflow init writes one)"}))
OVERRIDES = _shared(
    (
        "--set",
        {
            "action": "append",
            "default": [],
            "metavar": "KEY=VALUE",
            "help": "override a config key (YAML value), e.g. train.time_limit=60; repeatable",
        },
    )
)
SUMMARY_JSON = _shared(("--summary-json", {"help": "also write the summary as JSON to this file"}))
NO_WAIT = _shared(
    (
        "--no-wait",
        {
            "dest": "wait",
            "action": "store_false",
            "help": "fail at once, naming the holder, when another start of this --run-name is running (default: wait "
            "for it)",
        },
    )
)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    import yaml

    from trainflow.config import load_yaml

    out = {}
    for item in items:
        if "=" not in item:
            raise TrainflowError(f"--set {item!r}: expected KEY=VALUE, e.g. train.time_limit=60")
        key, value = item.split("=", 1)
        try:
            out[key.strip()] = load_yaml(value)
        except yaml.YAMLError as exc:
            raise TrainflowError(f"--set {item!r}: the value is not valid YAML ({str(exc).splitlines()[0]})") from None
    return out
