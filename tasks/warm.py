"""train.warm_start: the challenger continues from the serving model (or a named version) instead of starting from
nothing, where that model can be continued; otherwise a fresh fit, with the reason.

Resolved in the flow's process before the rows are packed: the source version's checkpoint is read from the registry,
and a continuation needs a one-split model of a family this config trains whose loop continues one (Family.warm_start:
the boosters XGBoost, LightGBM and CatBoost, and the networks) with the same columns,
encodings and classes. The challenger then keeps the source's fitted preprocessing (its trees split on those values)
with the new rows' counts and baseline, and its boosters add rounds to the source's on the new rows; the source's files
travel to the workers inside the loop's config (no shared folder needed). The same gate judges it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from trainflow.config import Config
from trainflow.errors import CheckpointError
from trainflow.preprocessors.tabular import TabularPreprocessor
from trainflow.tasks.common import task_logger
from trainflow.trainer.families import REGISTRY

STATE_JSON = "train_state.json"
MAX_FILE_BYTES = 256 * 2**20  # a source checkpoint file larger than this is not shipped to the workers


def warm_source(config: Config) -> str | None:
    """The model URI train.warm_start names (None: none)."""
    asked = config.train.warm_start
    if asked == "none":
        return None
    if asked == "champion":
        return f"models:/{config.mlflow.registered_model}@champion"
    return asked


def _same_schema(mine: TabularPreprocessor, theirs: TabularPreprocessor) -> str | None:
    """Why theirs cannot preprocess for a continuation of mine's fit (None: it can)."""
    for what in ("task", "label", "feature_order", "classes"):
        if getattr(mine, what) != getattr(theirs, what):
            return f"its {what} differs ({getattr(theirs, what)!r}, the new rows' {getattr(mine, what)!r})"
    for what in ("numeric", "categorical", "embedded", "dates"):
        if sorted(getattr(mine, what)) != sorted(getattr(theirs, what)):
            return f"its {what} columns differ ({sorted(getattr(theirs, what))}, the new rows' {sorted(getattr(mine, what))})"
    return None


def resolve_warm(config: Config, prep: TabularPreprocessor, folds: int) -> tuple[TabularPreprocessor, dict | None]:
    """(the preprocessor to pack with, the warm start's record): None when train.warm_start is none; else
    {"from": uri, "version", "family", "offset", "files"} for a continuation, or {"from": uri, "fresh": why}."""
    uri = warm_source(config)
    if uri is None:
        return prep, None
    log = task_logger("warm-start")
    record: dict[str, Any] = {"from": uri}
    why, theirs, path = None, None, None
    if folds > 1:
        why = f"train.folds {folds}: the challenger is a bag of fold models, and a warm start continues one model"
    else:
        from trainflow.trainer.resolve import allowed_class_paths, resolve_checkpoint
        from trainflow.trainer.serving.servable import BAG_FILE, checkpoint_families

        try:
            path = Path(resolve_checkpoint(uri, allowed_class_paths(config), config.mlflow.tracking_uri))
        except CheckpointError as exc:
            why = f"no model to start from: {exc}"
        if path is not None:
            record["version"] = _version(config, uri)
            families = checkpoint_families(path)
            theirs = TabularPreprocessor.load(path)
            if len(families) != 1 or (path / BAG_FILE).exists():
                why = f"it is {'an ensemble' if len(families) != 1 else 'a bag of fold models'}, not one model"
            elif families[0] not in config.model.families:
                why = f"it is a {families[0]} model, a family this config does not train ({config.model.families})"
            elif not REGISTRY[families[0]].warm_start:
                able = [name for name in REGISTRY if REGISTRY[name].warm_start]
                why = f"a {families[0]} model: warm start continues {', '.join(able)} models"
            else:
                why = _same_schema(prep, theirs) or _same_model(config, families[0], path)
    if why is not None:
        record["fresh"] = why
        log.warning("warm start from %s: a fresh fit instead: %s", uri, why)
        return prep, record
    from trainflow.roles.folds import FoldPlan

    try:  # the rows the source trained or chose on: the test figures leave them out (tasks/final_score.py)
        plan = FoldPlan.load(path)
    except ValueError:
        plan = None
    record["plan"] = plan.to_dict() if plan is not None else None
    booster = (path / STATE_JSON).is_file()  # a booster's round state (a network's is train_state.pt)
    state = json.loads((path / STATE_JSON).read_text()) if booster else {}
    record.update(
        family=checkpoint_families(path)[0],
        # the rounds its model file holds, which the new fit's rounds follow (a network starts from epoch 0)
        offset=int(state.get("warm_offset", 0)) + int(state["epoch"]) + 1 if booster else 0,
        files={f.name: f.read_bytes() for f in path.iterdir() if f.is_file() and f.stat().st_size <= MAX_FILE_BYTES},
    )
    log.info(
        "warm start: %s continues %s (v%s%s) on the new rows, with its preprocessing",
        record["family"],
        uri,
        record["version"],
        f", {record['offset']} rounds" if record["offset"] else ", its weights",
    )
    mine = dataclasses.replace(
        theirs, train_rows=prep.train_rows, class_counts=prep.class_counts, baseline=prep.baseline
    )
    return mine, record


def _same_model(config: Config, family: str, path: Path) -> str | None:
    """Why the source's model cannot be continued by this config's (a network of another shape; None: it can)."""
    from trainflow.trainer.serving.checkpoint import read_config

    fam = REGISTRY[family]

    def model(section: dict) -> dict:  # what only sizes or stops a fit, and what a refit pins, never refuses it
        ignored = (*fam.trainflow_keys, *fam.refit_pins)
        params = {k: v for k, v in (section.get("params") or {}).items() if k not in ignored}
        # a network's optimizer and schedule keys (in its model section since they left train.*) neither
        section = {k: v for k, v in section.items() if k not in fam.train_keys}
        return fam.hashed({**section, **({"params": params} if "params" in section else {})})

    theirs = model(read_config(path).get("model") or {})
    mine = model(config.for_family(family).to_dict()["model"])
    return None if theirs == mine else f"its model section differs from this config's ({family}: {theirs} vs {mine})"


def _version(config: Config, uri: str) -> str:
    """The registered version a models:/ URI names (MLflow's own resolution of a name@alias or name/version)."""
    import mlflow
    from mlflow.store.artifact.utils.models import get_model_name_and_version

    tracking = config.mlflow.tracking_uri
    return str(get_model_name_and_version(mlflow.MlflowClient(tracking_uri=tracking, registry_uri=tracking), uri)[1])


def summary_record(warm: dict | None) -> dict | None:
    """The warm start's record without the source's files and split plan (the summary's, MLflow's)."""
    return None if warm is None else {k: v for k, v in warm.items() if k not in ("files", "plan")}


def source_plan(warm: dict | None):
    """The split plan a continued source model was trained under (a FoldPlan), or None: no continuation, or a source
    whose plan is unknown."""
    from trainflow.roles.folds import FoldPlan

    if not warm or "family" not in warm or not warm.get("plan"):
        return None
    return FoldPlan.from_dict(warm["plan"])
