"""The train loop in Ray Train local mode (num_workers=0): fast, in-process, real TorchTrainer."""

import math

import numpy as np
import pyarrow as pa
import pytest
import ray.data
import torch
from ray.data.extensions import ArrowTensorArray
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer

from trainflow.preprocessors.tabular import FEATURES, LABEL
from tests.conftest import make_regression_table
from trainflow.trainer.loop import iter_minibatches, train_fn_per_worker
from trainflow.config import config_from_dict
from trainflow.preprocessors.fit import fit_and_pack
from trainflow.tables.files import table_spec

pytestmark = pytest.mark.usefixtures("ray_local")


def _local_fit(task, table, label, epochs=6, lr=0.01, tmp_path=None, **extra):
    raw = {
        "data": {"path": "mem", "label": label, "id_column": "row id"},
        "task": task,
        "model": {"type": "mlp", "params": {"mlp": {"epochs": epochs, "batch_size": 64, "learning_rate": lr}}},
        "scaling": {"num_workers": 1},
        **extra,
    }
    cfg = config_from_dict(raw, base_dir=tmp_path)
    cut = int(table.num_rows * 0.8)
    prep, train_ds, val_ds = fit_and_pack(
        ray.data.from_arrow(table.slice(0, cut)),
        ray.data.from_arrow(table.slice(cut)),
        table_spec(table.schema, cfg.data, task, "mem"),
        task,
    )
    trainer = TorchTrainer(
        train_fn_per_worker,
        train_loop_config={"config": cfg, "preprocessor": prep.to_dict()},
        scaling_config=ScalingConfig(num_workers=0),
        datasets={"train": train_ds, "val": val_ds},
    )
    return trainer.fit()


