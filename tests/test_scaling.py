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
    # the Ray trainflow started itself carries its Train settings: its few workers polled every 0.2 s (a cluster's
    # at 0.5 s), the preemption watcher off
    job_env = ray.get_runtime_context().runtime_env.get("env_vars", {})
    assert job_env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.2"
    assert job_env["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "0"
