"""Prediction outputs that cannot destroy: trainflow replaces only what it wrote, never a folder that overlaps
the run's inputs or stores, and a reader never sees half of a write.

Every output carries a manifest, `_trainflow_output.json` (model, rows, time, files), written last.
- An existing target is replaced only when it holds that manifest (or is an empty folder).
- Local disk: the new output is staged in a hidden sibling and swapped in with one atomic
  renameat2(RENAME_EXCHANGE); a crash leaves either the old or the new folder in place.
- Object stores (no rename): each write goes to a new prefix `<output>/gen-<time>-<id>/`; the manifest
  naming it is one PUT, made after every file is complete; the previous generation is deleted after that.
  A reader that follows the manifest (`output_files`) sees the old or the new output, never a mix; a crash
  before the manifest leaves the previous output whole (the next write removes the unfinished generation).
- Writers of one output queue on a lock (trainflow/run/locks.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import datetime as dt
import errno
import json
import logging
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from trainflow.errors import DataError
from trainflow.run.services import is_down, patient_storage
from trainflow.run.storage import filesystem_for, is_uri

log = logging.getLogger("trainflow.tables.outputs")

MANIFEST = "_trainflow_output.json"
GENERATION = re.compile(r"^gen-\d{8}T\d{6}-[0-9a-f]{12}$")


def _normalized(path: str) -> tuple[str, str]:
    """(scheme, path) comparable between a config's locations: local paths resolved (symlinks too)."""
    if is_uri(path):
        scheme, rest = path.split("://", 1)
        rest = rest.split("?", 1)[0]
        rest = rest.rsplit("@", 1)[-1] if "@" in rest.split("/", 1)[0] else rest  # drop user-info
        return scheme.lower(), "/" + rest.strip("/")
    return "file", os.path.realpath(os.path.expanduser(path.removeprefix("file://"))).rstrip("/") or "/"


def _inside(child: tuple[str, str], parent: tuple[str, str]) -> bool:
    return child[0] == parent[0] and (child[1] == parent[1] or child[1].startswith(parent[1].rstrip("/") + "/"))


def _glob_base(path: str) -> str:
    for i, ch in enumerate(path):
        if ch in "*?[":
            return path[:i].rsplit("/", 1)[0] or "/"
    return path


def mlflow_store_paths(tracking_uri: str | None) -> list[str]:
    """Local files an MLflow tracking URI keeps: a SQLite database and its artifact folder, or a file store."""
    if not tracking_uri:
        return []
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        return [str(db), str(db.parent / "mlartifacts")]
    if tracking_uri.startswith("file://") or "://" not in tracking_uri:
        return [tracking_uri.removeprefix("file://")]
    return []


def protected_paths(config: Any) -> list[tuple[str, str, bool]]:
    """(what, path, both_ways) the output must not overlap. both_ways: the output may be neither inside nor
    around it; otherwise it only must not contain it (an output inside the config's folder is fine)."""
    out = [("storage_path", config.storage_path, True)]
    if config.data.path:  # (a PostgreSQL source has none)
        out.insert(0, ("data.path", _glob_base(config.data.path), True))
    if config.inference.input:
        out.append(("inference.input", _glob_base(config.inference.input), True))
    for p in mlflow_store_paths(config.mlflow.tracking_uri):
        out.append(("the MLflow store", p, True))
    if config.source_dir:
        out.append(("the config's folder", config.source_dir, False))
    return out


def check_overlap(output: str, protected: list[tuple[str, str, bool]]) -> None:
    """DataError naming both paths when output is, contains or (both_ways) lies inside a protected path."""
    target = _normalized(output)
    for what, path, both_ways in protected:
        p = _normalized(path)
        if _inside(p, target) or (both_ways and _inside(target, p)):
            raise DataError(
                f"inference.output {output} overlaps {what} {path}: writing predictions there could replace or "
                "mix with it; choose an output folder of its own (nothing was written)"
            )


def read_manifest(output: str) -> dict[str, Any] | None:
    """The output's manifest, or None when there is none (or it is not trainflow's)."""
    fs, inner = filesystem_for(output)

    def read() -> bytes:
        with fs.open_input_stream(f"{inner.rstrip('/')}/{MANIFEST}") as f:
            return f.read()

    try:
        data = json.loads((patient_storage(read, output) if is_uri(output) else read()).decode())
    except (FileNotFoundError, ValueError):
        return None
    except OSError as exc:
        if is_down(exc):
            raise
        return None
    return data if isinstance(data, dict) and data.get("trainflow_output") == 1 else None