def test_regression_loss_falls_and_metrics_are_reported(tmp_path):
    result = _local_fit("regression", make_regression_table(2000), "target y", tmp_path=tmp_path)
    history = result.return_value
    assert [h["epoch"] for h in history] == list(range(6))
    assert history[-1]["val_loss"] < 0.5 * history[0]["val_loss"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert history[-1]["val_r2"] > 0.8
    assert {"val_rmse", "val_mae", "val_r2"} <= set(history[-1])


def test_classification_reports_accuracy_f1_auc(tmp_path):
    from trainflow.tables.sample import make_churn_table

    table = make_churn_table(3000, seed=5).rename_columns(
        ["row id" if c == "customer_id" else c for c in make_churn_table(1, 0).column_names]
    )
    result = _local_fit("classification", table, "churned", epochs=4, lr=0.005, tmp_path=tmp_path)
    last = result.return_value[-1]
    assert 0.6 < last["val_accuracy"] <= 1.0
    assert 0.6 < last["val_roc_auc"] <= 1.0
    assert 0.0 <= last["val_f1"] <= 1.0


def test_tabm_learns_the_regression_through_the_same_loop(tmp_path):
    model = {
        "type": "mlp",
        "architecture": "tabm",
        "tabm_k": 4,
        "hidden_sizes": [16, 16],
        "dropout": 0.0,
        "numeric_embedding": "none",
    }
    history = _local_fit(
        "regression", make_regression_table(1000), "target y", epochs=4, tmp_path=tmp_path, model=model
    ).return_value
    assert history[-1]["val_loss"] < 0.5 * history[0]["val_loss"] and history[-1]["val_r2"] > 0.6


def test_nan_loss_stops_with_the_epoch_named(tmp_path):
    table = make_regression_table(500)
    y = table["target y"].to_numpy().copy()
    y[:] = 1e30  # overflows float32 after standardisation -> inf loss at the first epoch
    result = _local_fit(
        "regression",
        table.set_column(4, "target y", [y * np.linspace(1, 1e9, len(y))]),
        "target y",
        epochs=3,
        lr=1e6,
        tmp_path=tmp_path,
    )
    assert "stop_reason" in result.metrics and "epoch 0" in result.metrics["stop_reason"]
    assert not math.isfinite(result.metrics["train_loss"])


@pytest.mark.parametrize("block_rows", [[1000], [300, 7, 500, 193], [5] * 200])
def test_minibatches_from_uneven_blocks_are_the_plain_slices(block_rows):
    # whole blocks in, batch_size slices out: the same mini-batches as slicing one in-memory array,
    # including those that straddle blocks and blocks smaller than a mini-batch
    n = sum(block_rows)
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    y = np.arange(n, dtype=np.float32)
    bounds = np.cumsum([0] + block_rows)
    ds = ray.data.from_arrow(
        [pa.table({FEATURES: ArrowTensorArray.from_numpy(x[a:b]), LABEL: y[a:b]}) for a, b in zip(bounds, bounds[1:])]
    )
    got = list(iter_minibatches(ds, 64, "cpu"))
    assert [len(yb) for _, yb in got] == [64] * (n // 64) + ([n % 64] if n % 64 else [])
    assert np.array_equal(np.concatenate([xb.numpy() for xb, _ in got]), x)
    assert np.array_equal(np.concatenate([yb.numpy() for _, yb in got]), y)


def test_early_stopping_ends_a_run_whose_metric_stopped_improving(tmp_path):
    # a label of pure noise: validation loss stops improving within a few epochs of the 60 allowed
    table = make_regression_table(1000)
    noise = np.random.default_rng(0).normal(size=table.num_rows)
    table = table.set_column(table.column_names.index("target y"), "target y", pa.array(noise))
    result = _local_fit(
        "regression",
        table,
        "target y",
        epochs=60,
        lr=0.01,
        tmp_path=tmp_path,
        checkpoint={"min_interval_s": 0},
        model={"type": "mlp", "numeric_embedding": "none"},
    )
    history = result.return_value
    losses = [h["val_loss"] for h in history]
    best = int(np.argmin(losses))
    assert len(history) < 60
    # it stopped exactly `patience` (auto: 10) epochs after the last improvement of more than min_delta
    assert len(history) - 1 - best <= 10 and all(v > min(losses) - 1e-4 for v in losses[best + 1 :])


def test_budget_gives_small_tables_steps_and_large_tables_full_batches():
    from trainflow.config import EarlyStoppingSection
    from trainflow.trainer.budget import EarlyStopping, resolve_budget
    from trainflow.trainer.families._torch import NetworkTrain

    train = NetworkTrain(early_stopping=EarlyStoppingSection())  # epochs, batch size and patience auto
    small, large = resolve_budget(train, 120, 2), resolve_budget(train, 5_000_000, 2)
    assert small.batch_size == 16 and small.limit == 300 and small.limit * small.steps_per_epoch >= 1000
    assert large.batch_size == 512 and large.limit == 10 and large.patience == 10
    # an explicit value always wins
    fixed = resolve_budget(
        NetworkTrain(epochs=7, batch_size=64, early_stopping=EarlyStoppingSection(patience="off", min_delta=0)), 120, 2
    )
    assert (fixed.batch_size, fixed.limit, fixed.patience) == (64, 7, None)
    # the early-stopping state is plain data that a resumed run loads and keeps counting from
    stopper = EarlyStopping("min", patience=2, min_delta=0.0)
    for epoch, value in enumerate([1.0, 0.5, 0.6]):
        stopper.update(value, epoch)
    resumed = EarlyStopping("min", patience=2, min_delta=0.0)
    resumed.load(stopper.state())
    assert not resumed.should_stop and (resumed.best, resumed.best_epoch, resumed.bad_epochs) == (0.5, 1, 1)
    resumed.update(0.7, 3)
    assert resumed.should_stop


def test_class_weights_balanced_like_sklearn_and_explicit():
    from sklearn.utils.class_weight import compute_class_weight

    from trainflow.preprocessors.tabular import TabularPreprocessor
    from trainflow.trainer.loop import class_weights
    from trainflow.config import TrainSection, config_from_dict

    prep = TabularPreprocessor(
        task="classification", label="y", classes=[0, 1, 2], class_counts={"0": 80, "1": 15, "2": 5}
    )
    y = np.repeat([0, 1, 2], [80, 15, 5])
    expected = compute_class_weight("balanced", classes=np.array([0, 1, 2]), y=y)
    np.testing.assert_allclose(class_weights(TrainSection(class_weight="balanced"), prep).numpy(), expected, rtol=1e-6)
    # YAML's integer keys name the classes too; a class left out weighs 1
    cfg = config_from_dict(
        {"data": {"path": "t.parquet", "label": "y"}, "task": "classification", "train": {"class_weight": {2: 4.0}}}
    )
    assert class_weights(cfg.train, prep).tolist() == [1.0, 1.0, 4.0]
    assert class_weights(TrainSection(), prep) is None


@pytest.mark.parametrize(
    "rows, batch_size", [(1000, 16), (10007, 256), (5000, 1024), (3, 16), (2048, 1024), (9000, 1000), (70_001, 1024)]
)
def test_a_cached_shard_visits_every_row_once_in_the_same_number_of_steps_whatever_the_seed(
    rows, batch_size, monkeypatch
):
    # DDP needs every rank to take the same number of steps: the shuffled order (runs of rows for large batches)
    # must not change the count from one rank's seed to another's
    from trainflow.trainer import loop
    from trainflow.trainer.loop import CachedShard

    monkeypatch.setattr(loop, "GATHER_BYTES", 2**16)  # several copies per epoch, as on a large table
    shard = CachedShard.__new__(CachedShard)
    shard.x, shard.y = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2), torch.arange(rows)
    orders = []
    for seed in range(6):
        batches = list(shard.minibatches(batch_size, torch.Generator().manual_seed(seed)))
        assert len(batches) == -(-rows // batch_size)
        assert all(len(y) == batch_size for _, y in batches[:-1])
        assert all(torch.equal(x[:, 0], y * 2) for x, y in batches)  # rows stay whole
        seen = torch.cat([y for _, y in batches]).tolist()
        assert sorted(seen) == list(range(rows))
        orders.append(seen)
    assert rows < 4 or len({tuple(o) for o in orders}) > 1  # a fresh order per seed


def test_report_schedule_groups_steps_and_keeps_the_best_one(monkeypatch):
    # one policy for epochs and boosting rounds: due at the last step or once min_interval_s has passed; a due report
    # covers the best step since the previous report first; rank 0's decision (the agree call) is what every rank does
    from trainflow.trainer import steps

    clock = [0.0]
    monkeypatch.setattr(steps.time, "monotonic", lambda: clock[0])
    decisions = []

    def agree(decision):
        decisions.append(decision)
        return decision

    schedule = steps.ReportSchedule(min_interval_s=5.0, start=0, agree=agree)
    reports = []
    for step in range(12):
        clock[0] += 1.0
        if schedule.due(step, last=step == 11):
            reports.append(schedule.to_report(step, best_step=2))
            schedule.reported_through(step)
    assert reports == [[2, 4], [9], [11]]  # every 5 s; the best step (2) reported before step 4, once only
    assert len(decisions) == 12  # decide_every_s 0: a decision per step
    # boosting rounds: a decision about every decide_every_s of training, the last round always decided
    resumed = steps.ReportSchedule(min_interval_s=0.0, start=100, agree=agree, decide_every_s=0.25)
    decisions.clear()
    due = []
    for step in range(100, 200):
        clock[0] += 0.01
        if resumed.due(step, last=step == 199):
            due.append(step)
            resumed.reported_through(step)
    assert due[-1] == 199 and 4 <= len(due) <= 8 and len(decisions) == len(due)
    assert resumed.to_report(150, best_step=99) == [
        150
    ]  # a best step inside the checkpoint resumed from is not reported again
    # with a deadline, rounds end at the first one that passes it, not up to decide_every_s (25 rounds here) later
    ends_at = clock[0] + 1.005
    limited = steps.ReportSchedule(
        min_interval_s=60.0, start=0, agree=agree, decide_every_s=0.25, deadline=lambda m: clock[0] + m >= ends_at
    )
    for step in range(1000):
        clock[0] += 0.01
        if limited.due(step, last=False) and limited.expired:
            break
    assert limited.expired and step == 100  # the round that ended at 1.01 s, the first past 1.005 s


def test_the_step_runner_reports_the_best_step_it_held_back_then_stops_early_or_at_the_deadline(monkeypatch, capsys):
    # every family's loop runs by trainer/steps.py: a due step's report is preceded by the best step since the last
    # report (its state captured when it was the best, not when reported); early stopping ends the run and says so;
    # a deadline ends it at the step it passed, reported with TIME_LIMITED; a family without a stopper (CatBoost, the
    # forest) gets no checkpoint reports from it, and limited_at says where its time ran out
    from types import SimpleNamespace

    from trainflow.trainer import steps
    from trainflow.trainer.budget import EarlyStopping
    from trainflow.trainer.deadline import TIME_LIMITED

    clock = [0.0]
    monkeypatch.setattr(steps.time, "monotonic", lambda: clock[0])
    loop_config = {"config": SimpleNamespace(checkpoint=SimpleNamespace(min_interval_s=5.0))}
    losses = [5.0, 4.0, 1.0, 3.0, 3.5, 3.2, 3.1, 3.3, 3.4]
    history, reports, captured = [], [], []
    runner = steps.Steps(loop_config, "epoch", 0, 20, history, EarlyStopping("min", 4, 0.0))

    def capture(step):
        captured.append(step)
        return f"state of {step}"

    for step, loss in enumerate(losses):
        clock[0] += 1.0
        row = {"epoch": step, "val_loss": loss}
        report = lambda state, at, limited: reports.append((at, state, limited))  # noqa: E731
        if runner.after(step, row, report, lambda step=step: capture(step)):
            break
    # due at 5 s (step 4): the best (2) first with the state taken at step 2, then step 4; step 6 the 4th round
    # without improvement: the last, reported
    assert reports == [(2, "state of 2", False), (4, "state of 4", False), (6, "state of 6", False)]
    assert captured == [0, 1, 2, 4, 6] and len(history) == 7 and runner.finished
    assert "trainflow early stopping at epoch 6: val_loss has not improved for 4 epoch(s); best 1 at epoch 2" in (
        capsys.readouterr().out
    )

    # the deadline: passed once the clock reaches 3 s
    monkeypatch.setattr(steps, "rank_zero_deadline", lambda loop_config, rank: lambda next_s: clock[0] >= 3.0)
    clock[0], reports = 0.0, []
    runner = steps.Steps(loop_config, "round", 0, 20, [], EarlyStopping("min", None, 0.0))
    ended = []
    for step in range(20):
        clock[0] += 1.0
        report = lambda state, at, limited: reports.append(runner.limited({"epoch": at}, at, limited))  # noqa: E731
        if runner.after(step, {"epoch": step, "val_loss": 1.0 / (step + 1)}, report):
            ended.append(step)
            break
    assert ended == [2] and reports == [{"epoch": 2, TIME_LIMITED: 2}] and runner.limited_at == 2
    assert "stopping after round 2 with the best so far" in capsys.readouterr().out
    # no stopper: progress only (session.report of the row, outside Ray Train here: recorded), the family reports
    # its one checkpoint itself
    progress = []
    monkeypatch.setattr(steps.session, "report", lambda metrics, **kw: progress.append(metrics["epoch"]))
    clock[0] = 0.0
    runner = steps.Steps(
        {"config": SimpleNamespace(checkpoint=SimpleNamespace(min_interval_s=0.0))}, "tree round", 0, 8, []
    )
    for step in range(8):
        clock[0] += 1.0
        if runner.after(step, {"epoch": step}, next_step_s=1.0):
            break
    assert progress == [0, 1, 2] and runner.limited_at == 2  # the deadline (3 s) passed at step 2: its row the last


def test_every_fit_of_a_process_shares_one_progress_queue_and_gets_only_its_own_reports_in_order():
    """Two watches at once (a sweep's trials, a retrain's next family starting) on one queue actor: each gets its
    own reports, in the order they were put, every one before its block returns; a later watch reuses the queue;
    no thread is left waiting on the queue once no fit is watched."""
    import threading

    from trainflow.trainer import progress

    got: dict[str, list[int]] = {"a": [], "b": []}

    def fit(name: str, callback) -> None:  # what Ray Train's controller does with the callback
        for epoch in range(40):
            callback.after_report(None, [{"epoch": epoch, "name": name}], None)

    queues = []
    with progress.watch_progress(lambda m: got["a"].append(m["epoch"]), poll_s=0.05) as a:
        with progress.watch_progress(lambda m: got["b"].append(m["epoch"]), poll_s=0.05) as b:
            queues += [a.queue.actor, b.queue.actor]
            threads = [threading.Thread(target=fit, args=(n, c)) for n, c in (("a", a), ("b", b))]
            [t.start() for t in threads]
            [t.join() for t in threads]
        assert got["b"] == list(range(40))  # all of b's, before b's block ended
    assert got["a"] == list(range(40))
    with progress.watch_progress(lambda m: None) as c:
        queues.append(c.queue.actor)
    assert len({q._actor_id for q in queues}) == 1
    # between fits no thread waits on Ray: one blocked in ray.get when Ray shuts down (a process's exit, a test's
    # ray.shutdown) crashes the process
    assert [t for t in threading.enumerate() if t.name == "trainflow-progress"] == []
