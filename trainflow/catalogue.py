"""The model families this trainflow knows, found through the entry-point group `trainflow.families` (name ->
`module:FAMILY`), as pytest finds its plugins: trainflow's own are declared in its pyproject.toml, and another installed
package adds a family with one such line of its own. The config validates `model.type` and each family's
`model.params.<family>` block through them without importing a family module by name (families sit a layer above
it), and the trainer's REGISTRY is this mapping.

Where trainflow is not installed (a registered model serves from its shipped code), the family files shipped beside
the families package (`trainer/families/*_family.py`) are the catalogue. Serving code: imports only the standard
library at import time."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from importlib.metadata import entry_points
from typing import Any

GROUP = "trainflow.families"
SHIPPED = "trainflow.trainer.families"  # where the families' files are when no entry point names them


@functools.cache
def family_modules() -> dict[str, str]:
    """Each family's name -> the module defining its FAMILY."""
    found: dict[str, str] = {}
    for point in entry_points(group=GROUP):
        found.setdefault(point.name, point.module)
    if not found:
        package = importlib.import_module(SHIPPED)
        for module in pkgutil.iter_modules(package.__path__):
            if module.name.endswith("_family"):
                found[module.name.removesuffix("_family")] = f"{SHIPPED}.{module.name}"
    return found


@functools.cache
def families() -> dict[str, Any]:
    """Every family by name, in the order they are listed (Family.listed: the order they joined trainflow, which
    model.type's choices, the docs and messages follow); an entry point's name must be its family's name."""
    loaded = [importlib.import_module(module).FAMILY for module in family_modules().values()]
    found = {family.name: family for family in sorted(loaded, key=lambda f: (f.listed, f.name))}
    for name, family in found.items():
        if family.name != name:
            raise RuntimeError(f"entry point {GROUP}:{name} names the family {family.name!r}; the two must agree")
    return found
