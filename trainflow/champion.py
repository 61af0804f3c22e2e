"""The @champion alias's history, and a rollback that goes through the same lock and records as the gate.

MLflow keeps only where an alias points now (its issue asking for alias history has been open since 2019). Every
move trainflow makes (the gate's promotion, a rollback) is recorded on the versions it touches, as the model version
tag `trainflow.champion.periods`: a JSON list of the times that version served, each with since and until (UTC,
ISO 8601), why it became champion and by whom (a Prefect flow run, a person's rollback), and what replaced it and
why. history() reads them back across versions; serving_at() answers "which version served then".

A move made outside trainflow (the alias set by hand in MLflow) leaves no period: history() shows the gap, and the
next move trainflow makes closes the hand-set version's period from the time it found it.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import re
import socket
from typing import Any

import mlflow

from trainflow.errors import ConfigError
from trainflow.run.tracking import CHAMPION, current_champion

PERIODS_TAG = "trainflow.champion.periods"
MAX_PERIODS = 20  # per version (MLflow's 5,000-character tag value); the oldest go first


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _periods(client: mlflow.MlflowClient, name: str, version: str) -> list[dict[str, Any]]:
    raw = client.get_model_version(name, version).tags.get(PERIODS_TAG)
    try:
        periods = json.loads(raw) if raw else []
    except ValueError:  # a tag someone else wrote: history starts again from here
        return []
    return [p for p in periods if isinstance(p, dict)] if isinstance(periods, list) else []


def _write(client: mlflow.MlflowClient, name: str, version: str, periods: list[dict[str, Any]]) -> None:
    while True:
        text = json.dumps(periods[-MAX_PERIODS:], separators=(",", ":"))
        if len(text) <= 5000 or len(periods) <= 1:
            break
        periods = periods[1:]
    client.set_model_version_tag(name, version, PERIODS_TAG, text[:5000])


def record_move(client: mlflow.MlflowClient, name: str, old: str | None, new: str, why: str, by: str) -> None:
    """After @champion moved from old to new (the caller holds the champion lock): old's period ends and new's
    begins. A period left open on another version (the alias moved by hand since) ends now too, saying so; old set by
    hand gets a period whose start is unknown."""
    now = _now()
    closed = set()
    for mv in client.search_model_versions(f"name = '{name}'"):
        version = str(mv.version)
        periods = _periods(client, name, version)
        if version == new or not periods or periods[-1].get("until"):
            continue
        periods[-1].update(
            until=now,
            replaced_by=new,
            replaced_why=why[:500] if version == old else f"the alias was moved outside trainflow before {now}",
        )
        _write(client, name, version, periods)
        closed.add(version)
    if old is not None and old != new and old not in closed:
        periods = _periods(client, name, old)
        periods.append(
            {
                "since": None,
                "why": "set outside trainflow",
                "by": None,
                "until": now,
                "replaced_by": new,
                "replaced_why": why[:500],
            }
        )
        _write(client, name, old, periods)
    periods = _periods(client, name, new)
    periods.append({"since": now, "why": why[:500], "by": by, "replaced": old})
    _write(client, name, new, periods)


def record_missed_move(client: mlflow.MlflowClient, name: str, version: str, why: str, by: str) -> bool:
    """When version is @champion but its history has no open period (the run that moved the alias died before
    recording the move, and its rerun finds the alias already moved): the move recorded now, from the version whose
    period is still open, saying so. False when the move is recorded already (the caller holds the champion lock)."""
    still_open = []
    for mv in client.search_model_versions(f"name = '{name}'"):
        periods = _periods(client, name, str(mv.version))
        if periods and not periods[-1].get("until"):
            still_open.append(str(mv.version))
    if version in still_open:
        return False
    old = next((v for v in still_open if v != version), None)
    record_move(
        client,
        name,
        old,
        version,
        f"{why}; recorded by a rerun: the run that moved the alias stopped before recording the move",
        by,
    )
    return True


def history(client: mlflow.MlflowClient, name: str) -> list[dict[str, Any]]:
    """Every period a version of name served as @champion that trainflow recorded, oldest first: version, since,
    until (None: serving now), why, by, replaced (the version before), replaced_by and replaced_why."""
    rows = []
    for mv in client.search_model_versions(f"name = '{name}'"):
        raw = mv.tags.get(PERIODS_TAG)
        try:
            periods = json.loads(raw) if raw else []
        except ValueError:
            continue
        rows += [
            {"version": str(mv.version), "since": None, "until": None, "why": None, "by": None, **p}
            for p in periods
            if isinstance(p, dict)
        ]
    return sorted(rows, key=lambda r: (r.get("since") or "", r.get("until") or "9999"))


def serving_at(client: mlflow.MlflowClient, name: str, when: dt.datetime) -> dict[str, Any] | None:
    """The recorded period that covers when (a timezone-aware time), or None."""
    at = when.astimezone(dt.timezone.utc).isoformat(timespec="seconds")
    for row in reversed(history(client, name)):
        if (row.get("since") or "") <= at and (row.get("until") is None or at < row["until"]):
            return row
    return None


def previous_champion(client: mlflow.MlflowClient, name: str) -> str:
    """The version the serving @champion replaced, as its recorded period says (a rollback without --to); a champion
    set by hand (no period of its own) names none."""
    current = current_champion(client, name)
    serving = [r for r in history(client, name) if r.get("until") is None and r["version"] == current]
    if not serving or not serving[-1].get("replaced"):
        raise ConfigError(
            f"rollback: {name}'s history records no version before the serving @champion; name one with --to"
        )
    return str(serving[-1]["replaced"])


SCORE_TAG = "trainflow.promotion.challenger_score"  # a version's score on its gate's rows, as its gate recorded it


def below_the_floor(target: Any, floor: float | None, mode: str) -> str | None:
    """Why version target may not serve under promotion.min_score floor (its gate's recorded score misses it, or it
    has none), or None."""
    if floor is None:
        return None
    try:
        score = float(target.tags.get(SCORE_TAG, "nan"))
    except ValueError:
        score = float("nan")
    if score != score:  # NaN: not recorded
        return f"its score is not recorded (no {SCORE_TAG} tag), so it cannot be shown to meet promotion.min_score {floor:g}"
    if (score < floor) if mode == "max" else (score > floor):
        return f"its gate's score {score:.6g} misses promotion.min_score {floor:g}"
    return None


def never_fit_to_serve(client: mlflow.MlflowClient, name: str, target) -> str | None:
    """Why a version is no rollback target without --force: the gate rejected it, or it never served as @champion
    (its recorded history has no period); None for a version that served."""
    from trainflow.run.tracking import DECISION_TAG

    decision = target.tags.get(DECISION_TAG)
    if decision is not None and decision != "promoted":
        why = target.tags.get("trainflow.promotion.reason", "no reason recorded")
        return f"the gate did not promote it ({why})"
    if not _periods(client, name, str(target.version)):
        return "it never served as @champion (no recorded period)"
    return None


def rollback(
    uri: str, name: str, version: str, reason: str, floor: float | None = None, mode: str = "max", force: bool = False
) -> dict[str, Any]:
    """Move @champion of name back to version under the champion lock, recording who, when and why; the move. A
    version whose recorded score misses promotion.min_score (floor) is refused unless force. A Prefect event
    (trainflow.model.rolled_back) says so where a Prefect API is configured."""
    from trainflow.run.locks import exclusive

    if not reason.strip():
        raise ConfigError("rollback: say why (--reason): it is recorded with the move")
    if not re.fullmatch(r"[1-9][0-9]*", str(version)):  # " 2" or "01" would name a version by accident
        raise ConfigError(f"rollback: --to {version!r} is not a model version number (1, 2, ...)")
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    try:
        target = client.get_model_version(name, version)
    except mlflow.exceptions.MlflowException as exc:
        if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise  # the registry failing (or gone away: trainflow.run.services) is no missing version
        gone = deleted_why(client, name, str(version))
        raise ConfigError(
            f"rollback: {name} has no version {version!r} in {uri}" + (f": {gone}" if gone else "")
        ) from None
    missed = below_the_floor(target, floor, mode) or never_fit_to_serve(client, name, target)
    if missed and not force:
        raise ConfigError(f"rollback: {name} version {version}: {missed}; nothing moved (--force rolls back anyway)")
    by = f"rollback by {getpass.getuser()}@{socket.gethostname()}"
    with exclusive("champion", name, uri):
        old = current_champion(client, name)
        if old == str(target.version):
            return {"model": name, "champion": old, "moved": False, "why": f"version {old} is @champion already"}
        why = f"rollback: {reason.strip()}" + (f" (forced: {missed})" if missed else "")
        client.set_registered_model_alias(name, CHAMPION, str(target.version))
        record_move(client, name, old, str(target.version), why, by)
    moved = {"model": name, "champion": str(target.version), "previous": old, "moved": True, "why": why, "by": by}
    _emit_rolled_back(name, moved)
    return moved


def _emit_rolled_back(name: str, moved: dict[str, Any]) -> None:
    """The move as a Prefect event, as the gate emits its decisions; only where a Prefect API is configured (a
    local rollback has no server to tell), and never failing the move."""
    from trainflow.run.locks import prefect_server_configured

    if not prefect_server_configured():
        return
    try:
        from prefect.events import emit_event

        emit_event(
            event="trainflow.model.rolled_back",
            resource={"prefect.resource.id": f"trainflow.model.{name}"},
            payload=moved,
        )
    except Exception:  # noqa: BLE001 - the move stands whatever the event bus says
        pass


DELETED_TAG = "trainflow.deleted_versions"  # on the registered model: {version: why} of the versions retention deleted


def note_deleted(client, model: str, version: str, why: str) -> None:
    """Record on the registered model why version is deleted (trainflow/retention.py; a rollback to it then says
    why it is gone); the oldest notes go first past MLflow's 5,000-character tag value."""
    try:
        noted = json.loads(client.get_registered_model(model).tags.get(DELETED_TAG) or "{}")
        noted = noted if isinstance(noted, dict) else {}
    except ValueError:
        noted = {}
    noted[str(version)] = why
    while len(json.dumps(noted)) > 5000 and noted:
        noted.pop(next(iter(noted)))
    client.set_registered_model_tag(model, DELETED_TAG, json.dumps(noted))


def deleted_why(client, model: str, version: str) -> str | None:
    """Why retention deleted version of model, as it recorded, or None."""
    try:
        noted = json.loads(client.get_registered_model(model).tags.get(DELETED_TAG) or "{}")
    except Exception:  # noqa: BLE001 - no record: the caller says the version is missing
        return None
    return noted.get(str(version)) if isinstance(noted, dict) else None
