"""Shared pieces of the fault-injection tests: a small run, a train function that fails on purpose."""

import json
import os
import time
from pathlib import Path
from typing import Callable

import ray.data
import torch

from tests.conftest import make_regression_table
from trainflow.trainer.loop import train_fn_per_worker
from trainflow.config import config_from_dict, trial_config
from trainflow.preprocessors.fit import fit_and_pack
from trainflow.tables.files import table_spec

EPOCHS = 4


def checkpoint_registered(run: Path, epoch: int = 0, family: str | None = None) -> bool:
    """Ray's controller has recorded this run's checkpoint of `epoch` or a later one (what a restart resumes from);
    family: of that family, in a run several families share."""
    try:
        results = json.loads((Path(run) / "checkpoint_manager_snapshot.json").read_text()).get("checkpoint_results")
    except (OSError, ValueError):
        return False
    return any(
        r.get("metrics", {}).get("epoch", -1) >= epoch and r["metrics"].get("family") == family for r in results or []
    )


def wait_fold_registered(
    run: str | Path, fold: int, family: str | None = None, timeout_s: float = 60.0, epoch: int = 0
) -> None:
    """In a worker of a fold run: block until the controller has registered a checkpoint of fold (of family, in a run
    several families share) of epoch or a later one, so that a restart resumes that fold from it."""
    deadline = time.monotonic() + timeout_s
    snapshot = Path(run) / "checkpoint_manager_snapshot.json"
    while time.monotonic() < deadline:
        try:
            results = json.loads(snapshot.read_text()).get("checkpoint_results") or []
        except (OSError, ValueError):
            results = []
        if any(
            r.get("metrics", {}).get("fold") == fold
            and r["metrics"].get("family") == family
            and r["metrics"].get("epoch", -1) >= epoch
            for r in results
        ):
            return
        time.sleep(0.1)


def wait_registered(
    run: str | Path,
    epoch: int = 0,
    timeout_s: float = 60.0,
    alive: Callable[[], bool] | None = None,
    family: str | None = None,
) -> None:
    """Block until the controller has registered the checkpoint of `epoch` (in a worker, or in a test
    watching a run, where `alive` says whether the run is still going); family: of that family, in a shared run."""
    deadline = time.monotonic() + timeout_s
    while not checkpoint_registered(Path(run), epoch, family):
        if alive is not None and not alive():
            raise AssertionError(f"the run ended before a checkpoint of epoch {epoch} was registered under {run}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no checkpoint of epoch {epoch} registered under {run} after {timeout_s:g} s")
        time.sleep(0.1)


def train_worker_pids(address: str) -> list[int]:
    """PIDs of the live Ray Train worker processes of the Ray at address: this test's own, never those of another
    Ray on the machine (the other pytest-xdist worker's fits; a scan of /proc for the actor's name killed them)."""
    from ray.util.state import list_actors

    found = list_actors(address=address, filters=[("state", "=", "ALIVE"), ("class_name", "=", "RayTrainWorker")])
    return [a.pid for a in found if a.pid]


def small_run(tmp_path, hang_timeout_s=600.0, resources_per_worker=None, max_failures=2):
    """A 2-worker regression run on 1200 rows: (config, preprocessor, train, val), datasets materialized."""
    table = make_regression_table(1200)
    cfg = config_from_dict(
        {
            "data": {"path": "mem", "label": "target y", "id_column": "row id"},
            "task": "regression",
            # periodic numeric embeddings give the network buffers: its validation must not go through DDP's forward,
            # whose buffer broadcast the two ranks' unequal validation shards would call unequally often (a deadlock)
            "model": {
                "type": "mlp",
                "params": {
                    "mlp": {"numeric_embedding": "periodic", "epochs": EPOCHS, "batch_size": 64, "learning_rate": 0.01}
                },
            },
            "train": {"folds": 1},
            "scaling": {"num_workers": 2, "resources_per_worker": resources_per_worker},
            "checkpoint": {"num_to_keep": 2},
            "failure": {"max_failures": max_failures, "hang_timeout_s": hang_timeout_s},
            "storage_path": str(tmp_path / "runs"),
        },
        base_dir=tmp_path,
    )
    train, val = ray.data.from_arrow(table.slice(0, 1000)), ray.data.from_arrow(table.slice(1000))
    return cfg, *fit_and_pack(train, val, table_spec(table.schema, cfg.data, "regression", "mem"), "regression")


def fit_here(cfg, *args, keep=None, **kwargs):
    """build_trainer(cfg, *args, local=True, **kwargs) fitted in Ray Train's local mode as the train task fits one
    (trainer/runner.py fit_reports: checkpoints written into the run's folder): its Result as a worker group's fit
    gives it (best_checkpoints, the newest checkpoint). For the tests of what a fit trains and keeps, where no worker
    dies: a worker group's start is about 12 s here, a local fit's none."""
    from trainflow.trainer.runner import build_trainer, fit_reports, local_result, run_dir

    path = run_dir(cfg, args[3])
    with fit_reports(path, lambda metrics: None, True):
        result = build_trainer(cfg, *args, local=True, **kwargs).fit()
    return local_result(result, [path], keep, cfg.checkpoint.metric, cfg.checkpoint.mode)


