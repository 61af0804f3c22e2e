"""Scaling knobs: config validation, the pre-start resource check, and what reaches Ray Train."""

import pytest
import ray.data

from trainflow.preprocessors.tabular import TabularPreprocessor
from trainflow.trainer.resources import check_fits, worker_bundle, workers_that_fit
from trainflow.trainer.runner import build_trainer
from trainflow.config import config_from_dict
from trainflow.errors import ConfigError

LAPTOP = [{"CPU": 2.0, "memory": 8e9}]
GPU_BOX = [{"CPU": 16.0, "GPU": 1.0, "accelerator_type:H100": 1.0}]
CLUSTER = [
    {"CPU": 8.0, "GPU": 4.0, "accelerator_type:A100": 1.0},
    {"CPU": 8.0, "GPU": 4.0, "accelerator_type:A100": 1.0},
]


def _cfg(**scaling):
    return config_from_dict(
        {
            "data": {"path": "t.parquet", "label": "y"},
            "task": "regression",
            "model": {"type": "mlp"},
            "scaling": scaling,
        }
    )


def test_worker_bundle_follows_ray_train_defaults():
    assert worker_bundle({"num_workers": 2}) == {"CPU": 1.0}
    assert worker_bundle({"num_workers": 2, "use_gpu": True}) == {"CPU": 1.0, "GPU": 1.0}
    assert worker_bundle({"use_gpu": True, "resources_per_worker": {"CPU": 2, "GPU": 0.5}}) == {"CPU": 2.0, "GPU": 0.5}
    assert worker_bundle({"accelerator_type": "A100", "use_gpu": True})["accelerator_type:A100"] > 0


@pytest.mark.parametrize(
    ("scaling", "nodes", "fit"),
    [
        ({"num_workers": 2}, LAPTOP, 2),
        ({"resources_per_worker": {"CPU": 2}}, LAPTOP, 1),
        ({"use_gpu": True}, LAPTOP, 0),
        ({"use_gpu": True, "resources_per_worker": {"CPU": 1, "GPU": 0.5}}, GPU_BOX, 2),  # two workers share one GPU
        ({"use_gpu": True, "accelerator_type": "A100"}, GPU_BOX, 0),
        ({"use_gpu": True, "accelerator_type": "A100"}, CLUSTER, 8),
        ({"resources_per_worker": {"CPU": 1, "HPU": 1}}, CLUSTER, 0),
    ],
)
def test_workers_that_fit(scaling, nodes, fit):
    assert workers_that_fit(worker_bundle(scaling), nodes) == fit


def test_check_fits_names_the_numbers():
    with pytest.raises(
        ConfigError, match=r"asks for 4 worker\(s\) x \(CPU 1\) but this cluster can place only 2 \(node 0: CPU 2\)"
    ):
        check_fits({"num_workers": 4}, nodes=LAPTOP)
    with pytest.raises(ConfigError, match="No node has a GPU"):
        check_fits({"num_workers": 1, "use_gpu": True}, nodes=LAPTOP)
    with pytest.raises(ConfigError, match=r"accelerator type 'A100' \(types present: \['H100'\]\)"):
        check_fits({"num_workers": 1, "use_gpu": True, "accelerator_type": "A100"}, nodes=GPU_BOX)
    check_fits({"num_workers": 2, "use_gpu": True, "resources_per_worker": {"GPU": 0.5}}, nodes=GPU_BOX)
    check_fits({"num_workers": 64, "wait_for_resources": True}, nodes=LAPTOP)  # an autoscaler may add nodes
    check_fits({"num_workers": 0}, nodes=LAPTOP)  # local mode asks for nothing
    # elastic: the run can start once min fit; fewer than min is refused before training, naming both
    check_fits({"num_workers": [2, 8]}, nodes=LAPTOP)
    with pytest.raises(
        ConfigError, match=r"asks for at least 3 worker\(s\) x \(CPU 1\) but this cluster can place only 2"
    ):
        check_fits({"num_workers": [3, 8]}, nodes=LAPTOP)


