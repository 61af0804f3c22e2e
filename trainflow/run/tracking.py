"""MLflow helpers: tracking setup, signatures and parameter flattening."""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow

from trainflow.errors import InfrastructureError

log = logging.getLogger(__name__)

# models:/name/3 or models:/name@alias
MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))$")
CHAMPION = "champion"
DECISION_TAG = "trainflow.promotion.decision"  # the gate's decision on a version, recorded after the alias moved
CHECKPOINT_KEY = "trainflow.checkpoint_key"  # a digest of the registered model, checkpoint, data and training config
RETRAIN_TAG = "trainflow.retrain"  # a parent run's retrain name (--run-name)
PUBLISHED_TAG = "trainflow.published"  # when the retrain that registered a version finished publishing it
MAX_KEY = 250  # MLflow's limit for metric, param and tag keys


def mlflow_key(key: str) -> str:
    """A metric, param or tag key MLflow accepts for any key built from data (a column name, a slice value, a
    config's dict key): letters, digits, _ - . / and spaces, no path that normalizes to another name ('//', '/./',
    '..', a leading or trailing '/'), at most 250 characters. A key that had to change gets a short digest of the
    original, so two different originals never share one key."""
    import hashlib

    clean = re.sub(r"[^\w.\- /]", "_", key, flags=re.ASCII)
    clean = "/".join(part if part not in ("", ".", "..") else "_" for part in clean.split("/"))
    if clean == key and len(key) <= MAX_KEY:
        return key
    digest = hashlib.blake2b(key.encode(), digest_size=4).hexdigest()
    return f"{clean[: MAX_KEY - 9]}_{digest}"


@contextmanager
def tracking(tracking_uri: str) -> Iterator[None]:
    """Use tracking_uri inside the block only.

    mlflow.set_tracking_uri also exports MLFLOW_TRACKING_URI, which would leak one config's store
    into the next flow run of a long-lived process (trainflow serve, a worker, tests).
    """
    saved_env = os.environ.get("MLFLOW_TRACKING_URI")
    saved_uri = mlflow.get_tracking_uri() if saved_env is not None else None
    mlflow.set_tracking_uri(tracking_uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(saved_uri)
        if saved_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = saved_env


def current_champion(client: mlflow.MlflowClient, name: str, alias: str = CHAMPION) -> str | None:
    """The @champion version (or that of another alias: a replay's policies, flows/replay.py); None only when the
    registry says the alias (or the model) does not exist.

    MLflow's stores answer a missing alias with INVALID_PARAMETER_VALUE and "Registered model alias ... not
    found." (a missing model: RESOURCE_DOES_NOT_EXIST); any other error is the registry failing."""
    try:
        return str(client.get_model_version_by_alias(name, alias).version)
    except mlflow.exceptions.MlflowException as exc:
        missing_alias = exc.error_code == "INVALID_PARAMETER_VALUE" and f"alias {alias} not found" in exc.message
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST" or missing_alias:
            return None
        raise InfrastructureError(f"cannot read {name}@{alias} from the registry: {exc.message}") from None


def store_exists(tracking_uri: str) -> bool:
    """False for a SQLite store whose file does not exist yet (no champion can be there, and reading would create
    the database); True for any other store."""
    if tracking_uri.startswith("sqlite:///"):
        return Path(tracking_uri.removeprefix("sqlite:///")).exists()
    return True


def prepare_store(tracking_uri: str) -> None:
    """A new SQLite store, whole: MLflow's migrations (seconds) run in a staging folder beside it
    (storage.staging_folder, whose leftovers from a killed process the next call removes), and the migrated file
    takes the store's name only if none appeared meanwhile, so a process killed during them leaves no half-migrated
    store that every later run would fail on (MLflow migrating in place: "duplicate column name"). The CLI calls it
    while Prefect's server and Ray start; `ensure_experiment` before a run's first MLflow write. Any other store, or
    an error (the tracking step meets it again and reports it), is left as it is."""
    if not tracking_uri.startswith("sqlite:///") or store_exists(tracking_uri):
        return
    from trainflow.run.storage import staging_folder

    db = Path(tracking_uri.removeprefix("sqlite:///"))
    staging = None
    try:
        staging = staging_folder(db.parent, db.name)
        staging.mkdir()
        mlflow.MlflowClient(tracking_uri=f"sqlite:///{staging / db.name}").search_experiments(max_results=1)
        os.link(staging / db.name, db)  # never over a store another run made meanwhile
    except FileExistsError:
        pass
    except Exception as exc:  # noqa: BLE001 - the run's own tracking step reports it where it matters
        log.debug("creating the MLflow store at %s ahead of the run failed: %s", tracking_uri, exc)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def champion_version(tracking_uri: str, name: str) -> str | None:
    """The @champion version of a registered model in the store at tracking_uri (None when there is none, or
    no store yet: a client would create the SQLite database)."""
    if not store_exists(tracking_uri):
        return None
    return current_champion(mlflow.MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri), name)


def ensure_experiment(tracking_uri: str, experiment: str) -> str:
    """The experiment's id (call inside `tracking`), creating it with artifacts next to a SQLite DB (a new SQLite
    store created whole first: prepare_store)."""
    prepare_store(tracking_uri)
    found = mlflow.get_experiment_by_name(experiment)
    if found is not None:
        return found.experiment_id
    artifact_location = None
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        artifact_location = (db.parent / "mlartifacts").resolve().as_uri()
    return mlflow.create_experiment(experiment, artifact_location=artifact_location)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'train': {'epochs': 3}} -> {'train.epochs': 3}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
