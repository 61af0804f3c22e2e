"""Which stored checkpoint a model URI or folder means, and whether the code it names may be imported: a local,
private copy of a checkpoint folder or an MLflow model (models:/name@alias, runs:/...), checked against the class
paths the config allows."""

from __future__ import annotations

from pathlib import Path

from trainflow.config import Config
from trainflow.errors import CheckpointError, InfrastructureError
from trainflow.run.storage import private_copy, private_dir
from trainflow.run.tracking import MODEL_URI
from trainflow.trainer.serving.checkpoint import read_config
from trainflow.trainer.families.network import user_class_path
from trainflow.trainer.serving.servable import member_dirs


def allowed_class_paths(config: Config) -> set[str]:
    """The user module class paths a stored checkpoint may import: the config's own and model.allowed_class_paths."""
    return {p for p in [config.model.class_path, *config.model.allowed_class_paths] if p}


def check_class_path(checkpoint: str, allowed: set[str], source: str) -> None:
    """CheckpointError when the checkpoint's config names a user module outside allowed: its code is never imported."""
    try:
        model_cfgs = [
            read_config(d)["model"] for d in [checkpoint, *member_dirs(checkpoint)]
        ]  # an ensemble's members too
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{source}: the checkpoint (or an ensemble member) cannot be read: {type(exc).__name__}: {exc}"
        ) from None
    for class_path in {user_class_path(m) for m in model_cfgs} - allowed - {None}:
        raise CheckpointError(
            f"{source}: its checkpoint asks to import the module class {class_path!r}, which this config does not "
            f"name (model.class_path {sorted(allowed) or 'unset'}); trainflow imports no code a stored model names. "
            "If you trust it, list it under model.allowed_class_paths"
        )


def _artifact_uri(model: str, tracking_uri: str | None) -> str:
    """Where a models:/name/version or models:/name@alias URI's files are, asked of this registry explicitly
    (MLflow resolves models:/ through its process-wide registry URI, which another thread may have changed)."""
    m = MODEL_URI.match(model)
    if tracking_uri is None or m is None:
        return model
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    version = m["version"] or client.get_model_version_by_alias(m["name"], m["alias"]).version
    return client.get_model_version_download_uri(m["name"], str(version))


def resolve_checkpoint(model: str, allowed: set[str] | None = None, tracking_uri: str | None = None) -> str:
    """A local checkpoint folder for a checkpoint path or an MLflow model URI (models:/name@alias, runs:/...).

    allowed: the user module class paths the checkpoint may import (None: not checked, the caller vouches);
    tracking_uri: the registry to read (default: MLflow's current one).
    A registry error other than "no such model" is an InfrastructureError (retried); a missing model or a
    folder that is not a trainflow checkpoint is the user's CheckpointError."""
    if model.startswith(("models:/", "runs:/")):
        import mlflow

        dst = Path(private_dir("model-")).resolve()  # removed when this process exits
        try:
            local = mlflow.artifacts.download_artifacts(
                artifact_uri=_artifact_uri(model, tracking_uri), dst_path=str(dst), tracking_uri=tracking_uri
            )
        except mlflow.exceptions.MlflowException as exc:
            if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise CheckpointError(f"cannot load model {model}: {exc.message}") from None
            raise InfrastructureError(f"cannot load model {model} from the registry: {exc.message}") from None
        except OSError as exc:
            raise InfrastructureError(f"cannot download model {model}: {exc}") from None
        try:
            spec = mlflow.models.Model.load(local).flavors["python_function"]["artifacts"]["checkpoint"]
        except (KeyError, OSError, mlflow.exceptions.MlflowException):
            raise CheckpointError(f"model {model} is not a trainflow model (no checkpoint artifact)") from None
        path = (Path(local) / spec["path"]).resolve()
        if not path.is_relative_to(dst):
            raise CheckpointError(
                f"model {model}: its checkpoint artifact path {spec['path']!r} points outside the "
                "model's download folder; refused"
            )
        if not path.is_dir():
            raise CheckpointError(f"model {model} has no trainflow checkpoint artifact")
        path = str(path)
    elif not Path(model).is_dir():
        # a bare version or alias ("3", "champion") is no folder: say how a registered model is named
        named = "" if "/" in model else f" (a registered model: models:/NAME/{model} or models:/NAME@{model})"
        raise CheckpointError(f"checkpoint folder not found: {model}{named}")
    else:
        path = private_copy(model)  # what is checked below is what is scored, whatever happens to the folder
    if allowed is not None:
        check_class_path(path, allowed, model)
    return path
