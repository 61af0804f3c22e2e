"""inference-throughput: trainflow batch inference (Ray Data actors) vs a single-process pandas+torch loop, rows/s.

Both read the same Parquet table, apply the checkpoint's own preprocessor, run the same MLP and
write Parquet predictions with the id column. trainflow uses one BatchPredictor actor per core but
one, which is left to the write tasks (with every CPU in actors the writes wait for the actors to
finish: 2 actors took 7.9-8.4 s for predict + write here, 1 actor 4.8-6.4 s).
Each side runs twice and the faster run counts (trainflow's actors start anew in both; its first run
in a new Ray also waits for Ray's worker processes, printed too).
"""

from __future__ import annotations

import os
import tempfile
import time

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from bench.common import COLS, ROWS, make_table, report, start_ray

ACTORS = max(1, (os.cpu_count() or 1) - 1)


def make_checkpoint(path, directory: str) -> str:
    """A checkpoint with a preprocessor fitted on the table and an (untrained) MLP: same work per row."""
    from trainflow.trainer.checkpoint import save_checkpoint
    from trainflow.trainer.families.network import model_for
    from trainflow.config import config_from_dict
    from trainflow.data import arrow_schema, read_table
    from trainflow.preprocessors.fit import fit_preprocessor
    from trainflow.tables import table_spec

    cfg = config_from_dict({"data": {"path": str(path), "label": "y", "id_column": "id"}, "task": "regression",
                            "model": {"type": "mlp"}})
    ds, _, _ = read_table(cfg.data.path, "parquet")
    prep = fit_preprocessor(ds, table_spec(arrow_schema(ds, str(path)), cfg.data, cfg.task, str(path)), cfg.task)
    model = model_for(prep, cfg.to_dict()["model"])
    save_checkpoint(directory, model.state_dict(), {"epoch": 0}, {"epoch": 0}, [], prep.to_dict(), cfg.to_dict())
    return directory


def run_trainflow(path, checkpoint: str, out: str) -> float:
    from trainflow.preprocessors.tabular import TabularPreprocessor
    from trainflow.trainer.predict import predict_dataset
    from trainflow.data import read_table
    from trainflow.outputs import write_output

    prep = TabularPreprocessor.load(checkpoint)
    t0 = time.perf_counter()
    ds, _, _ = read_table(str(path), "parquet")
    # as the infer task does: the table is materialized before the actors start, so the read tasks never
    # wait for CPUs that the actor pool holds (with every CPU in actors, a lazy read would never be scheduled)
    ds.context.execution_options.preserve_order = True
    ds = ds.materialize()
    preds = predict_dataset(ds, checkpoint, "id", prep.feature_order, batch_size=65536, num_actors=ACTORS)
    rows = write_output(preds, out, ROWS, {"model": checkpoint})
    seconds = time.perf_counter() - t0
    assert rows == ROWS
    return seconds


def run_baseline(path, checkpoint: str, out: str) -> float:
    from trainflow.trainer.serving import load_servable

    torch.set_num_threads(1)
    servable = load_servable(checkpoint)
    prep = servable.preprocessor
    t0 = time.perf_counter()
    frame = pd.read_parquet(path)
    parts = []
    for start in range(0, len(frame), 65536):
        chunk = pa.Table.from_pandas(frame.iloc[start : start + 65536], preserve_index=False)
        x = prep.transform_features(chunk, strict=True)
        with torch.inference_mode():
            y = servable.predict.model(torch.from_numpy(x)).numpy().reshape(-1)
        parts.append(pd.DataFrame({"id": chunk["id"].to_numpy(), "prediction": y * prep.label_std + prep.label_mean}))
    pq.write_table(pa.Table.from_pandas(pd.concat(parts), preserve_index=False), out)
    return time.perf_counter() - t0


def main() -> None:
    import ray

    path = make_table()
    with tempfile.TemporaryDirectory() as tmp:
        start_ray()
        os.makedirs(os.path.join(tmp, "ckpt"))
        checkpoint = make_checkpoint(path, os.path.join(tmp, "ckpt"))
        first = run_trainflow(path, checkpoint, os.path.join(tmp, "ours"))
        ours = min(first, run_trainflow(path, checkpoint, os.path.join(tmp, "ours")))
        ray.shutdown()
        base = min(run_baseline(path, checkpoint, os.path.join(tmp, "base.parquet")) for _ in range(2))
    report(
        "inference-throughput", ROWS / ours / 1e6, ROWS / base / 1e6, "M rows/s", base / ours,
        f"{ROWS} rows x {COLS} cols, read -> preprocess -> MLP -> Parquet; {ACTORS} actor(s) on {os.cpu_count()} CPUs vs 1 process (1 torch thread); "
        f"trainflow {ours:.1f} s (first run in a new Ray {first:.1f} s), baseline {base:.1f} s; target ratio >= 1.0",
    )


if __name__ == "__main__":
    main()
