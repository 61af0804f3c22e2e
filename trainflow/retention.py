"""Retention: storage that stays bounded over months of nightly retrains without losing what a champion needs.

Every retrain records its start in storage_path (`.trainflow-runs/<run name>.json`: the run name, the registered
model, when it started); only runs recorded there are ever removed, and of a recorded run only the entries trainflow
names after it (`<run>`, `<run>-families`, `<run>-<family>`, `<run>-<family>-bag`, `...-earlier`, `-ensemble`,
`-split`, `-source-<hex>`, `-source.json`, `-done.json`): a folder someone else put beside them, or one two recorded
run names could both own, is left as it is.

A recorded run of the config's registered model goes when `retention.keep_runs` or `retention.max_age_days` lets it
go (both set: both must) and nothing needs it: not a version an alias points at now or pointed at within
`retention.alias_history_days` (the champion's recorded history), not one of the newest `keep_runs`, not a start in
progress (its run-name lock is held). A registered version needs no run folder (its model is whole in MLflow), so its
folders go while the version stays; `retention.delete_versions` also deletes such versions through MLflow's API and
marks their MLflow runs deleted (a run a remaining version comes from is never marked).

A removal holds the run's own lock, marks the run's record `removing` first, then deletes its done record (a rerun of
the name must not think it finished), its folders, and last the record: a removal cut short (SIGKILL) is finished by
the next collection, or by a retrain of that name before it reads anything there.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import shutil
import socket
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs

from trainflow.run.storage import RUN_NAME, filesystem_for, is_uri, join, list_dir, read_text, replace_bytes

LEDGER = ".trainflow-runs"
_FIXED = ("families", "split", "ensemble", "earlier", "bag", "source.json", "done.json")

log = logging.getLogger(__name__)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _record_uri(storage_path: str, run_name: str) -> str:
    return join(storage_path, LEDGER, f"{run_name}.json")


def finish_removal(config, run_name: str) -> None:
    """A removal of run_name's folders that was cut short (SIGKILL) is finished, before a start of that name reads
    anything there (the caller holds the run-name lock); nothing is written otherwise."""
    uri = _record_uri(config.storage_path, run_name)
    before = _read_record(uri, run_name)
    if before is not None and before.get("removing"):
        log.warning("run %s: finishing a removal of its folders that was cut short (%s)", run_name, before["removing"])
        _remove_entries(config.storage_path, run_name, _owned(config.storage_path, [run_name]).get(run_name, []))


def record_start(config, run_name: str) -> None:
    """Record that a retrain of run_name writes into config.storage_path (before its first write there, once every
    check passed; the caller holds the run-name lock): only a recorded run is ever removed."""
    uri = _record_uri(config.storage_path, run_name)
    before = _read_record(uri, run_name) or {}
    now = _now().isoformat(timespec="seconds")
    record = {
        "run_name": run_name,
        "model": config.mlflow.registered_model,
        "first_started": before.get("first_started") or now,
        "started": now,
        "by": f"{socket.gethostname()}:{os.getpid()}",
    }
    replace_bytes(uri, json.dumps(record).encode())


def _read_record(uri: str, run_name: str) -> dict[str, Any] | None:
    """A run's record, or None when there is none or it is not one trainflow wrote for that name (checked, not
    trusted: a record claims a run, it does not name paths)."""
    try:
        record = json.loads(read_text(uri))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("run_name") != run_name or not RUN_NAME.match(run_name):
        return None
    try:
        record["_started"] = dt.datetime.fromisoformat(str(record["started"]))
    except (KeyError, ValueError):
        return None
    if record["_started"].tzinfo is None:
        return None
    return record


def _records(storage_path: str, model: str) -> list[dict[str, Any]]:
    """The recorded runs of model in storage_path, newest start first."""
    found = []
    for name, is_dir in list_dir(join(storage_path, LEDGER)):
        if is_dir or not name.endswith(".json"):
            continue
        record = _read_record(join(storage_path, LEDGER, name), name.removesuffix(".json"))
        if record is not None and record.get("model") == model:
            found.append(record)
    return sorted(found, key=lambda r: r["_started"], reverse=True)


def _pattern(run_name: str) -> re.Pattern:
    from trainflow.catalogue import family_modules

    families = "|".join(re.escape(f) for f in sorted(family_modules()))
    tail = rf"(?:{'|'.join(re.escape(f) for f in _FIXED)}|source-[0-9a-f]{{8}}|(?:{families})(?:-bag|-earlier)?)"
    return re.compile(rf"^{re.escape(run_name)}(?:-{tail})?$")


def _owned(storage_path: str, run_names: list[str]) -> dict[str, list[tuple[str, bool]]]:
    """The entries of storage_path each run name owns; an entry two of them could own belongs to neither."""
    patterns = {name: _pattern(name) for name in run_names}
    owned: dict[str, list[tuple[str, bool]]] = {name: [] for name in run_names}
    for entry, is_dir in list_dir(storage_path):
        owners = [name for name, p in patterns.items() if p.match(entry)]
        if len(owners) == 1:
            owned[owners[0]].append((entry, is_dir))
    return owned


def _size(storage_path: str, entry: str, is_dir: bool) -> int:
    fs, inner = filesystem_for(join(storage_path, entry))
    if not is_dir:
        info = fs.get_file_info(inner)
        return max(info.size or 0, 0)
    infos = fs.get_file_info(pafs.FileSelector(inner, recursive=True, allow_not_found=True))
    return sum(max(i.size or 0, 0) for i in infos if i.type == pafs.FileType.File)


def _delete(storage_path: str, entry: str, is_dir: bool) -> None:
    uri = join(storage_path, entry)
    if not is_uri(uri):
        path = uri.removeprefix("file://")
        if is_dir and os.path.isdir(path):
            shutil.rmtree(path)
        elif not is_dir and os.path.lexists(path):
            os.unlink(path)
        return
    fs, inner = filesystem_for(uri)
    if is_dir:
        fs.delete_dir(inner)
    else:
        fs.delete_file(inner)


def _remove_entries(storage_path: str, run_name: str, entries: list[tuple[str, bool]]) -> None:
    """The run's done record first (a rerun must not think it finished), then its folders and files, then its
    record."""
    done = [e for e in entries if e[0] == f"{run_name}-done.json"]
    for entry, is_dir in done + [e for e in entries if e not in done]:
        _delete(storage_path, entry, is_dir)
    _delete(storage_path, f"{LEDGER}/{run_name}.json", False)


@dataclass
class Plan:
    """What a collection removes and keeps, each run with why."""

    remove: list[dict[str, Any]] = field(default_factory=list)
    keep: list[dict[str, Any]] = field(default_factory=list)
    versions: dict[str, list[str]] = field(default_factory=dict)  # run name -> its model versions


def _versions_by_run(client, model: str, storage_path: str) -> tuple[dict[str, list[Any]], dict[str, str]]:
    """Each retrain run name's model versions (by the version's MLflow run and that run's parent's
    trainflow.retrain tag), and each version's run name; versions of another storage_path are left out."""
    from trainflow.run.locks import normalized_scope
    from trainflow.run.tracking import RETRAIN_TAG

    by_run: dict[str, list[Any]] = {}
    of: dict[str, str] = {}
    runs: dict[str, Any] = {}
    for mv in client.search_model_versions(f"name = '{model}'"):
        if normalized_scope(mv.tags.get("trainflow.storage_path", "")) != normalized_scope(storage_path):
            continue
        try:
            run = runs.get(mv.run_id) or client.get_run(mv.run_id)
            runs[mv.run_id] = run
            parent_id = run.data.tags.get("mlflow.parentRunId")
            parent = run if parent_id is None else (runs.get(parent_id) or client.get_run(parent_id))
            runs[parent.info.run_id] = parent
        except Exception:  # noqa: BLE001 - a version whose run cannot be read is kept by no rule: left alone below
            continue
        name = parent.data.tags.get(RETRAIN_TAG)
        if name:
            by_run.setdefault(name, []).append(mv)
            of[str(mv.version)] = name
    return by_run, of


