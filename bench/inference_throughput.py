"""inference-throughput: trainflow batch inference (the infer task) vs a single-process pandas+torch loop, rows/s.

Both read the same Parquet table, apply the checkpoint's own preprocessor, run the same MLP and write Parquet
predictions with the id column. trainflow's infer task predicts a table under scoring_in_process_bytes() (512 MiB on a
machine of 4 GiB or more; this one is about 290 MiB) in its own process, a batch at a time, and larger ones with Ray
Data actors (one per core but one, left to the write tasks). Each side runs twice and the faster run counts.
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
    from trainflow.trainer.serving.checkpoint import save_checkpoint
    from trainflow.trainer.families.network import model_for
    from trainflow.config import config_from_dict
    from trainflow.data import arrow_schema, read_table
    from trainflow.preprocessors.fit import fit_preprocessor
    from trainflow.tables.files import table_spec

    cfg = config_from_dict(
        {"data": {"path": str(path), "label": "y", "id_column": "id"}, "task": "regression", "model": {"type": "mlp"}}
    )
    ds, _, _ = read_table(cfg.data.path, "parquet")
    prep = fit_preprocessor(ds, table_spec(arrow_schema(ds, str(path)), cfg.data, cfg.task, str(path)), cfg.task)
    model = model_for(prep, cfg.to_dict()["model"])
    save_checkpoint(directory, model.state_dict(), {"epoch": 0}, {"epoch": 0}, [], prep.to_dict(), cfg.to_dict())
    return directory


def run_trainflow(path, checkpoint: str, out: str) -> float:
    """The infer task as `trainflow predict` runs it (drift off: the baseline measures none): a table under
    scoring_in_process_bytes() is read, predicted a batch at a time and written by this process; larger ones by
    Ray Data actors."""
    from trainflow.config import config_from_dict
    from trainflow.tasks.infer import infer

    cfg = config_from_dict(
        {
            "data": {"path": str(path), "label": "y", "id_column": "id"},
            "task": "regression",
            "storage_path": os.path.join(os.path.dirname(out), "runs"),
            "inference": {"input": str(path), "output": out, "drift": {"enabled": False}},
        }
    )
    t0 = time.perf_counter()
    predictions = infer.fn(checkpoint, cfg, checkpoint)
    seconds = time.perf_counter() - t0
    assert predictions.output_rows == ROWS
    return seconds


def run_baseline(path, checkpoint: str, out: str) -> float:
    from trainflow.trainer.serving.servable import load_servable

    servable = load_servable(checkpoint)  # torch's default threads, as trainflow's process uses
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

    from trainflow.tables.files import scoring_in_process_bytes

    path = make_table()
    here = pq.ParquetFile(path).metadata.num_rows * (COLS + 2) * 8 <= scoring_in_process_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        start_ray()
        os.makedirs(os.path.join(tmp, "ckpt"))
        checkpoint = make_checkpoint(path, os.path.join(tmp, "ckpt"))
        first = run_trainflow(path, checkpoint, os.path.join(tmp, "ours"))
        ours = min(first, run_trainflow(path, checkpoint, os.path.join(tmp, "ours")))
        ray.shutdown()
        base = min(run_baseline(path, checkpoint, os.path.join(tmp, "base.parquet")) for _ in range(2))
    report(
        "inference-throughput",
        ROWS / ours / 1e6,
        ROWS / base / 1e6,
        "M rows/s",
        base / ours,
        f"{ROWS} rows x {COLS} cols, read -> preprocess -> MLP -> Parquet with the id; trainflow's infer task "
        f"({'this process' if here else f'{ACTORS} actor(s)'}, {os.cpu_count()} CPUs) vs 1 pandas+torch process; "
        f"trainflow {ours:.1f} s (first run {first:.1f} s), baseline {base:.1f} s; target ratio >= 1.0",
    )


if __name__ == "__main__":
    main()
