"""Local paths and storage URIs (s3://, gs://, ...) through pyarrow.fs, for the driver and the Ray workers.

S3 endpoints and credentials come from the standard AWS settings (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, ...) or from the URI's query (s3://bucket/key?endpoint_override=host:port&scheme=http).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import socket
import tempfile
import threading
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from trainflow.errors import ConfigError, DataError
from trainflow.run.services import patient_storage


def _patient(fn):
    """fn(uri, ...) with an object store's absence waited out (services.storage_wait_s); local paths as they are."""
    import functools

    @functools.wraps(fn)
    def call(uri: str, *args, **kwargs):
        if not is_uri(uri):
            return fn(uri, *args, **kwargs)
        return patient_storage(lambda: fn(uri, *args, **kwargs), uri)

    return call


# what a run name may be: a folder name under storage_path (and in a bucket's keys), never a path
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_run_name(name: str) -> str:
    """name, when it may be a run's name (RUN_NAME); else ConfigError saying what it may hold."""
    if not RUN_NAME.match(name):
        raise ConfigError(f"run name {name!r}: use letters, digits, '.', '_' or '-' (at most 128)")
    return name


def is_uri(path: str) -> bool:
    """True for 's3://bucket/key'-style locations that pyarrow.fs resolves, False for local paths."""
    return "://" in path and not path.startswith("file://")