def test_an_elastic_worker_count_is_a_range_passed_to_ray_and_a_resize_keeps_the_global_batch():
    from trainflow.trainer.budget import resolve_budget
    from trainflow.trainer.families._torch import network_train_section
    from trainflow.trainer.runner import scaling_config

    elastic = _cfg(num_workers=[1, 4], elastic_resize_monitor_interval_s=5)
    assert (elastic.scaling.min_workers, elastic.scaling.max_workers, elastic.scaling.workers_label) == (1, 4, "[1, 4]")
    ray_scaling = scaling_config(elastic.scaling)
    assert ray_scaling.num_workers == (1, 4) and ray_scaling.elastic_resize_monitor_interval_s == 5
    assert _cfg(num_workers=[3, 3]).scaling.num_workers == 3  # fixed
    for bad in ([0, 2], [3, 2], [1, 2, 3]):
        with pytest.raises(ConfigError, match=r"scaling.num_workers: an elastic worker count is \[min, max\]"):
            _cfg(num_workers=bad)
    # the budget of 4 workers whatever the group has: same steps per epoch and epochs, the per-worker batch grows
    train = network_train_section(elastic)
    planned = resolve_budget(train, 100_000, 4)
    for workers in (4, 2, 1):
        b = resolve_budget(train, 100_000, 4, workers)
        assert (b.steps_per_epoch, b.limit, b.batch_size * workers) == (
            planned.steps_per_epoch,
            planned.limit,
            planned.batch_size * 4,
        )


