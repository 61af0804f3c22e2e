"""The import graph: every layer imports only the layers below it, and no modules import each other in a circle
(docs/development.md, "The code"). Read from the source with ast, so nothing is imported to check it."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {
    "flows": "trainflow.flows",
    "tasks": "trainflow.tasks",
    "trainer": "trainflow.trainer",
    "preprocessors": "trainflow.preprocessors",
    "trainflow": "trainflow",
}
# higher imports lower; preprocessors sit under the trainer, which uses the fitted preprocessor; the table files
# (pyarrow only) under the config, which infers `task` from the label through them
RANK = {"trainflow.flows": 5, "trainflow.tasks": 4, "trainflow.trainer": 3, "trainflow.preprocessors": 2.5}
TABLES = {"trainflow.data", "trainflow.roles.plan", "trainflow.tables.outputs"}
# (with the sources' registry, which the config validates data.format by, and PostgreSQL's reader, a source's)
TABLE_FILES = {"trainflow.tables.files", "trainflow.tables.columns", "trainflow.tables.postgres"}
BASE = {"trainflow.errors", "trainflow.run.services", "trainflow.run.storage", "trainflow.run.redact"}


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            # the config package and the rooms are in
            nested = folder == "trainflow" and len(parts) > 1 and parts[0] not in ("config", "run", "tables", "roles")
            if ".venv" in path.parts or nested:
                continue
            name = ".".join((package, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


# the package's own __init__: the Python API's facade (trainflow.retrain, ...), the one module above the flows
FACADE = "trainflow"


def _layer(module: str) -> float:
    if module == FACADE:
        return 6
    if module in TABLES:
        return 2
    if module in TABLE_FILES or module.startswith("trainflow.tables.sources"):
        return 0.5
    if module in BASE:
        return 0
    return next((rank for package, rank in RANK.items() if module == package or module.startswith(package + ".")), 1)


def _imports(path: Path, modules: dict[str, Path], top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    out = set()
    for node in nodes:
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            # `from package import module` imports the module (and runs the package's __init__, which imports less)
            else [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names
            ]
            if isinstance(node, ast.ImportFrom) and node.module
            else []
        )
        out |= {n for n in names if n in modules}
    return out


def test_imports_run_one_way_and_in_no_circle():
    """Every import counts, those inside functions too (an import put off to run time is still a dependency), and
    every package's __init__."""
    modules = _modules()
    assert len(modules) > 60 and "trainflow.trainer.families" in modules and "trainflow.flows.cli" in modules
    assert {FACADE, "trainflow.tasks", "trainflow.config"} <= set(modules)
    upward = [
        f"{m} ({_layer(m)}) imports {i} ({_layer(i)})"
        for m, p in modules.items()
        for i in _imports(p, modules, top_level_only=False)
        if _layer(i) > _layer(m)
    ]
    assert upward == []
    graph = {m: _imports(p, modules, top_level_only=False) - {m} for m, p in modules.items()}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                pytest.fail("import circle: " + " -> ".join(trail[trail.index(nxt) :] + [node, nxt]))
            if nxt not in state:
                visit(nxt, trail + [node])
        state[node] = 2

    for module in graph:
        if module not in state:
            visit(module, [])


# the modules of trainflow.tasks that define no Prefect task: what tasks share (helpers, the value types that cross
# task boundaries); any other module there holds tasks, and imports none of the others: the flows chain them
TASK_HELPERS = {"common", "values", "mlflow_run", "model_package", "drift", "warm", "gate_rules"}


def test_no_task_module_imports_another():
    modules = _modules()
    tasks = {m for m in modules if m.startswith("trainflow.tasks.")}
    helpers = {f"trainflow.tasks.{h}" for h in TASK_HELPERS}
    assert helpers <= tasks
    for helper in helpers:
        assert "@task" not in modules[helper].read_text(), f"{helper} defines a task: it is not a helper"
    found = [
        f"{m} imports {i}"
        for m in sorted(tasks)
        for i in sorted(_imports(modules[m], modules, top_level_only=False))
        if i in tasks and i not in helpers and i != m
    ]
    assert found == []


