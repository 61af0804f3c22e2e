"""Local paths and storage URIs (s3://, gs://, ...) through pyarrow.fs, for the driver and the Ray workers.

S3 endpoints and credentials come from the standard AWS settings (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, ...) or from the URI's query (s3://bucket/key?endpoint_override=host:port&scheme=http).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from trainflow.errors import DataError


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


def read_text(uri: str) -> str:
    fs, inner = filesystem_for(uri)
    with fs.open_input_stream(inner) as f:
        return f.read().decode()


def write_text(uri: str, text: str) -> None:
    write_bytes(uri, text.encode())


def write_bytes(uri: str, data: bytes) -> None:
    """Write a small file whole (object stores have no append); parents are created as needed."""
    fs, inner = filesystem_for(uri)
    fs.create_dir(inner.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(inner) as f:
        f.write(data)


def list_dir(uri: str) -> list[tuple[str, bool]]:
    """(name, is_dir) of the entries directly under uri; empty when it does not exist."""
    fs, inner = filesystem_for(uri)
    infos = fs.get_file_info(pafs.FileSelector(inner.rstrip("/"), allow_not_found=True))
    return [(i.base_name, i.type == pafs.FileType.Directory) for i in infos]


def localize(uri: str) -> str:
    """A local folder holding uri's files: the folder itself when local, else a fresh download."""
    if not is_uri(uri):
        return uri.removeprefix("file://")
    fs, inner = filesystem_for(uri)
    local = tempfile.mkdtemp(prefix="trainflow-" + Path(inner).name[:40] + "-")
    pafs.copy_files(inner, local, source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
    return local


def upload_dir(local: str, uri: str) -> None:
    """Copy a local folder's files under uri; parents are created as needed."""
    fs, inner = filesystem_for(uri)
    fs.create_dir(inner, recursive=True)
    pafs.copy_files(local, inner, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
