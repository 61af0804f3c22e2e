"""Which rows each Ray Train worker reads: a DataConfig that hands a single worker a materialized dataset whole and
cuts everything else with `streaming_split`.

A table packed in the driver (trainflow.data) is materialized: its blocks are already in the object store, and one
worker's shard is all of them, so its iterator is the dataset's own and nothing more runs per fit. `streaming_split`
would start a SplitCoordinator actor per dataset and run an executor in it every epoch, whatever the table's size
(docs/performance.md "Ray Train's fixed cost per fit"). Several workers keep `streaming_split`: `Dataset.split`'s
equal cut runs Ray tasks that need a CPU, and the worker group holds them all while its DataConfig runs. A streamed
table (data.materialize: never, or too large for the object store) is read from its files as the workers ask."""

from __future__ import annotations

import re
from typing import Any

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
