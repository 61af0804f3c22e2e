"""examples/notebook.py as a user runs it: a DataFrame in (no data.path), the leaderboard, predict_proba and evaluate
on rows kept back; the same frame again is the champion's own data (a skip)."""

import numpy as np
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness", "ray_local")]


def test_the_notebook_example_trains_from_a_dataframe_and_reads_back_its_leaderboard(tmp_path):
    import trainflow
    from trainflow.examples.notebook import main

    out = main(tmp_path)
    summary, proba, kept_back = out["summary"], out["proba"], out["kept_back"]
    # the frame became a Parquet snapshot under storage_path, and the run's lineage names it
    assert summary["data_path"].startswith(str(tmp_path / "runs" / "snapshots")) and summary["data_path"].endswith(
        ".parquet"
    )
    board = trainflow.leaderboard(summary)
    assert {"lightgbm", "xgboost"} <= set(board["family"])  # (and the ensemble, when its weights earn it)
    assert {"val_loss", "test_roc_auc", "test_loss", "train_s", "epochs_run"} <= set(board.columns)
    assert board["val_loss"].is_monotonic_increasing  # best first (promotion.metric val_loss, mode min)
    assert (board.loc[board["family"] != "ensemble", "train_s"] > 0).all() and board["train_s"].notna().all()
    assert list(proba.columns) == [0, 1] and len(proba) == len(kept_back)  # a column per class
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-6)
    assert out["scores"]["accuracy"] > 0.9  # rows no choice saw: breast cancer is an easy table
    # the same rows again: the same snapshot file, the champion's own data: nothing trains
    again = trainflow.retrain(out["config"], data=out["train"])
    assert again["data_path"] == summary["data_path"] and again["skipped"]["champion_version"] == "1"


def test_a_snapshot_is_written_once_and_one_edited_in_storage_is_refused(tmp_path):
    """The same frame again names the same file (not rewritten); a file at that name holding other bytes (planted
    or edited in a shared bucket) is neither trained on nor replaced."""
    import os

    import pandas as pd

    import trainflow
    from trainflow.errors import DataError

    frame = pd.DataFrame({"x": [1.0, 2.0, 3.0], "y": [0, 1, 0]})
    first = trainflow.snapshot(frame, str(tmp_path))
    written = os.stat(first).st_mtime_ns
    assert trainflow.snapshot(frame, str(tmp_path)) == first and os.stat(first).st_mtime_ns == written
    with open(first, "ab") as f:
        f.write(b"planted")
    with pytest.raises(DataError, match="do not match its name"):
        trainflow.snapshot(frame, str(tmp_path))
    assert open(first, "rb").read().endswith(b"planted")  # left as it is
    # a frame with a repeated or an empty column name is refused naming them (exit 2 by the CLI's rule), nothing written
    for names, needle in (
        (["x", "x", "y"], r"column name\(s\) \['x'\] appear more than once"),
        (["x", "", "y"], r"column\(s\) at position \[1\] have an empty name"),
    ):
        with pytest.raises(DataError, match=needle):
            trainflow.snapshot(pd.DataFrame([[1.0, 2.0, 0]], columns=names), str(tmp_path / "other"))
    assert not (tmp_path / "other").exists()
