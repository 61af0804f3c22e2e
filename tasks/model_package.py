"""What the registry stores beside a checkpoint so the model serves anywhere: the pyfunc definition, the code it
imports (code_paths), its requirements, its signature and an input example."""

from __future__ import annotations

import ast
import functools
import importlib.util
import pkgutil
import shutil
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.models import ModelSignature
from packaging.version import Version
from mlflow.types import ColSpec, Schema

from trainflow.preprocessors.tabular import TabularPreprocessor
from trainflow.catalogue import family_modules
from trainflow.trainer.families import REGISTRY

# MLflow "models from code": this file is the model's definition (nothing pickled)
MODEL_CODE = str(Path(importlib.util.find_spec("trainflow.trainer.serving").origin).with_name("pyfunc_model.py"))
# the folder of what a registered model serves with (trainer/serving/); with every family's file (the registry loads
# each; a family keeps its training imports inside its functions), the roots of the code a model ships
SERVING_PACKAGE = "trainflow.trainer.serving"


def _module_imports(name: str, everywhere: bool = False) -> set[str]:
    """The trainflow modules name imports at its top level (what loading it runs; everywhere: inside its functions
    too), with their packages."""
    spec = importlib.util.find_spec(name)
    package = name if spec.submodule_search_locations else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(Path(spec.origin).read_text())
    for node in ast.walk(tree) if everywhere else tree.body:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names if _is_submodule(base, a.name)}
    mine = {m for m in found if m.split(".")[0] == "trainflow"}
    return {".".join(m.split(".")[:i]) for m in mine for i in range(1, m.count(".") + 2)}


def _is_submodule(package: str, name: str) -> bool:
    """Whether `from package import name` imports a module (not a name defined in package)."""
    if package.split(".")[0] != "trainflow":
        return False
    folders = importlib.util.find_spec(package).submodule_search_locations or []
    return any((Path(f) / f"{name}.py").exists() or (Path(f) / name / "__init__.py").exists() for f in folders)


@functools.cache  # the files' imports, read once per process (every registration ships the same code)
def serving_modules() -> tuple[str, ...]:
    """What a registered model ships as its code: every module of trainer/serving/ and what it imports (inside its
    functions too), every family's file and the modules its predictor imports (Family.serving_modules), and what
    each of those imports at its top level, transitively (no Ray, Prefect or MLflow code of trainflow's: the layout
    test keeps it so)."""
    folder = importlib.util.find_spec(SERVING_PACKAGE).submodule_search_locations
    own = [m.name for m in pkgutil.iter_modules(folder, SERVING_PACKAGE + ".")]
    todo = [SERVING_PACKAGE, *own, *(i for m in own for i in _module_imports(m, everywhere=True))]
    todo += [m for m in family_modules().values() if m.startswith("trainflow.")]
    todo += [m for family in REGISTRY.values() for m in family.serving_modules]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(_module_imports(name) - seen)
    return tuple(sorted(seen))


def _copy_module(name: str, dst: Path) -> None:
    spec = importlib.util.find_spec(name)
    rel = (
        Path(*name.split(".")) / "__init__.py"
        if spec.submodule_search_locations
        else Path(*name.split(".")).with_suffix(".py")
    )
    (dst / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(spec.origin, dst / rel)


def serving_code(dst: Path, class_path: str | None = None) -> list[str]:
    """The folders to log as code_paths, built in dst: serving_modules() in their package layout, and for your own
    nn.Module (model.class_path) its module: inside trainflow, with its parent packages; else its whole top-level
    package (or the lone module file) as it is installed."""
    names = list(serving_modules())
    module = None
    if class_path:  # 'package.module:ClassName' or 'package.module.ClassName', as trainer/families/network.py reads it
        module, sep, _ = class_path.partition(":")
        module = module if sep else class_path.rpartition(".")[0]
    paths = [str(dst / "trainflow")]
    if module and module.split(".")[0] == "trainflow":
        parts = module.split(".")
        names += [".".join(parts[:i]) for i in range(2, len(parts) + 1)]
    elif module:
        top = importlib.util.find_spec(module.split(".")[0])
        target = dst / "user"
        target.mkdir(parents=True, exist_ok=True)
        if top.submodule_search_locations:
            folder = _package_folder(top, module)
            shutil.copytree(folder, target / folder.name, ignore=shutil.ignore_patterns("__pycache__"))
            paths.append(str(target / folder.name))
        else:
            source = Path(top.origin)
            shutil.copyfile(source, target / source.name)
            paths.append(str(target / source.name))
    for name in dict.fromkeys(names):
        _copy_module(name, dst)
    return paths


def _package_folder(top, module: str) -> Path:
    """The folder of the top-level package `top` that holds `module`: its __init__.py's, or for a namespace package
    (a folder without __init__.py, which has no origin) the one of its folders the module is in."""
    if top.origin:
        return Path(top.origin).parent
    origin = Path(importlib.util.find_spec(module).origin)  # a module that defines a class has a file
    return next(Path(f) for f in top.submodule_search_locations if origin.is_relative_to(f))


def requirements(families: list[str]) -> list[str]:
    """The packages the registered model loads with: the serving code's and its families' libraries (an ensemble's
    members'), pinned to the versions installed here."""
    dists = ["torch", "numpy", "pandas", "pyarrow", *(d for f in families for d in REGISTRY[f].serving_packages)]
    # the public version: a local tag (torch's "+cpu") names a build the public index does not serve, and PEP 440 lets
    # "==2.13.0" match the local build here and the index's elsewhere
    return [f"{dist}=={Version(version(dist)).public}" for dist in dict.fromkeys(dists)]


def signature_for(prep: TabularPreprocessor, column_types: dict[str, str]) -> ModelSignature:
    """Input: the feature columns with their table types; output: prediction and class probabilities."""
    inputs = [ColSpec(column_types[c], c, required=False) for c in prep.feature_order]
    if prep.task == "classification":
        kind = "string" if any(isinstance(c, str) for c in prep.classes) else "long"
        if any(isinstance(c, float) for c in prep.classes):
            kind = "double"
        if all(isinstance(c, bool) for c in prep.classes):
            kind = "boolean"
        outputs = [ColSpec(kind, "prediction")] + [ColSpec("double", f"proba_{c}") for c in prep.classes]
    else:
        outputs = [ColSpec("double", "prediction")]
    return ModelSignature(inputs=Schema(inputs), outputs=Schema(outputs))


def example_input(prep: TabularPreprocessor, column_types: dict[str, str]) -> pd.DataFrame:
    """One typical input row for the registered model's input example, built from the fitted state
    (each number at its training mean, each date at its mean instant, each text column at its most
    frequent value): no row of the
    training data is copied into the registry."""
    row: dict[str, Any] = {}
    text = prep.text_columns()
    for col in prep.feature_order:
        kind = column_types[col]
        if col in text:
            spec = prep.categorical.get(col) or prep.embedded[col]
            row[col] = spec.get("mode") or spec.get("fill") or (text[col][0] if text[col] else "")
        elif col in prep.dates:
            instant = pd.Timestamp(prep.dates[col]["stats"]["elapsed"]["mean"] * 86400, unit="s").floor("s")
            row[col] = instant if kind == "datetime" else instant.isoformat(sep=" ")
        elif kind == "boolean":
            row[col] = prep.numeric[col]["mean"] >= 0.5
        elif kind == "long":
            row[col] = int(round(prep.numeric[col]["mean"]))
        else:
            row[col] = prep.numeric[col]["mean"]
    return pd.DataFrame([row])
