"""Files the user names on the command line (--summary-json, init's --out), written whole."""

from __future__ import annotations

from pathlib import Path

from trainflow.errors import TrainflowError
from trainflow.run.storage import replace_bytes, write_new


def write_out(path: str, text: str, replace: bool = True) -> None:
    """Write a file the user named, whole (storage.replace_bytes); replace=False: never over a file that exists,
    even one that appeared while it was written (storage.write_new)."""
    target = str(Path(path).resolve())
    if replace:
        replace_bytes(target, text.encode())
        return
    try:
        write_new(target, text.encode())
    except FileExistsError:
        raise TrainflowError(f"{path} exists; choose another file or add --force to replace it") from None
