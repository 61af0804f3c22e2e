"""Which rows each Ray Train worker reads: a DataConfig that hands a single worker a materialized dataset whole and
cuts everything else with `streaming_split`.

A table packed in the driver (trainflow.data) is materialized: its blocks are already in the object store, and one
worker's shard is all of them, so its iterator is the dataset's own and nothing more runs per fit. `streaming_split`
would start a SplitCoordinator actor per dataset and run an executor in it every epoch, whatever the table's size
(docs/performance.md "Ray Train's fixed cost per fit"). Several workers keep `streaming_split`: `Dataset.split`'s
equal cut runs Ray tasks that need a CPU, and the worker group holds them all while its DataConfig runs. A streamed
table (data.materialize: never, or too large for the object store) is read from its files as the workers ask."""

from __future__ import annotations

import contextvars
import re
from typing import Any, Callable

import pyarrow as pa
from ray.data.block import BlockAccessor
from ray.data.dataset import MaterializedDataset
from ray.train import DataConfig

FOLD_SUFFIX = re.compile(r"_\d+$")  # a fold's own datasets (train_3, val_3: trainer/session.py) are cut as their role's


class ShardConfig(DataConfig):
    """equal: dataset name -> True for equal shards (DDP needs the same steps on every rank; rows that do not divide
    evenly are dropped, as Ray Data's equal splits do), False for unequal ones (every row read once); a dataset not
    named goes whole to every worker."""

    def __init__(self, equal: dict[str, bool], **kwargs: Any) -> None:
        super().__init__(datasets_to_split=list(equal), **kwargs)
        self._equal = dict(equal)

    def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
        output: list[dict[str, Any]] = [{} for _ in range(world_size)]
        hints = worker_node_ids if self._enable_shard_locality else None
        for name, ds in datasets.items():
            if ds.name is None:
                ds.set_name(name)
            materialized = isinstance(ds, MaterializedDataset)
            ds = ds.copy(ds)
            ds.context.execution_options = self._resolve_execution_options(name)
            role = FOLD_SUFFIX.sub("", name)
            if role not in self._equal or (materialized and world_size == 1):
                shards = [ds.iterator() for _ in range(world_size)]
            else:
                shards = ds.streaming_split(world_size, equal=self._equal[role], locality_hints=hints)
            for i, shard in enumerate(shards):
                output[i][name] = shard
        return output


# while a fit in local mode reads tables this process holds (InProcessRows): dataset name -> table
_tables: contextvars.ContextVar[dict[str, pa.Table] | None] = contextvars.ContextVar("trainflow_tables", default=None)


class TableShard:
    """A fit's rows held in this process (a small table packed by the preprocess task: trainflow/data.py Rows), read
    as a Ray Data shard of one block is: a fit in Ray Train's local mode needs no Ray for its data."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def iter_batches(self, *, batch_size=None, batch_format: str = "numpy", prefetch_batches: int = 1):
        if self.table.num_rows:
            yield BlockAccessor.for_block(self.table).to_batch_format(batch_format)

    def iter_torch_batches(self, *, batch_size=None, device=None, prefetch_batches: int = 1):
        from ray.data.util.torch_utils import convert_ndarray_batch_to_torch_tensor_batch

        for batch in self.iter_batches():
            yield convert_ndarray_batch_to_torch_tensor_batch(batch, device=device)  # as Ray Data's shard converts


class InProcessRows:
    """A train function whose dataset_shard (trainer/session.py) reads the tables given here (picklable, as the
    function it wraps is)."""

    def __init__(self, train_fn: Callable[[dict[str, Any]], Any], tables: dict[str, pa.Table]) -> None:
        self.train_fn, self.tables = train_fn, tables

    def __call__(self, loop_config: dict[str, Any]) -> Any:
        token = _tables.set(self.tables)
        try:
            return self.train_fn(loop_config)
        finally:
            _tables.reset(token)


def table_shard(name: str) -> TableShard | None:
    """The shard of dataset name where the running fit reads tables this process holds (InProcessRows), else None."""
    tables = _tables.get()
    return TableShard(tables[name]) if tables is not None and name in tables else None


def in_process_rows(train_fn, datasets: dict[str, Any], local: bool):
    """(the train function, the datasets Ray Train gets) for a fit of datasets: tables this process holds stay here
    for a fit in Ray Train's local mode (no Ray needed), and go to the object store (ray.data.from_arrow, as one
    block each) for a worker group's."""
    tables = {k: v for k, v in datasets.items() if isinstance(v, pa.Table)}
    if not tables:
        return train_fn, datasets
    if local:
        return InProcessRows(train_fn, tables), {k: v for k, v in datasets.items() if k not in tables}
    import ray.data

    return train_fn, {k: ray.data.from_arrow(v) if k in tables else v for k, v in datasets.items()}