# where family names may be written: the families' own folder (the config reads model.type's choices, each family's
# keys and their descriptions from the families, through trainflow/catalogue.py)
FAMILY_HOMES = ("trainer/families/",)


def test_no_family_is_named_outside_its_folder():
    """Adding a family is a file in trainer/families/ and a line in its REGISTRY: no task, flow, preprocessor or other
    trainer module compares with, looks up or defaults to a family's name. ("torch" is also the package every network
    needs, so it is left out of the search.)"""
    from trainflow.trainer.families import REGISTRY

    names = set(REGISTRY) - {"torch"}
    assert {"mlp", "xgboost", "lightgbm", "catboost"} <= names
    found = []
    for path in _modules().values():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(FAMILY_HOMES):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert found == []


def test_no_source_format_is_named_outside_its_folder():
    """Adding a source format is a file in trainflow/tables/sources/ and a line in its registry: nothing else compares
    a table's format (`data.format`, a `fmt`, a record's "format") with a format's name. (Output formats are the
    sinks': inference.output_format.)"""
    from trainflow.tables.sources import SOURCES

    names = set(SOURCES)
    assert {"parquet", "csv", "orc", "delta", "iceberg", "postgres"} <= names

    def named(node) -> bool:
        values = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return any(isinstance(v, ast.Constant) and v.value in names for v in values)

    def is_format(node) -> bool:
        if isinstance(node, ast.Attribute):
            return node.attr == "format"
        if isinstance(node, ast.Name):
            return node.id in ("fmt", "format")
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            return node.slice.value == "format"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "format"
        return False

    found = []
    for name, path in _modules().items():
        if name.startswith("trainflow.tables.sources"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(is_format(x) for x in sides) and any(named(x) for x in sides):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_a_model_ships_the_serving_folder_and_what_it_imports():
    """A registered model ships trainer/serving/, every family's file and what they import at their top level, as
    tasks/model_package.py derives it (no list kept by hand), and serves where trainflow is not installed (the e2e
    test's isolated venv serves one): none of it is a flow's or a task's code, none imports Ray or Prefect."""
    from trainflow.tasks.model_package import serving_modules

    modules = _modules()
    shipped = set(serving_modules())
    folder = {m for m in modules if m.startswith("trainflow.trainer.serving")}
    families = {m for m in modules if m.startswith("trainflow.trainer.families.") and m.endswith("_family")}
    # (the network's module: what the torch families' predictor imports inside its functions, Family.serving_modules)
    assert folder | families | {"trainflow.preprocessors.tabular", "trainflow.trainer.families.network"} <= shipped
    assert [m for m in shipped if m.startswith(("trainflow.flows", "trainflow.tasks"))] == []
    heavy = [
        f"{m} imports {name}"
        for m in sorted(shipped)
        for node in ast.parse(modules[m].read_text()).body
        for name in (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        if name.split(".")[0] in ("ray", "prefect")
    ]
    assert heavy == []


def test_no_function_needs_a_scroll_bar():
    """No function or method in the package over 80 lines (ruff's C901 and PLR0915 keep complexity and statements
    down: pyproject.toml); a longer one is split into the steps it takes."""
    import ast

    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in _modules().values()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80
    ]
    assert long == []


# the ground floor's loose modules; everything else lives in a room (config, roles, run, tables), each a package with
# a docstring saying what lives there
GROUND_FLOOR = {"__init__", "catalogue", "champion", "data", "errors", "limits", "pacing", "retention", "scaffold"}
ROOMS = {"config", "roles", "run", "tables"}


def test_the_ground_floor_keeps_its_rooms():
    """A new module of trainflow/ goes into the room it belongs to, not loose at the top."""
    top = ROOT / "trainflow"
    assert {p.stem for p in top.glob("*.py")} == GROUND_FLOOR
    rooms = {p.name for p in top.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert rooms == ROOMS
    for room in rooms:
        assert ast.get_docstring(ast.parse((top / room / "__init__.py").read_text())), f"trainflow/{room}: no docstring"