def _protected_versions(client, model: str, window_days: float) -> dict[str, str]:
    """Each version an alias points at now, or that served as @champion within window_days: why."""
    from trainflow.champion import history

    why: dict[str, str] = {}
    try:
        aliases = client.get_registered_model(model).aliases or {}
    except Exception as exc:  # noqa: BLE001 - no registered model yet: nothing is served
        if getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return why
        raise
    for alias, version in aliases.items():
        why.setdefault(str(version), f"version {version} is @{alias}")
    since = (_now() - dt.timedelta(days=window_days)).isoformat(timespec="seconds")
    for period in history(client, model):
        if period.get("until") is None or str(period["until"]) >= since:
            why.setdefault(
                str(period["version"]),
                f"version {period['version']} served as @champion within retention.alias_history_days "
                f"({window_days:g})",
            )
    return why


# how long a collection waits for a run's lock before it counts the run as in progress (a Prefect server's lock
# answers in a second or so; a run that holds it holds it for its whole retrain)
IN_PROGRESS_WAIT_S = 5.0


def _run_lock(storage_path: str, run_name: str):
    from trainflow.run.locks import exclusive

    return exclusive("run", run_name, storage_path, timeout_s=IN_PROGRESS_WAIT_S)  # locks.run_lock's lock


def plan(config, current: str | None = None, needed: dict[str, str] | None = None) -> Plan:
    """Which recorded runs of config's registered model go and which stay, with why (current: the run making the
    collection, which stays; needed: versions something else needs, with why: a kept output's lineage)."""
    import mlflow

    r = config.retention
    out = Plan()
    if not r.limited:
        return out
    uri, model, storage = config.mlflow.tracking_uri, config.mlflow.registered_model, config.storage_path
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    protected = {**(needed or {}), **_protected_versions(client, model, r.alias_history_days)}
    by_run, _ = _versions_by_run(client, model, storage)
    records = _records(storage, model)
    cutoff = None if r.max_age_days is None else _now() - dt.timedelta(days=r.max_age_days)
    for rank, record in enumerate(records):
        name = record["run_name"]
        versions = sorted((str(v.version) for v in by_run.get(name, [])), key=int)
        row = {"run": name, "started": record["started"], "versions": versions}
        kept = next((protected[v] for v in versions if v in protected), None)
        if name == current:
            kept = "this run"
        elif kept is None and r.keep_runs is not None and rank < r.keep_runs:
            kept = f"one of the newest {r.keep_runs} (retention.keep_runs)"
        elif kept is None and cutoff is not None and record["_started"] >= cutoff:
            kept = f"started within retention.max_age_days ({r.max_age_days:g})"
        if kept is not None:
            out.keep.append({**row, "why": kept})
            continue
        why = (
            f"older than the newest {r.keep_runs}"
            if r.keep_runs is not None and rank >= r.keep_runs
            else f"started more than {r.max_age_days:g} days ago"
        )
        out.remove.append({**row, "why": why})
        out.versions[name] = versions
    return out


