"""RealMLP (trainer/families/realmlp_family.py), the family that landed as one file and one entry-point line: its keys
validated under model.params.realmlp, its recipe's optimizer and schedules, data-parallel training across two Ray
Train workers, a checkpoint served through MLflow's pyfunc model, and a resume that loses nothing. (A lost worker's
restart is the torch loop's, the same as the network's: tests/test_faults.py.)"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import ray

from tests.faults import pyfunc_serves_as_the_checkpoint, small_run
from trainflow.config import config_from_dict, trial_config
from trainflow.errors import ConfigError
from trainflow.trainer.recovery import read_events
from trainflow.trainer.runner import build_trainer, run_dir
from trainflow.trainer.serving.checkpoint import read_metrics
from trainflow.trainer.serving.servable import load_servable

EPOCHS = 12
# the recipe at a smaller width (the same code, cheaper steps), a checkpoint per epoch
SMALL = {
    "model.type": "realmlp",
    "model.params.realmlp.n_epochs": EPOCHS,
    "model.params.realmlp.batch_size": 64,
    "model.params.realmlp.hidden_width": 64,
    "checkpoint.min_interval_s": 0.0,
    "checkpoint.num_to_keep": EPOCHS,
}


def _cfg(**model):
    return config_from_dict(
        {"data": {"path": "x.parquet", "label": "y"}, "task": "classification", "model": {"type": "realmlp", **model}}
    )


def test_its_keys_live_under_its_block_and_its_recipe_sets_the_train_section_optimizer_and_schedules():
    import torch

    from trainflow.trainer.families import family_named

    family = family_named("realmlp")
    cfg = _cfg(params={"realmlp": {"n_epochs": 12, "p_drop": 0.3}}).for_family("realmlp")
    train = family.train_section(cfg)
    # the recipe's numbers (RealMLP-TD, classification) in the train section the loop reads
    assert (train.epochs, train.batch_size, train.learning_rate, train.weight_decay, train.label_smoothing) == (
        12,
        256,
        0.04,
        0.02,
        0.1,
    )
    assert train.early_stopping.patience == "off"  # the best of every epoch is kept
    with pytest.raises(ConfigError, match="model.params.realmlp.p_drop"):
        _cfg(params={"realmlp": {"p_drop": 1.5}})
    with pytest.raises(ConfigError, match="model.params.realmlp.patience"):
        _cfg(params={"realmlp": {"patience": 0}})
    assert (
        family.train_section(_cfg(params={"realmlp": {"patience": 20}}).for_family("realmlp")).early_stopping.patience
        == 20
    )
    with pytest.raises(ConfigError, match="num_leaves"):
        _cfg(params={"realmlp": {"num_leaves": 15}})
    # a run's epochs are not part of what its weights depend on: a resume may extend them
    assert _cfg(params={"realmlp": {"n_epochs": 12}}).training_hash("realmlp") == _cfg().training_hash("realmlp")
    assert _cfg(params={"realmlp": {"lr": 0.01}}).training_hash("realmlp") != _cfg().training_hash("realmlp")

    class Prep:  # what the network reads of a fitted preprocessor: 3 continuous values, a one-hot pair, 1 code
        task, num_features, num_outputs = "classification", 6, 2

        def embedding_slots(self):
            return [(5, 7, 4)]

        def continuous_positions(self):
            return [0, 1, 2]

    model = family.build(Prep(), cfg.model.model_dump(mode="json"))
    optimizer, schedule = family.optimizer(model, train, 100)
    assert {g["lr"] for g in optimizer.param_groups} == {0.0}  # coslog4 starts at 0
    assert {round(g["initial_lr"] / 0.04, 6) for g in optimizer.param_groups} == {6.0, 1.0, 0.1}
    assert all(g["betas"] == (0.9, 0.95) for g in optimizer.param_groups)
    # the scaling comes from the first training batch, once
    x = torch.randn(64, 6)
    x[:, 5] = torch.randint(0, 7, (64,)).float()
    model.train()
    model(x)
    assert int(model.initialized) == 1 and not torch.equal(model.scale, torch.ones_like(model.scale))
    scale = model.scale.clone()
    wider = x.clone()
    wider[:, :5] *= 10
    for _ in range(60):  # past the middle: the weight decay and the dropout fall (flat, then cosine)
        optimizer.zero_grad()
        model(wider).square().mean().backward()
        optimizer.step()
        schedule.step()
    assert torch.equal(model.scale, scale)
    dropout = next(m for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert 0 < dropout.p < 0.3
    [decay] = {round(g["weight_decay"] / g["wd_factor"], 6) for g in optimizer.param_groups if g["wd_factor"]}
    assert 0 < decay < 0.02


def test_auto_trains_it_in_the_networks_place_when_given_a_time_limit_in_seconds():
    from trainflow.config import AUTO_FAMILIES

    base = {"data": {"path": "x.parquet", "label": "y"}, "task": "classification"}
    assert "mlp" in AUTO_FAMILIES and "realmlp" not in AUTO_FAMILIES  # the default run's cost stays the network's
    for limit in ("auto", "off"):
        assert config_from_dict({**base, "train": {"time_limit": limit}}).model.families == list(AUTO_FAMILIES)
    timed = config_from_dict({**base, "train": {"time_limit": 180}})
    assert timed.model.auto and "realmlp" in timed.model.families and "mlp" not in timed.model.families
    # last in both orders: the slowest family takes what the boosters leave
    assert timed.model.training_order(5)[-1] == "realmlp" and timed.model.training_order(1)[-1] == "realmlp"
    # still auto's choice when the keys given are read back (a resume, a trial)
    again = config_from_dict(timed.as_given())
    assert again.model.auto and again.model.families == timed.model.families
    # its keys apply when auto trains it; a family auto leaves out for the time limit is named with why
    tuned = config_from_dict({**base, "train": {"time_limit": 180}, "model": {"params": {"realmlp": {"lr": 0.01}}}})
    assert tuned.model.for_family("realmlp")["params"]["lr"] == 0.01
    with pytest.raises(ConfigError, match=r"model.params.realmlp: .*\(auto trains it with train.time_limit in sec"):
        config_from_dict({**base, "model": {"params": {"realmlp": {"lr": 0.01}}}})
    with pytest.raises(ConfigError, match=r"model.dropout: .*\(auto trains it unless train.time_limit is in sec"):
        config_from_dict({**base, "train": {"time_limit": 60}, "model": {"params": {"mlp": {"dropout": 0.1}}}})


@pytest.mark.e2e
@pytest.mark.usefixtures("ray_local")
def test_two_workers_train_it_data_parallel_and_pyfunc_serves_it(tmp_path):

    from trainflow.preprocessors.tabular import FEATURES, LABEL
    from trainflow.trainer.metrics import compute_metrics

    cfg, prep, train, val = small_run(tmp_path, max_failures=0)
    cfg = trial_config(cfg.to_dict(), {**SMALL, "mlflow.tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"})
    result = build_trainer(cfg, prep, train, val, "rm").fit()
    events = read_events(run_dir(cfg, "rm"))
    assert [e["workers"] for e in events if e["event"] == "attempt"] == [2]  # one worker group of two, DDP
    assert sorted(e["rank"] for e in events if e["event"] == "worker_start") == [0, 1]
    with result.checkpoint.as_directory() as d:
        history = read_metrics(d)["history"]
        served = load_servable(d)
    assert [h["epoch"] for h in history] == list(range(len(history)))
    assert served.family == "realmlp" and int(served.predict.model.initialized) == 1
    # the reported figures are the served network's on the validation rows, and it learned
    packed = pa.concat_tables(ray.get(val.to_arrow_refs()))
    x, y = np.stack(packed[FEATURES].to_numpy(zero_copy_only=False)), packed[LABEL].to_numpy()
    again = compute_metrics("regression", served.predict(x.astype(np.float32)), y.astype(np.float32), prep)
    assert again["val_r2"] == pytest.approx(result.metrics["val_r2"], rel=1e-4) and again["val_r2"] > 0.5
    # registered as every family is: MLflow's pyfunc model serves the same predictions, with no package of its own
    reqs = pyfunc_serves_as_the_checkpoint(result.checkpoint, served, "realmlp", cfg.mlflow.tracking_uri)
    assert not [r for r in reqs if r.split("==")[0] in ("pytabkit", "pytorch-lightning")]


@pytest.mark.usefixtures("ray_local")
def test_a_fit_cut_after_an_epoch_resumes_to_the_same_weights_as_one_never_cut(tmp_path):
    """Its resume state is whole: the weights, the scaling taken from the first batch, AdamW's moments per parameter
    group, the schedule's step (learning rate, weight decay, dropout): a fit stopped after epoch 3 and run again ends
    bit for bit where an uninterrupted one does (in Ray Train's local mode, as a small table trains)."""
    import torch

    from trainflow.trainer.runner import fit_reports, local_checkpoints
    from trainflow.trainer.serving.checkpoint import load_weights

    cfg, prep, train, val = small_run(tmp_path)
    cfg = trial_config(cfg.to_dict(), {**SMALL, "scaling.num_workers": 1, "scaling.local_mode": True})

    def fit(name: str, cut_at: int | None = None) -> dict:
        path = run_dir(cfg, name)

        def on_report(metrics: dict) -> None:
            if metrics["epoch"] == cut_at:
                raise RuntimeError(f"cut after epoch {cut_at}")

        for attempt in range(2):
            try:
                with fit_reports(path, on_report if attempt == 0 else lambda m: None, True) as callbacks:
                    build_trainer(cfg, prep, train, val, name, callbacks=callbacks, local=True).fit()
                break
            except RuntimeError as exc:
                assert attempt == 0 and "cut after epoch" in str(exc)
        [(newest, metrics)] = local_checkpoints([path])[-1:]
        assert metrics["epoch"] == EPOCHS - 1
        with newest.as_directory() as d:
            assert [h["epoch"] for h in read_metrics(d)["history"]] == list(range(EPOCHS))
            return load_weights(d)

    whole, resumed = fit("whole"), fit("cut", cut_at=3)
    assert [e["epoch"] for e in read_events(run_dir(cfg, "cut")) if e["event"] == "resume"] == [4]
    assert whole.keys() == resumed.keys() and all(torch.equal(whole[k], resumed[k]) for k in whole)