def test_a_resize_shows_in_the_progress_line_and_its_cause_is_named():
    from trainflow.trainer.progress import ProgressLine
    from trainflow.trainer.recovery import resizes

    line = ProgressLine("mlp", 10)
    assert "workers]" not in line({"epoch": 0, "val_loss": 0.5, "workers": 2})
    assert line({"epoch": 1, "val_loss": 0.4, "workers": 1}).endswith("[2 -> 1 workers]")
    assert "workers]" not in line({"epoch": 2, "val_loss": 0.3, "workers": 1})
    a, b, c = "a" * 56, "b" * 56, "c" * 56
    events = [
        {"time": 1, "event": "attempt", "workers": 2, "nodes": [a, b]},
        {"time": 2, "event": "error", "error": "worker 1: ActorDiedError"},
        {"time": 3, "event": "restart", "preempted": False, "nodes": [a, b], "draining": []},
        {"time": 4, "event": "attempt", "workers": 1, "nodes": [a]},
        {"time": 5, "event": "worker_start", "rank": 0, "from_epoch": 3},
        {"time": 6, "event": "resize_check", "workers": 2},
        {"time": 7, "event": "attempt", "workers": 2, "nodes": [a, c]},
        {"time": 8, "event": "worker_start", "rank": 0, "from_epoch": 5},
        {"time": 9, "event": "preemption", "nodes": [c]},
        {"time": 10, "event": "restart", "preempted": True, "nodes": [a, c], "draining": [c]},
        {"time": 11, "event": "attempt", "workers": 1, "nodes": [a]},
        {"time": 12, "event": "worker_start", "rank": 0, "from_epoch": 7},
    ]
    died, grew, drained = resizes(events, {b: {"state": "dead", "reason": "health check failed"}})
    assert (died["from"], died["to"], died["epoch"]) == (2, 1, 3)
    assert died["why"].startswith(f"node {b[:12]} died (health check failed)")
    assert grew["epoch"] == 5 and grew["why"] == "capacity returned: a resize check found room for 2 worker(s)"
    assert drained["epoch"] == 7 and drained["why"].startswith(f"node {c[:12]} drained (a preemption)")


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        ({"trainer_resources": {"CPU": 1}}, "scaling: trainer_resources is not supported: Ray 2.60"),
        ({"resources_per_worker": {"GPU": 1}}, "use_gpu is false"),
        ({"backend": "nccl"}, "backend: nccl needs GPUs"),
        (
            {"backend": "nccl", "use_gpu": True, "num_workers": 2, "resources_per_worker": {"GPU": 0.5}},
            "NCCL refuses two ranks on one device",
        ),
        ({"backend": "mpi"}, "scaling.backend"),
        ({"placement_strategy": "ANYWHERE"}, "scaling.placement_strategy"),
        ({"resources_per_worker": {"CPU": -1}}, "must be >= 0"),
    ],
)
def test_scaling_config_errors(scaling, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _cfg(**scaling)


@pytest.mark.usefixtures("ray_local")
def test_every_knob_reaches_ray_train(tmp_path):
    cfg = _cfg(
        num_workers=2,
        use_gpu=True,
        resources_per_worker={"CPU": 2, "GPU": 0.5, "memory": 1e9},
        accelerator_type="A100",
        placement_strategy="SPREAD",
        env_vars={"NCCL_SOCKET_IFNAME": "lo"},
    ).model_copy(update={"storage_path": str(tmp_path)})

    def scaled(**changes):
        return cfg.model_copy(update={"scaling": cfg.scaling.model_copy(update=changes)})

    prep = TabularPreprocessor(
        task="regression", label="y", numeric={"a": {"mean": 0.0, "std": 1.0}}, feature_order=["a"]
    )
    ds = ray.data.range(4)  # lazy: nothing runs
    trainer = build_trainer(cfg, prep, ds, ds, "knobs")
    sc = trainer.scaling_config
    assert (sc.num_workers, sc.use_gpu, sc.accelerator_type, sc.placement_strategy) == (2, True, "A100", "SPREAD")
    assert sc.resources_per_worker == {"CPU": 2, "GPU": 0.5, "memory": 1e9}
    # two workers at half a GPU share one device, which NCCL refuses: Gloo instead of Ray's default
    assert trainer.backend_config.backend == "gloo"
    assert trainer.run_config.worker_runtime_env == {"env_vars": {"NCCL_SOCKET_IFNAME": "lo"}}
    # a drained node's restarts on their own budget, with the survivors' grace period (Ray's defaults unless set)
    fc = trainer.run_config.failure_config
    assert (fc.max_failures, fc.max_preemption_failures, fc.preemption_grace_s) == (2, -1, 0.0)
    spot = cfg.model_copy(
        update={"failure": cfg.failure.model_copy(update={"max_preemption_failures": 5, "preemption_grace_s": 30.0})}
    )
    fc = build_trainer(spot, prep, ds, ds, "knobs").run_config.failure_config
    assert (fc.max_preemption_failures, fc.preemption_grace_s, fc.controller_failure_limit) == (5, 30.0, 3)
    # Ray's default with GPUs
    assert (
        build_trainer(scaled(resources_per_worker={"CPU": 2, "GPU": 1}), prep, ds, ds, "knobs").backend_config.backend
        == "nccl"
    )
    cpu = {"use_gpu": False, "resources_per_worker": None, "accelerator_type": None}
    assert build_trainer(scaled(**cpu, backend="gloo"), prep, ds, ds, "knobs").backend_config.backend == "gloo"
    assert (
        build_trainer(scaled(**cpu, backend=None), prep, ds, ds, "knobs").backend_config.backend == "gloo"
    )  # Ray's default without
    # the Ray trainflow started itself carries its Train settings in its processes' environment from their start: its
    # few workers polled every 0.05 s (a cluster's at 0.5 s), the preemption watcher off, Ray Data's loop paced; no
    # job runtime_env (each worker process would start through Ray's runtime-env wrapper, another Python start)
    import os

    from trainflow.run.runtime import SETUP_HOOK_ENV

    names = ("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", SETUP_HOOK_ENV)
    seen = ray.get(ray.remote(lambda: [os.environ.get(k) for k in names]).remote())
    assert seen == ["0.05", "0", "trainflow.pacing.setup"]
    assert ray.get_runtime_context().runtime_env == {}
    assert not any(os.environ.get(k) for k in names)  # the driver's own environment as it was


def test_a_small_one_split_table_trains_each_family_in_one_worker_unless_the_worker_count_is_set():
    from trainflow.roles.folds import AUTO_FOLD_ROWS, ONE_WORKER_ROWS
    from trainflow.tasks.cross_fit import train_config

    def workers(cfg, rows, folds=1):
        return train_config(cfg, rows, folds).scaling.num_workers

    unset = _cfg()
    assert (workers(unset, ONE_WORKER_ROWS), workers(unset, ONE_WORKER_ROWS + 1)) == (1, 2)
    assert workers(_cfg(num_workers=2), 1_000) == 2 and workers(_cfg(num_workers=[1, 3]), 1_000) == [1, 3]
    # cross-fitted: fold_config's rule (one worker up to AUTO_FOLD_ROWS rows whatever the config says)
    assert (workers(_cfg(num_workers=2), AUTO_FOLD_ROWS, 5), workers(unset, AUTO_FOLD_ROWS + 1, 5)) == (1, 2)
    # unset stays unset through the dict round trips of the Python API, a replay and a handover with overrides
    assert workers(config_from_dict(unset.as_given()), 1_000) == 1
    assert workers(config_from_dict(_cfg(num_workers=2).as_given()), 1_000) == 2