def pyfunc_serves_as_the_checkpoint(checkpoint, served, family: str, tracking_uri: str) -> list[str]:
    """Register checkpoint as trainflow registers every family's (MLflow's pyfunc model over the shipped serving
    code, its requirements pinned) and check that the loaded pyfunc model's predictions on 50 new rows of the
    regression table are served's (its load_servable); the requirements it was logged with."""
    import mlflow
    import numpy as np

    from trainflow.run.tracking import ensure_experiment, tracking
    from trainflow.tasks.model_package import MODEL_CODE, requirements

    reqs = requirements([family])
    with checkpoint.as_directory() as d:
        with tracking(tracking_uri):
            with mlflow.start_run(experiment_id=ensure_experiment(tracking_uri, family)):
                info = mlflow.pyfunc.log_model(
                    name="model", python_model=MODEL_CODE, artifacts={"checkpoint": d}, pip_requirements=reqs
                )
            table = make_regression_table(50, seed=3)
            got = mlflow.pyfunc.load_model(info.model_uri).predict(table.to_pandas())
    expected = served.preprocessor.decode_predictions(
        served.predict(served.preprocessor.transform_features(table)), None
    )
    np.testing.assert_allclose(got["prediction"].to_numpy(), expected["prediction"], rtol=1e-5)
    return reqs


# no plain SIGKILL here: the hang ends in one (the watchdog kills its own worker), and a SIGKILLed worker is
# resumed in tests/test_families.py (booster) and tests/test_retry_exhausted.py (flow)
SUCCESSIVE = ("raise", "hang")


def successive_faults(marker_dir: str, fold: int = 1):
    """The network's loop per fold, whose attempt a (a < 2) at `fold` trains that fold's epoch a, then fails inside
    epoch a+1 with SUCCESSIVE[a] once the controller has registered epoch a's checkpoint (what the restart resumes
    from). Attempt 0 raises in epoch 1, attempt 1 hangs in epoch 2 (only the watchdog ends it, with a SIGKILL of its
    own process); attempt 2 finishes. The other folds train as they would.
    """

    def train_fn(loop_config):
        rank = ray.train.get_context().get_world_rank()
        if loop_config["fold"] != fold:
            return train_fn_per_worker(loop_config)
        attempt = len(list(Path(marker_dir).glob(f"attempt-*-rank{rank}")))
        (Path(marker_dir) / f"attempt-{attempt}-rank{rank}").touch()
        if attempt >= len(SUCCESSIVE):
            return train_fn_per_worker(loop_config)
        upto = {
            **loop_config,
            "config": trial_config(loop_config["config"].to_dict(), {"model.params.mlp.epochs": attempt + 1}),
        }
        train_fn_per_worker(upto)
        if rank == 1:
            wait_fold_registered(loop_config["deadline_dir"], fold, epoch=attempt)
            if SUCCESSIVE[attempt] == "hang":
                time.sleep(3600)
            raise RuntimeError(f"injected failure in fold {fold}, epoch {attempt + 1}")
        ray.train.report({"epoch": attempt + 1, "waiting": 1.0})  # blocks until the group is torn down
        return None

    return train_fn


def stall_after_blocks(batch: dict, marker: str, passes: int) -> dict:
    """A Ray Data map that passes its first `passes` blocks (a streamed epoch's worth: every worker trains a step),
    then never returns: a pipeline that stops producing blocks, as a streaming executor starved of object-store
    memory does. (A worker that never trained a step is still in start-up, which the hang watchdog allows at least
    HANG_FIRST_S, 120 s, whatever failure.hang_timeout_s says.)"""
    for i in range(passes):
        try:
            os.close(os.open(f"{marker}-{i}", os.O_CREAT | os.O_EXCL))  # one block per marker, across processes
            return batch
        except FileExistsError:
            continue
    time.sleep(3600)
    return batch


class HeldNet(torch.nn.Module):
    """A user's module (model.type torch) whose training steps each wait pause_s while the file `hold` exists: a
    run kept at a slow pace (its steps still progress, so no watchdog calls it hung) for as long as a test needs,
    then training at full speed once the test removes the file."""

    def __init__(self, in_features: int, out_features: int, hold: str, pause_s: float = 0.3, hidden: int = 32):
        super().__init__()
        self.hold, self.pause_s = hold, pause_s
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(in_features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, out_features)
        )

    def forward(self, x):
        if self.training and os.path.exists(self.hold):
            time.sleep(self.pause_s)
        return self.layers(x)
