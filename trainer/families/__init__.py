"""Model families behind one interface (base.Family), listed once in REGISTRY: their parameters, how each fits
across Ray Train workers, what it checks before training, its budget, and how its checkpoint serves. A new family is
one file in this folder defining FAMILY, and one line naming it in pyproject.toml's `trainflow.families` entry points
(trainflow/catalogue.py); no config section, task, flow or other trainer module names a family (tests/test_layout.py
holds it). Checkpoints name their family (config.json's model.type), so everything after training reads them through
this registry and is family-blind."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from trainflow.catalogue import families
from trainflow.trainer.families.base import Family


class _Registry(Mapping[str, Family]):
    """The catalogue's families by name, found on first use (a family's file imports this package first)."""

    def __getitem__(self, name: str) -> Family:
        return families()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(families())

    def __len__(self) -> int:
        return len(families())


REGISTRY: Mapping[str, Family] = _Registry()
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
