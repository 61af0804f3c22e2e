"""A fast replica of trainflow's MLP training for choosing defaults (not part of `make bench`).

    .venv/bin/python -m bench.mlp_sweep flights,diamonds '[{}, {"dropout": 0.4, "learning_rate": 0.002}]'

For each table of bench/model_quality.py and each variant (config keys of `model`/`train` to
override), it fits trainflow's own preprocessor on the same training rows, resolves the same
budget (2 workers: the global batch is twice the per-worker batch), trains with the same AdamW,
warm-up + cosine schedule and early stopping in one process, keeps the best epoch by validation
loss, and prints the held-out score next to HistGradientBoosting's. Minutes instead of the
flow's start-up per variant; the flow itself is what `model-quality` measures.
"""

from __future__ import annotations

import functools
import json
import math
import sys
import time

import numpy as np
import pyarrow as pa
import torch

from bench.model_quality import ID, TABLES, baseline, holdout, score

WORKERS = 2


def run(name: str, variants: list[dict]) -> None:
    import ray.data
    from sklearn.model_selection import train_test_split

    from trainflow.trainer.budget import EarlyStopping, lr_factor, resolve_budget
    from trainflow.trainer.families.network import model_for
    from trainflow.trainer.loop import member_loss
    from trainflow.config import Config
    from trainflow.preprocessors.fit import check_text_columns, fit_preprocessor
    from trainflow.tables.files import table_spec

    frame, label, task = TABLES[name.split("@")[0]]()
    if "@" in name:  # table@rows: a seeded sample of that many rows, as model-quality draws it
        frame = frame.sample(n=int(name.split("@")[1]), random_state=0).reset_index(drop=True)
    train, test = holdout(frame, label, task)
    fit_rows, val_rows = train_test_split(
        train, test_size=0.2, random_state=1, stratify=train[label] if task == "classification" else None
    )
    table = pa.Table.from_pandas(train, preserve_index=False)
    base_cfg = Config.model_validate({"data": {"path": "mem", "label": label, "id_column": ID}, "task": task})
    spec = table_spec(table.schema, base_cfg.data, task, name)
    check_text_columns(ray.data.from_arrow(table), spec, True, name)
    prep = fit_preprocessor(ray.data.from_arrow(pa.Table.from_pandas(fit_rows, preserve_index=False)), spec, task)

    def pack(df):
        t = pa.Table.from_pandas(df, preserve_index=False)
        return torch.from_numpy(prep.transform_features(t)), torch.from_numpy(prep.transform_label(t))

    xa, ya = pack(fit_rows)
    xv, yv = pack(val_rows)
    xt = torch.from_numpy(prep.transform_features(pa.Table.from_pandas(test, preserve_index=False)))
    hgb = score(task, test[label], baseline(train, test, label, task))
    loss_fn = (
        torch.nn.CrossEntropyLoss()
        if task == "classification"
        else (lambda o, y: torch.nn.functional.mse_loss(o.squeeze(-1), y))
    )
    for variant in variants:
        cfg = base_cfg.model_copy(deep=True)
        model_keys = set(type(cfg.model).model_fields)
        for key, value in variant.items():
            if key == "seed" or key in model_keys:  # the weights' seed: variants over seeds show a comparison's noise
                continue
            setattr(cfg.train, key, value)
        model_cfg = {**cfg.model.model_dump(), **{k: v for k, v in variant.items() if k in model_keys}}
        train_cfg = cfg.train.model_dump()
        budget = resolve_budget(cfg.train, len(ya), WORKERS)
        torch.manual_seed(variant.get("seed", 0))
        model = model_for(prep, model_cfg)
        opt = torch.optim.AdamW(
            model.parameters(), lr=train_cfg["learning_rate"], weight_decay=train_cfg["weight_decay"]
        )
        batch = budget.batch_size * WORKERS
        steps = math.ceil(len(ya) / batch)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt,
            functools.partial(
                lr_factor,
                total_steps=budget.limit * steps,
                warmup_fraction=train_cfg["warmup_fraction"],
                schedule=train_cfg["schedule"],
            ),
        )
        stopper = EarlyStopping("min", budget.patience, train_cfg["early_stopping"]["min_delta"])
        smooth = train_cfg["label_smoothing"]
        fit_loss = torch.nn.CrossEntropyLoss(label_smoothing=smooth) if task == "classification" else loss_fn
        best_state, started = None, time.perf_counter()
        for epoch in range(budget.limit):
            model.train()
            order = torch.randperm(len(ya))
            for i in range(0, len(ya), batch):
                idx = order[i : i + batch]
                opt.zero_grad()
                member_loss(fit_loss, model(xa[idx]), ya[idx]).backward()
                opt.step()
                sched.step()
            model.eval()
            with torch.no_grad():
                if stopper.update(float(loss_fn(model(xv), yv)), epoch):
                    best_state = {k: v.clone() for k, v in model.state_dict().items()}
            if stopper.should_stop:
                break
        model.load_state_dict(best_state)
        with torch.no_grad():
            out = model(xt).numpy()
        pred = (
            np.array(prep.classes)[out.argmax(1)]
            if task == "classification"
            else out.reshape(-1) * prep.label_std + prep.label_mean
        )
        print(
            f"{name} {json.dumps(variant)}: {score(task, test[label], pred):.4g} (HistGradientBoosting {hgb:.4g}); "
            f"best epoch {stopper.best_epoch} of {epoch + 1} run in {time.perf_counter() - started:.1f} s, "
            f"budget {budget.to_dict()}",
            flush=True,
        )


if __name__ == "__main__":
    torch.set_num_threads(2)
    tables = sys.argv[1].split(",") if len(sys.argv) > 1 else list(TABLES)
    variants = json.loads(sys.argv[2]) if len(sys.argv) > 2 else [{}]
    for t in tables:
        run(t, variants)