def check_owned(output: str) -> None:
    """DataError unless output is absent, an empty folder, or an earlier trainflow output (has the manifest)."""
    fs, inner = filesystem_for(output)
    inner = inner.rstrip("/")
    info = fs.get_file_info(inner)
    if info.type == pafs.FileType.NotFound:
        return
    if info.type == pafs.FileType.File:
        raise DataError(
            f"inference.output {output} is a file that trainflow did not write; "
            "choose a folder path (nothing was touched)"
        )
    entries = sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(inner)))
    if not entries or read_manifest(output) is not None:
        return
    shown = ", ".join(entries[:5]) + (" ..." if len(entries) > 5 else "")
    raise DataError(
        f"inference.output {output} holds files trainflow did not write ({shown}) and no {MANIFEST}; "
        "trainflow replaces only its own outputs: choose another folder or empty this one (nothing was touched)"
    )


def guard_output(output: str, config: Any) -> None:
    """Before any work: the output overlaps nothing of the run's and replaces only a trainflow output."""
    check_overlap(output, protected_paths(config))
    check_owned(output)


def check_destination(config: Any) -> None:
    """Before any work, wherever the predictions go: a Parquet folder (guard_output, and writable); a Delta table's
    location overlaps nothing of the run's and is a Delta table or nothing (not a folder of other files); an
    existing table holds the predictions' columns (those of every scoring run now; the classes' once the model is
    known, in infer)."""
    from trainflow.tables.files import check_writable

    output, sink = config.inference.output, config.inference.output_format
    if sink == "parquet":
        guard_output(output, config)
        check_writable(output)
    elif sink == "delta":
        check_overlap(output, protected_paths(config))
        fs, inner = filesystem_for(output)
        info = fs.get_file_info(inner.rstrip("/"))
        if info.type == pafs.FileType.File:
            raise DataError(f"inference.output {output} is a file, not a Delta table (nothing was touched)")
        if info.type == pafs.FileType.Directory:
            names = {i.base_name for i in fs.get_file_info(pafs.FileSelector(inner.rstrip("/")))}
            if names and "_delta_log" not in names:
                shown = ", ".join(sorted(names)[:5])
                raise DataError(
                    f"inference.output {output} holds files that are not a Delta table ({shown}); name a Delta "
                    "table's folder or a new one (nothing was touched)"
                )
        else:
            check_writable(output)
    if sink != "parquet":  # an existing table of other columns: refused before the table is read or a model trained
        from trainflow.tables.sinks import Sink

        Sink.of(config).check_early(config.data.id_column)


def output_files(output: str) -> list[str]:
    """The Parquet files of the output's current, complete write (from its manifest), as paths in its filesystem."""
    manifest = read_manifest(output)
    if manifest is None:
        raise DataError(f"{output}: no trainflow output here ({MANIFEST} not found)")
    _, inner = filesystem_for(output)
    return [f"{inner.rstrip('/')}/{f}" for f in manifest["files"]]


def _parquet_files(fs: pafs.FileSystem, folder: str) -> list[str]:
    infos = fs.get_file_info(pafs.FileSelector(folder, recursive=True, allow_not_found=True))
    return sorted(i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(".parquet"))


def _count_rows(fs: pafs.FileSystem, files: list[str]) -> int:
    return sum(pq.ParquetFile(fs.open_input_file(f)).metadata.num_rows for f in files)


def _manifest(files: list[str], rows: int, meta: dict[str, Any], generation: str | None) -> bytes:
    return json.dumps(
        {
            "trainflow_output": 1,
            "rows": rows,
            "files": files,
            "generation": generation,
            "written_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            **meta,
        },
        indent=1,
    ).encode()


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: str, b: str) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where the system cannot."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), a)


def _check_rows(written: int, expected: int) -> None:
    if written != expected:
        raise DataError(f"inference wrote {written} rows for {expected} input rows; output left unchanged")


def _write_parquet(data, uri: str, inner: str, fs: pafs.FileSystem) -> None:
    """A Ray Dataset written by Ray Data's writers; a pyarrow Table (a small output made in this process) as one
    file from here."""
    if isinstance(data, pa.Table):
        fs.create_dir(inner, recursive=True)
        pq.write_table(data, f"{inner}/{uuid.uuid4().hex}_000000_000000.parquet", filesystem=fs)
        return
    data.write_parquet(uri, filesystem=fs)


def _stage_name(name: str, what: str, token: str) -> str:
    return f".{name}.trainflow-{what}-{token}"