def filesystem_for(path: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem that serves path (local, s3://, gs://, hdfs://, ...) and the path inside it."""
    if is_uri(path):
        try:
            return pafs.FileSystem.from_uri(path)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
            raise DataError(f"cannot open {path}: {exc}") from None
    return pafs.LocalFileSystem(), path.removeprefix("file://")


def with_scheme(original: str, inner: str) -> str:
    """inner (a path inside original's filesystem) written the way original was: 's3://' + inner for S3."""
    if is_uri(original) and not is_uri(inner):
        return original.split("://", 1)[0] + "://" + inner.lstrip("/")
    return inner


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


@_patient
def read_text(uri: str) -> str:
    fs, inner = filesystem_for(uri)
    with fs.open_input_stream(inner) as f:
        return f.read().decode()


@_patient
def read_bytes(uri: str) -> bytes:
    fs, inner = filesystem_for(uri)
    with fs.open_input_stream(inner) as f:
        return f.read()


@_patient
def replace_bytes(uri: str, data: bytes) -> None:
    """Write a file whole under a temporary name of this writer's own, then move it over uri: a reader never sees
    half of it, and two writers at once never share a temporary file (the last move wins, whole)."""
    fs, inner = filesystem_for(uri)
    suffix = f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    write_bytes.__wrapped__(uri + suffix, data)  # this call as a whole waits out the store's absence
    try:
        fs.move(inner + suffix, inner)
    except BaseException:
        with contextlib.suppress(OSError):
            fs.delete_file(inner + suffix)
        raise


def write_new(path: str, data: bytes) -> None:
    """Write a local file whole, and only where none exists: the finished temporary file is hard-linked to path, which
    fails (FileExistsError) when path exists, so a file someone else wrote meanwhile is kept; no temporary file is
    left either way."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.link(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_text(uri: str, text: str) -> None:
    write_bytes(uri, text.encode())


@_patient
def write_bytes(uri: str, data: bytes) -> None:
    """Write a small file whole (object stores have no append); parents are created as needed."""
    fs, inner = filesystem_for(uri)
    fs.create_dir(inner.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(inner) as f:
        f.write(data)


@_patient
def list_dir(uri: str) -> list[tuple[str, bool]]:
    """(name, is_dir) of the entries directly under uri; empty when it does not exist."""
    fs, inner = filesystem_for(uri)
    infos = fs.get_file_info(pafs.FileSelector(inner.rstrip("/"), allow_not_found=True))
    return [(i.base_name, i.type == pafs.FileType.Directory) for i in infos]


_PRIVATE_ROOT: str | None = None
_PRIVATE_ROOT_NAME = re.compile(r"^trainflow-(\d+)-[a-z0-9_]{8}$")
_private_lock = threading.Lock()


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def staging_folder(parent: Path, name: str) -> Path:
    """A hidden sibling of parent/name to write it whole in before one rename, named for its writer (host, pid);
    the staging folders of name that processes on this host left when they died (SIGKILL) are removed first.
    Another host's, and a living process's, are left alone: they may still be writing."""
    pattern = re.compile(rf"^\.{re.escape(name)}\.tmp-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{{8}}$")
    host = socket.gethostname()
    for entry in os.listdir(parent) if parent.is_dir() else []:
        m = pattern.match(entry)
        if m and m["host"] == host and int(m["pid"]) != os.getpid() and not process_alive(int(m["pid"])):
            shutil.rmtree(parent / entry, ignore_errors=True)
    return parent / f".{name}.tmp-{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def private_dir(prefix: str) -> str:
    """A new folder only this process uses (mode 0700), under one root per process that is removed when the
    process exits; roots of this user's trainflow processes that died (SIGKILL) are removed when the next one
    makes its own (by their name and owner only)."""
    global _PRIVATE_ROOT
    with _private_lock:
        if _PRIVATE_ROOT is None or not os.path.isdir(_PRIVATE_ROOT):
            tmp = tempfile.gettempdir()
            for entry in os.scandir(tmp):
                m = _PRIVATE_ROOT_NAME.match(entry.name)
                if (
                    m
                    and int(m[1]) != os.getpid()
                    and entry.is_dir(follow_symlinks=False)
                    and entry.stat(follow_symlinks=False).st_uid == os.getuid()
                    and not process_alive(int(m[1]))
                ):
                    shutil.rmtree(entry.path, ignore_errors=True)
            _PRIVATE_ROOT = tempfile.mkdtemp(prefix=f"trainflow-{os.getpid()}-")
            atexit.register(shutil.rmtree, _PRIVATE_ROOT, True)
        return tempfile.mkdtemp(prefix=prefix, dir=_PRIVATE_ROOT)


@_patient
def private_copy(uri: str) -> str:
    """A copy of the folder at uri (local or in storage) that only this process can change: what is checked in it
    is what every later step reads, whatever happens to the original meanwhile (a shared bucket, a shared disk)."""
    fs, inner = filesystem_for(uri)
    local = os.path.join(private_dir("checkpoint-"), Path(inner.rstrip("/")).name[:60] or "checkpoint")
    if isinstance(fs, pafs.LocalFileSystem):
        shutil.copytree(inner, local)  # links followed: the copy holds the files as they are now
    else:
        os.makedirs(local)
        pafs.copy_files(inner, local, source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
    return local


def localize(uri: str) -> str:
    """A local folder holding uri's files: the folder itself when local, else a private download."""
    if not is_uri(uri):
        return uri.removeprefix("file://")
    return private_copy(uri)


def upload_dir(local: str, uri: str) -> None:
    """Copy a local folder's files under uri; parents are created as needed."""
    if is_uri(uri):
        patient_storage(lambda: _upload_dir(local, uri), uri)
    else:
        _upload_dir(local, uri)


@_patient
def upload_files(uri: str, local: str, last: str) -> None:
    """Copy a local folder's files under uri one by one, the file named `last` after every other: a reader that
    takes a folder holding it for whole never reads a copy cut short. The local folder is left as it was."""
    from pathlib import Path

    fs, inner = filesystem_for(uri)
    source = Path(local)
    for path in sorted((p for p in source.rglob("*") if p.is_file()), key=lambda p: p.name == last):
        target = join(inner, path.relative_to(source).as_posix())
        fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        pafs.copy_files(str(path), target, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)


def _upload_dir(local: str, uri: str) -> None:
    fs, inner = filesystem_for(uri)
    fs.create_dir(inner, recursive=True)
    pafs.copy_files(local, inner, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
