"""Model families behind one interface (base.Family), listed once in REGISTRY: how each fits across Ray Train
workers, what it checks before training, its budget, and how its checkpoint serves. A new family is one file in this
folder defining FAMILY, added to the list below; no task, flow or other trainer module names a family
(tests/test_layout.py holds it). Checkpoints name their family (config.json's model.type), so everything after
training reads them through this registry and is family-blind."""

from __future__ import annotations

import importlib
from typing import Any

from trainflow.trainer.families.base import Family

# one module per family, each defining FAMILY; a new family's file is added to the bottom of this list
FAMILY_MODULES = ("mlp_family", "torch_family", "xgboost_family", "lightgbm_family", "catboost_family")
REGISTRY: dict[str, Family] = {
    family.name: family for family in (importlib.import_module(f"{__name__}.{m}").FAMILY for m in FAMILY_MODULES)
}
# what a checkpoint written before config.json named its family holds: trainflow's network, its only family then
UNNAMED = "mlp"


def family_named(name: Any, source: str = "model.type") -> Family:
    """The registered family called name; ValueError naming source and the families there are (never a fallback)."""
    family = REGISTRY.get(name) if isinstance(name, str) else None
    if family is None:
        raise ValueError(f"{source}: {name!r} is not a family this trainflow trains or serves ({sorted(REGISTRY)})")
    return family


def family_for(config) -> Family:
    """The family of a single-family config (see Config.for_family)."""
    name = config.model.type
    if not isinstance(name, str):
        raise ValueError(f"model.type {name!r}: pick one family per training run (Config.for_family)")
    return family_named(name)


def checkpoint_family(config: dict[str, Any]) -> str:
    """The model.type a checkpoint's config.json names (an ensemble's "ensemble" included), UNNAMED when it names none."""
    return config["model"].get("type", UNNAMED)