def clear_dead_stages(parent: str, name: str) -> list[str]:
    """Under the output's lock (no writer of this output is alive): remove the staging folders a killed writer
    left beside the output, after putting back a previous output that a crash between the two renames of the
    no-swap path left under its hidden name. Only trainflow's own names are touched. Returns what was removed."""
    stage = re.compile(rf"^\.{re.escape(name)}\.trainflow-(tmp|old)-[0-9a-f]{{12}}$")
    try:
        entries = sorted(e for e in os.listdir(parent) if stage.match(e))
    except FileNotFoundError:
        return []
    target = os.path.join(parent, name)
    olds = [e for e in entries if "-old-" in e and Path(parent, e, MANIFEST).is_file()]
    if olds and not os.path.exists(target):
        os.rename(os.path.join(parent, olds[-1]), target)
        entries.remove(olds[-1])
    for entry in entries:
        shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
    return entries


def _write_local(ds, fs: pafs.FileSystem, inner: str, expected_rows: int, meta: dict[str, Any]) -> int:
    parent, name = os.path.split(inner)
    clear_dead_stages(parent, name)
    token = uuid.uuid4().hex[:12]
    stage = os.path.join(parent, _stage_name(name, "tmp", token))
    try:
        os.makedirs(parent, exist_ok=True)
        _write_parquet(ds, stage, stage, fs)
        files = _parquet_files(fs, stage)
        written = _count_rows(fs, files)
        _check_rows(written, expected_rows)
        rel = [os.path.relpath(f, stage) for f in files]
        Path(stage, MANIFEST).write_bytes(_manifest(rel, written, meta, None))
        if not os.path.exists(inner):
            os.rename(stage, inner)
        elif not exchange(stage, inner):
            # no atomic swap here: the old output waits under a hidden name for the two renames
            old = os.path.join(parent, _stage_name(name, "old", token))
            os.rename(inner, old)
            os.rename(stage, inner)
            stage = old
        return written
    finally:
        if os.path.exists(stage):  # the old output after a swap (checked as trainflow's), or an unfinished one
            fs.delete_dir(stage)


def _write_object_store(
    ds, fs: pafs.FileSystem, inner: str, output: str, expected_rows: int, meta: dict[str, Any]
) -> int:
    from trainflow.run.storage import with_scheme

    generation = f"gen-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"
    prefix = f"{inner}/{generation}"
    committed = False
    try:
        _write_parquet(ds, with_scheme(output, prefix), prefix, fs)
        files = _parquet_files(fs, prefix)
        written = _count_rows(fs, files)
        _check_rows(written, expected_rows)
        rel = [f[len(inner) + 1 :] for f in files]
        with fs.open_output_stream(f"{inner}/{MANIFEST}") as f:  # one PUT: the commit
            f.write(_manifest(rel, written, meta, generation))
        committed = True
    finally:
        if not committed:  # a store gone away keeps them: the next write removes every generation its manifest lacks
            with contextlib.suppress(OSError):
                fs.delete_dir_contents(prefix, missing_dir_ok=True)
    # after the commit: the generations the manifest no longer names (the previous one, and any a crashed
    # write left) are trainflow's own, by their name under a trainflow output; a store gone away after the commit
    # leaves them to the next write
    try:
        for info in fs.get_file_info(pafs.FileSelector(inner)):
            if (
                info.type == pafs.FileType.Directory
                and GENERATION.match(info.base_name)
                and info.base_name != generation
            ):
                fs.delete_dir(info.path)
    except OSError as exc:
        if not is_down(exc):
            raise
        log.warning("the output %s is committed; its earlier generations stay until the next write (%s)", output, exc)
    return written


def write_output(ds, output: str, expected_rows: int, meta: dict[str, Any], config: Any = None) -> int:
    """Write ds (a Ray Dataset, or a pyarrow Table made in this process) as Parquet at output, with its manifest,
    replacing an earlier trainflow output as one step.

    Checks again (under the output's lock) that output is absent or trainflow's: the check before the run
    may be hours old. Raises DataError when the row count is not expected_rows (output unchanged).
    """
    from trainflow.run.locks import exclusive

    fs, inner = filesystem_for(output)
    inner = inner.rstrip("/")
    key = "/".join(_normalized(output))
    with exclusive("output", key):
        if config is not None:
            guard_output(output, config)
        else:
            check_owned(output)
        if isinstance(fs, pafs.LocalFileSystem):
            return _write_local(ds, fs, inner, expected_rows, meta)
        # each try writes a generation of its own, and only its manifest's one PUT makes it the output
        return patient_storage(lambda: _write_object_store(ds, fs, inner, output, expected_rows, meta), output)