def collect(
    config, dry_run: bool = False, current: str | None = None, needed: dict[str, str] | None = None
) -> dict[str, Any]:
    """Apply config.retention to config.storage_path (and the registry, with delete_versions); dry_run: the same
    answer, nothing removed; needed: versions something else needs (tasks/retention.py output_version), kept with
    why. The summary: what went, what stayed, why, and the bytes freed."""
    from trainflow.run.locks import LockTimeout

    chosen = plan(config, current, needed)
    storage = config.storage_path
    names = [row["run"] for row in chosen.remove + chosen.keep]
    removed = []
    for row in chosen.remove:
        name = row["run"]
        try:
            with _run_lock(storage, name):  # no start of the name while it goes; a start in progress keeps it
                record = _read_record(_record_uri(storage, name), name)
                if record is None or record["started"] != row["started"]:  # collected, or started again, meanwhile
                    continue
                entries = _owned(storage, names)[name]
                done = {
                    **row,
                    "entries": sorted(e for e, _ in entries),
                    "bytes": sum(_size(storage, e, d) for e, d in entries),
                }
                if not dry_run:
                    _remove(config, record, entries, done, chosen.versions.get(name, []), needed or {})
        except LockTimeout:
            chosen.keep.append({**row, "why": "a start of it is in progress (its run-name lock is held)"})
            continue
        removed.append(done)
    return {
        "dry_run": dry_run,
        "removed": removed,
        "kept": chosen.keep,
        "bytes_freed": sum(r["bytes"] for r in removed),
        "model": config.mlflow.registered_model,
        "storage_path": storage,
    }


def _remove(
    config, record: dict, entries: list[tuple[str, bool]], done: dict, versions: list[str], needed: dict
) -> None:
    """Remove one run (its lock held): its record marked `removing` first, then its entries, then (delete_versions)
    its versions and MLflow runs."""
    name = record["run_name"]
    marked = {k: v for k, v in record.items() if not k.startswith("_")}
    marked["removing"] = f"{socket.gethostname()}:{os.getpid()} at {_now().isoformat(timespec='seconds')}"
    replace_bytes(_record_uri(config.storage_path, name), json.dumps(marked).encode())
    _remove_entries(config.storage_path, name, entries)
    if config.retention.delete_versions:
        done.update(_forget(config, name, versions, needed))


def _forget(config, run_name: str, versions: list[str], needed: dict[str, str]) -> dict[str, Any]:
    """Delete run_name's model versions and mark its MLflow runs deleted, through MLflow's API, under the champion
    lock (a rollback or a gate cannot point an alias at a version while it goes); a version an alias took meanwhile
    stays, and so do the runs."""
    import mlflow

    from trainflow.champion import note_deleted
    from trainflow.run.locks import exclusive
    from trainflow.run.tracking import RETRAIN_TAG

    uri, model = config.mlflow.tracking_uri, config.mlflow.registered_model
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    deleted, runs_deleted = [], []
    with exclusive("champion", model, uri):
        protected = {**needed, **_protected_versions(client, model, config.retention.alias_history_days)}
        stay = [v for v in versions if v in protected]
        for version in (v for v in versions if v not in protected):
            note_deleted(
                client, model, version, f"deleted by retention on {_now().date().isoformat()} with its run {run_name}"
            )
            client.delete_model_version(model, version)
            deleted.append(version)
    if not stay:
        experiment = client.get_experiment_by_name(config.mlflow.experiment)
        parents = (
            client.search_runs([experiment.experiment_id], filter_string=f"tags.`{RETRAIN_TAG}` = '{run_name}'")
            if experiment
            else []
        )
        for parent in parents:
            children = client.search_runs(
                [experiment.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
            )
            for run in [*children, parent]:
                client.delete_run(run.info.run_id)
                runs_deleted.append(run.info.run_id)
    return {"versions_deleted": deleted, "mlflow_runs_deleted": len(runs_deleted)}
