"""XGBoost's external-memory input: a worker's Ray Data shard as an ExtMemQuantileDMatrix.

The shard is read once (one pass of the Ray Data pipeline, as every family's worker makes) and written to
the worker's local disk in pages of about PAGE_BYTES; XGBoost then makes its passes over those files (the
quantile sketch, then its gradient-index pages, which it caches on disk itself), so a worker holds about one
page of rows instead of its whole shard twice. The files are iterated, not the shard again: a streamed
shard's rows arrive in another order on every pass (files read in a random order, blocks handed to
whichever worker asks first), and XGBoost needs the same rows in the same order on every pass.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import xgboost as xgb

from trainflow.preprocessors.tabular import FEATURES, LABEL
from trainflow.trainer.watchdog import heartbeat
from trainflow.errors import DataError

PAGE_BYTES = 64 * 2**20  # rows per page: XGBoost's external memory is slow with many small pages


def spool(shard: Any, directory: Path) -> list[tuple[Path, Path]]:
    """Read a Ray Data shard (a DataIterator) once into (features, labels) .npy pages of about PAGE_BYTES."""
    directory.mkdir(parents=True, exist_ok=True)
    pages: list[tuple[Path, Path]] = []
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []

    def flush() -> None:
        if not xs:
            return
        x, y = np.concatenate(xs), np.concatenate(ys)
        free = shutil.disk_usage(directory).free
        if free < 2 * (x.nbytes + y.nbytes):
            raise DataError(
                f"XGBoost's external-memory files: {free / 2**20:,.0f} MiB left on the disk of {directory}, a page "
                f"needs {(x.nbytes + y.nbytes) / 2**20:,.0f} MiB and its cache about a third more. Point TMPDIR at a "
                "larger disk for the Ray workers (scaling.env_vars), use more workers, or model.params.external_memory: never"
            )
        page = (directory / f"x-{len(pages):05d}.npy", directory / f"y-{len(pages):05d}.npy")
        np.save(page[0], x)
        np.save(page[1], y)
        pages.append(page)
        xs.clear()
        ys.clear()

    held = 0
    for batch in shard.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=1):
        heartbeat()
        xs.append(np.asarray(batch[FEATURES], dtype=np.float32))
        ys.append(np.asarray(batch[LABEL]))
        held += xs[-1].nbytes
        if held >= PAGE_BYTES:
            flush()
            held = 0
    flush()
    return pages


class PageIter(xgb.DataIter):
    """The spooled pages, in order, as XGBoost's DataIter (one page per next call)."""

    def __init__(self, pages: list[tuple[Path, Path]], feature_types: list[str], cache_prefix: str):
        super().__init__(cache_prefix=cache_prefix, release_data=True)
        self.pages, self.feature_types, self.position = pages, feature_types, 0

    def next(self, input_data) -> bool:
        if self.position >= len(self.pages):
            return False
        x_path, y_path = self.pages[self.position]
        heartbeat()
        input_data(data=np.load(x_path, mmap_mode="r"), label=np.load(y_path), feature_types=self.feature_types)
        self.position += 1
        return True

    def reset(self) -> None:
        self.position = 0


def extmem_matrices(
    train_shard: Any, val_shard: Any, feature_types: list[str], directory: Path, params: dict[str, Any]
) -> tuple[xgb.DMatrix, xgb.DMatrix, np.ndarray]:
    """(train, validation) ExtMemQuantileDMatrix from the worker's shards, with the validation labels in the
    validation matrix's row order. The validation matrix shares the training one's bins (ref); once built, both
    live in XGBoost's cache under directory and the spooled pages are deleted."""
    categorical = "c" in feature_types
    matrices: list[xgb.DMatrix] = []
    for name, shard in (("train", train_shard), ("val", val_shard)):
        pages = spool(shard, directory / name)
        if not pages:
            raise DataError(f"XGBoost external memory: this worker's {name} shard has no rows; use fewer workers")
        matrices.append(
            xgb.ExtMemQuantileDMatrix(
                PageIter(pages, feature_types, str(directory / f"{name}-cache")),
                nthread=params.get("nthread"),
                max_bin=params.get("max_bin"),
                ref=matrices[0] if matrices else None,
                enable_categorical=categorical,
            )
        )
        if name == "val":  # the metrics' labels; the training labels are in XGBoost's matrix
            labels = np.concatenate([np.load(y) for _, y in pages])
        for x_path, y_path in pages:  # XGBoost reads its own cache from here on: half the disk back
            x_path.unlink()
            y_path.unlink()
    return matrices[0], matrices[1], labels
