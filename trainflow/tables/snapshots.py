"""Tables handed over in memory, kept as Parquet under storage_path/snapshots: trainflow.retrain(data=...) and
replay's cutoffs (flows/replay.py) read them like any table."""

from __future__ import annotations

from typing import Any

SNAPSHOTS = "snapshots"  # under storage_path: the tables handed to retrain(data=...), as Parquet


def snapshot(data: Any, storage_path: str) -> str:
    """A table handed over in memory, written as Parquet under storage_path/snapshots, where a retrain reads it like
    any table (its lineage, resume and skip follow its bytes): a pandas DataFrame or pyarrow Table as one file in a
    folder named by the hash of its Parquet bytes (the same frame again: the same file, not written twice); a Ray
    Dataset by its blocks in a new folder (its file names and bytes, hence its fingerprint, are the same for the
    same rows). The path; TypeError for anything else."""
    import hashlib
    import uuid

    import pandas as pd
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    import ray.data
    from ray.data.datasource import FilenameProvider

    from trainflow.errors import DataError
    from trainflow.run.storage import filesystem_for, join, read_bytes, replace_bytes
    from trainflow.tables.columns import check_names

    class BlockFiles(FilenameProvider):
        """Files named by their place in the write, not by its id: the same rows in the same blocks give the same
        names, hence the same content fingerprint (a skip, a resume) in another folder."""

        def get_filename_for_block(self, block, write_uuid, task_index, block_index):  # noqa: ANN001 - Ray's
            return f"part-{task_index:05d}-{block_index:05d}.parquet"

    if isinstance(data, ray.data.Dataset):
        where = join(storage_path, SNAPSHOTS, f"ray-{uuid.uuid4().hex[:16]}")
        fs, inner = filesystem_for(where)
        data.write_parquet(inner, filesystem=fs, filename_provider=BlockFiles())
        return where
    if isinstance(data, (pd.DataFrame, pa.Table)):
        check_names(
            [str(c) for c in data.columns] if isinstance(data, pd.DataFrame) else data.column_names,
            "data",
            empty_ok=False,
        )
    if isinstance(data, pd.DataFrame):
        data = pa.Table.from_pandas(data, preserve_index=False)
    if not isinstance(data, pa.Table):
        raise TypeError(
            f"data: expected a pandas DataFrame, a pyarrow Table or a Ray Dataset, got {type(data).__name__}"
        )
    sink = pa.BufferOutputStream()
    pq.write_table(data, sink)
    body = sink.getvalue()
    where = join(storage_path, SNAPSHOTS, hashlib.blake2b(body, digest_size=16).hexdigest(), "table.parquet")
    fs, inner = filesystem_for(where)
    if fs.get_file_info(inner).type != pafs.FileType.File:
        replace_bytes(where, body)  # whole or not at all: a reader never sees half of it
    elif hashlib.blake2b(read_bytes(where), digest_size=16).hexdigest() != where.rsplit("/", 2)[-2]:
        # a file at this name that is not these bytes was put there by someone else: never trained on, never replaced
        raise DataError(
            f"{where}: this snapshot's bytes do not match its name (edited or planted in storage); "
            "trainflow neither trains on it nor replaces it: remove it, or use another storage_path"
        )
    return where
