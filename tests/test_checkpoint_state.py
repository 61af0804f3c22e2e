"""Checkpoint state is checked when it is read, and outputs before they are committed: every edited or out-of-range
number a review planted in a checkpoint folder is refused naming its file, sizes are refused before anything is
allocated, a batch with a non-finite output is never written, and what was checked is what is scored."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import tiny_checkpoint, tiny_preprocessor, tiny_table
from trainflow.errors import TrainflowError
from trainflow.trainer.serving.calibration import CALIBRATION_FILE
from trainflow.trainer.serving.checkpoint import CONFIG_FILE
from trainflow.trainer.families.network import check_model
from trainflow.trainer.serving.predict import NonFiniteOutput, predict_table
from trainflow.trainer.serving.servable import load_servable


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


PREPROCESSOR_EDITS = {
    "std zero": (lambda d: d["numeric"]["x1"].update(std=0), "std 0"),
    "std NaN": (lambda d: d["numeric"]["x1"].update(std=float("nan")), "std nan"),
    "mean infinite": (lambda d: d["numeric"]["x2"].update(mean=float("inf")), "mean inf"),
    "min above max": (lambda d: d["numeric"]["x1"].update(min=4.0, max=-4.0), "min 4.0 and max -4.0"),
    "std as text": (lambda d: d["numeric"]["x1"].update(std="1"), "std '1'"),
    "embedding dim huge": (lambda d: d["embedded"]["city"].update(dim=200_000_000), "dim 200000000"),
    "column twice": (lambda d: d["feature_order"].append("x1"), "every described column once"),
    "one class": (lambda d: d.update(classes=["no"]), "two distinct classes"),
    "unknown field": (lambda d: d.update(payload="x"), "unexpected keyword"),
}


@pytest.mark.parametrize("edit", list(PREPROCESSOR_EDITS), ids=list(PREPROCESSOR_EDITS))
def test_an_edited_preprocessor_is_refused_naming_its_file_before_anything_is_built(tmp_path, edit):
    d = tiny_checkpoint(tmp_path)
    change, message = PREPROCESSOR_EDITS[edit]
    _edit(d / "preprocessor.json", change)
    start = time.monotonic()
    with pytest.raises(ValueError, match="preprocessor.json") as err:
        load_servable(d)
    assert message in str(err.value)
    assert time.monotonic() - start < 5  # refused from the numbers, not after allocating
    assert isinstance(err.value, TrainflowError)  # a data problem: the CLI exits 2 naming the file


CALIBRATION_EDITS = {
    "temperature tiny": {"method": "temperature", "temperature": 1e-300},
    "temperature as text": {"method": "temperature", "temperature": "1.5"},
    "platt slope huge": {"method": "platt", "slope": 1e308, "intercept": 0.0},
    "platt slope negative": {"method": "platt", "slope": -5.0, "intercept": 0.0},
    "platt intercept huge": {"method": "platt", "slope": 1.0, "intercept": 1e6},
    "threshold as text": {"method": None, "threshold": "0.5"},
}


@pytest.mark.parametrize("edit", list(CALIBRATION_EDITS), ids=list(CALIBRATION_EDITS))
def test_a_calibration_outside_what_fitting_produces_is_refused(tmp_path, edit):
    d = tiny_checkpoint(tmp_path)
    (d / CALIBRATION_FILE).write_text(json.dumps(CALIBRATION_EDITS[edit]))
    with pytest.raises(ValueError, match="calibration.json: not a calibration trainflow wrote"):
        load_servable(d)


def test_network_sizes_are_refused_before_they_are_allocated(tmp_path):
    d = tiny_checkpoint(tmp_path)
    # a checkpoint's config asks for a network its weights file cannot hold
    _edit(d / CONFIG_FILE, lambda c: c["model"].update(hidden_sizes=[300_000_000]))
    start = time.monotonic()
    with pytest.raises(ValueError, match="hidden_sizes .300000000. .* more than the size of .*model.pt"):
        load_servable(d)
    # a config's own sizes against this machine's memory, before validate or training builds the network
    with pytest.raises(ValueError, match="available memory"):
        check_model(tiny_preprocessor(), {"type": "mlp", "hidden_sizes": [300_000_000], "dropout": 0.0})
    assert time.monotonic() - start < 5


def test_a_batch_with_a_non_finite_output_is_never_produced_and_names_the_checkpoint(tmp_path):
    d = tiny_checkpoint(tmp_path)
    # finite numbers that fitting could produce, whose arithmetic overflows: caught on the outputs
    _edit(d / "preprocessor.json", lambda p: p["numeric"]["x1"].update(mean=3e38, std=1e-11, min=-3.0, max=3.0))
    servable = load_servable(d)
    with pytest.raises(NonFiniteOutput, match=f"checkpoint {d}.*non-finite proba"):
        predict_table(servable, tiny_table())


def test_what_select_checked_is_what_later_steps_read_after_a_swap(tmp_path):
    """The class-path check and every later step read one private copy: rewriting the storage folder's config.json
    after the check changes nothing of what is scored or registered."""
    from trainflow.run.storage import private_copy
    from trainflow.trainer.resolve import check_class_path, resolve_checkpoint

    d = tiny_checkpoint(tmp_path)
    checked = resolve_checkpoint(str(d), allowed=set())
    assert Path(checked) != d
    _edit(d / CONFIG_FILE, lambda c: c["model"].update(type="torch", class_path="trainflow.examples.evil:Net"))
    with pytest.raises(Exception, match="does not name"):
        check_class_path(str(d), set(), str(d))  # the swapped folder itself is refused...
    served = load_servable(checked)  # ...and the checked copy is untouched by the swap
    assert served.family == "mlp" and predict_table(served, tiny_table()).num_rows == 50
    copy = private_copy(str(d))
    assert copy != checked and json.loads(Path(copy, CONFIG_FILE).read_text())["model"]["type"] == "torch"
    # a bare version or alias given as --model is no folder: the error says how a registered model is named
    with pytest.raises(Exception, match=r"not found: 3 \(a registered model: models:/NAME/3 or models:/NAME@3\)"):
        resolve_checkpoint("3")
    with pytest.raises(Exception, match=r"checkpoint folder not found: runs/gone$"):
        resolve_checkpoint("runs/gone")


def test_private_copies_go_with_their_process_and_a_killed_process_leaves_none_for_long(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    script = "from trainflow.run.storage import private_dir; print(private_dir('model-'), flush=True); import time; time.sleep({})"
    done = subprocess.run([sys.executable, "-c", script.format(0)], env=env, capture_output=True, text=True, check=True)
    assert not Path(done.stdout.strip()).exists()  # removed at exit
    killed = subprocess.Popen([sys.executable, "-c", script.format(600)], env=env, stdout=subprocess.PIPE, text=True)
    left = Path(killed.stdout.readline().strip())
    killed.send_signal(signal.SIGKILL)
    killed.wait(10)
    assert left.exists()
    (tmp_path / "trainflow-notours").mkdir()
    subprocess.run([sys.executable, "-c", script.format(0)], env=env, check=True, capture_output=True)
    assert not left.parent.exists() and (tmp_path / "trainflow-notours").exists()


def test_a_finished_fit_removes_only_what_earlier_attempts_left_and_ray_does_not_hold(tmp_path):
    from trainflow.trainer.runner import checkpoint_folders, remove_unregistered

    names = [f"checkpoint_2026-11-27_12-29-3{i}.000000" for i in range(4)]
    for name in [*names, "checkpoint_notes", "trainflow_events"]:
        (tmp_path / name).mkdir()
    (tmp_path / names[1] / "model.pt").write_bytes(b"half")  # a folder a dead worker was writing
    earlier = checkpoint_folders(str(tmp_path))
    assert earlier == set(names)  # Ray Train's names only: a folder named otherwise is not the run's to remove
    (tmp_path / "checkpoint_2026-11-27_12-29-55.000000").mkdir()  # written by this fit, not registered (yet)
    held = {names[2], names[3]}
    assert remove_unregistered(str(tmp_path), earlier, held) == names[:2]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*names[2:], "checkpoint_2026-11-27_12-29-55.000000", "checkpoint_notes", "trainflow_events"]
    )


def test_a_planted_finished_marker_gives_only_its_checkpoint_folders(tmp_path):
    """A copied run folder whose trainflow_finished.json lists only the epoch-3 checkpoint, with a 400-epoch history
    ending at val_loss 0.0001, another run path and a recovery that never happened: a rerun reuses the run, but every
    checkpoint in the folder (the better epoch 4 too), the history, the path and the recoveries come from the folder."""
    from trainflow.tasks.train import FINISHED_FILE, finished_outcome
    from trainflow.trainer.serving.checkpoint import save_checkpoint

    run = tmp_path / "runs" / "copied"
    history = [{"epoch": e, "val_loss": 1.0 - 0.1 * e} for e in range(5)]
    for epoch, loss in ((3, 0.7), (4, 0.6)):
        d = run / f"checkpoint_2026-11-27_12-29-3{epoch}.000000"
        d.mkdir(parents=True)
        save_checkpoint(
            d,
            {},
            {"epoch": epoch},
            {"epoch": epoch, "val_loss": loss},
            history[: epoch + 1],
            tiny_preprocessor().to_dict(),
            {},
        )
    lineage, budget = {"data_fingerprint": "content:ab", "config_hash": "config:cd"}, {"limit": 5, "unit": "epoch"}
    planted = {
        "lineage": lineage,
        "budget": budget,
        "outcome": {
            "run_name": "someone-else",
            "family": "xgboost",
            "run_path": "/somewhere/else",
            "checkpoints": [
                {
                    "path": "/somewhere/else/checkpoint_2026-11-27_12-29-33.000000",
                    "epoch": 3,
                    "metrics": {"val_loss": 0.0001},
                }
            ],
            "history": [{"epoch": e, "val_loss": 0.0001} for e in range(400)],
            "recoveries": [{"error": "a fake recovery", "resumed_from_epoch": 2}],
            "train_s": 12.5,
        },
    }
    (run / FINISHED_FILE).write_text(json.dumps(planted))
    outcome = finished_outcome(str(run), lineage, budget, "copied", "mlp")
    assert (outcome.run_name, outcome.family, outcome.run_path) == ("copied", "mlp", str(run))
    assert [c["epoch"] for c in outcome.checkpoints] == [3, 4]
    assert [c["metrics"]["val_loss"] for c in outcome.checkpoints] == [0.7, 0.6]  # read from each checkpoint
    assert outcome.history == history and outcome.recoveries == [] and outcome.train_s == 12.5
    # another lineage or budget, or a listed folder that is gone: train again
    assert finished_outcome(str(run), {**lineage, "config_hash": "config:x"}, budget, "copied", "mlp") is None
    planted["outcome"]["checkpoints"][0]["path"] = "/x/checkpoint_2026-11-27_12-29-39.000000"
    (run / FINISHED_FILE).write_text(json.dumps(planted))
    assert finished_outcome(str(run), lineage, budget, "copied", "mlp") is None
