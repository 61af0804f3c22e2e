"""Retention over nightly retrains: with `retention.keep_runs` the storage stays bounded while the champion keeps
everything it needs; versions go only through MLflow's API; a rollback to a deleted version says why; a collection
SIGKILLed in the middle of a removal leaves nothing a later run trips on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from tests.conftest import dir_bytes, write_parquet, xgboost_config
from trainflow.flows.cli import main as cli_main
from trainflow.retention import LEDGER
from trainflow.tables.sample import make_churn_table

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness", "ray_local")]

NIGHTS = 5
KEEP = 2
REPO = Path(__file__).resolve().parents[1]


def _night(cfg: Path, tmp_path: Path, k: int, *extra: str, name: str | None = None) -> dict:
    # a day's rows appended: the table grows, so no night is the champion's own data
    write_parquet(make_churn_table(300 + 40 * k, seed=1), tmp_path / "data" / "train.parquet")
    out = tmp_path / f"night-{k:02d}.json"
    name = name or f"night-{k:02d}"
    args = ["retrain", "--config", str(cfg), "--run-name", name, "--summary-json", str(out), *extra]
    assert cli_main(args) == 0
    return json.loads(out.read_text())


def test_nightly_retrains_keep_storage_bounded_and_the_champion_whole(tmp_path, capsys):
    retention = {"keep_runs": KEEP, "delete_versions": True}
    cfg = xgboost_config(tmp_path, {"path": "data/train.parquet"}, "nightly", retention=retention)
    runs = tmp_path / "runs"
    # something trainflow did not write, named like one of its runs' folders: never touched
    (runs / "night-02-notes").mkdir(parents=True)
    (runs / "night-02-notes" / "keep.txt").write_text("mine")
    sizes, summaries = [], []
    for k in range(1, NIGHTS + 1):
        # night 1 becomes @champion; every later night's challenger must beat it by more than any loss can
        summaries.append(_night(cfg, tmp_path, k, *([] if k == 1 else ["--set", "promotion.margin=100"])))
        sizes.append(dir_bytes(runs))
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert client.get_registered_model("nightly").aliases == {"champion": 1}

    # bounded: once KEEP + the champion's runs are there, a night adds one and removes one
    steady = sizes[KEEP]  # after night KEEP + 1
    assert all(size <= 1.3 * steady for size in sizes[KEEP:]), sizes
    freed = sum(s["retention"]["bytes_freed"] for s in summaries)  # without retention the storage would hold these too
    assert len([s for s in summaries if s["retention"]["removed"]]) == NIGHTS - KEEP - 1 and sizes[-1] < 0.7 * (
        sizes[-1] + freed
    )
    owners = sorted({p.name[:8] for p in runs.iterdir() if p.name.startswith("night-") and p.name != "night-02-notes"})
    kept = ["night-01", *[f"night-{k:02d}" for k in range(NIGHTS - KEEP + 1, NIGHTS + 1)]]
    assert owners == kept, owners
    assert (runs / "night-02-notes" / "keep.txt").read_text() == "mine"
    assert sorted(p.stem for p in (runs / LEDGER).iterdir()) == kept

    # each night's summary says what went and why; the champion's run stays for its alias
    last = summaries[-1]["retention"]
    assert [r["run"] for r in last["removed"]] == [f"night-{NIGHTS - KEEP:02d}"]
    assert last["removed"][0]["why"] == f"older than the newest {KEEP}" and last["removed"][0]["bytes"] > 0
    why = {k["run"]: k["why"] for k in last["kept"]}
    assert why["night-01"] == "version 1 is @champion" and why[f"night-{NIGHTS:02d}"] == "this run"
    assert "retention         removed 1 run(s)" in capsys.readouterr().out
    # versions went through MLflow's API, their MLflow runs marked deleted; the kept ones stay
    versions = sorted(int(v.version) for v in client.search_model_versions("name = 'nightly'"))
    assert versions == [1, *range(NIGHTS - KEEP + 1, NIGHTS + 1)]
    gone = last["removed"][0]
    assert gone["versions_deleted"] == [str(NIGHTS - KEEP)] and gone["mlflow_runs_deleted"] >= 1
    deleted = client.search_runs(
        [client.get_experiment_by_name("nightly").experiment_id],
        filter_string="tags.`trainflow.retrain` = 'night-02'",
        run_view_type=mlflow.entities.ViewType.DELETED_ONLY,
    )
    assert len(deleted) == 1

    # the champion still scores, from MLflow alone
    scored = tmp_path / "scored"
    predict = ["predict", "--config", str(cfg), "--set", "inference.input=data/train.parquet"]
    assert cli_main([*predict, "--set", f"inference.output={scored}", "--summary-json", str(tmp_path / "p.json")]) == 0
    predicted = json.loads((tmp_path / "p.json").read_text())
    assert predicted["output_rows"] == predicted["input_rows"] == 300 + 40 * NIGHTS
    # a rollback to a kept version works; to a deleted one it is refused, naming why
    capsys.readouterr()
    assert cli_main(["rollback", "--config", str(cfg), "--to", str(NIGHTS), "--reason", "test", "--force"]) == 0
    assert client.get_registered_model("nightly").aliases == {"champion": NIGHTS}
    assert cli_main(["rollback", "--config", str(cfg), "--to", "2", "--reason", "test", "--force"]) == 2
    err = capsys.readouterr().err
    assert "has no version '2'" in err and "deleted by retention" in err and "with its run night-02" in err

    # a dry run lists what a collection would remove (version 1 served within alias_history_days: it stays)
    dry = tmp_path / "dry.json"
    assert cli_main(["gc", "--config", str(cfg), "--set", "retention.keep_runs=1", "--dry-run", "--summary-json",
                     str(dry)]) == 0  # fmt: skip
    planned = json.loads(dry.read_text())
    assert planned["dry_run"] and [r["run"] for r in planned["removed"]] == [
        f"night-{k:02d}" for k in range(NIGHTS - 1, NIGHTS - KEEP, -1)
    ]
    assert dir_bytes(runs) == sizes[-1]

    # by age: every run older than a few seconds may go, but what an alias or the history window needs
    aged = tmp_path / "aged.json"
    by_age = ["--set", "retention.keep_runs=null", "--set", "retention.max_age_days=0.0001", "--dry-run"]
    assert cli_main(["gc", "--config", str(cfg), *by_age, "--summary-json", str(aged)]) == 0
    assert [r["run"] for r in json.loads(aged.read_text())["removed"]] == [
        f"night-{k:02d}" for k in range(NIGHTS - 1, NIGHTS - KEEP, -1)
    ]
    assert all("days ago" in r["why"] for r in json.loads(aged.read_text())["removed"])

    # SIGKILLed after its second deletion (the done record, then one folder of the first run it removes): the run's
    # record says `removing`, part of it is still there
    victim = planned["removed"][0]["run"]
    args = ["gc", "--config", str(cfg), "--set", "retention.keep_runs=1"]
    killed = subprocess.run(
        [sys.executable, "-m", "tests.kill_at", "gc-second-delete", *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    record = json.loads((runs / LEDGER / f"{victim}.json").read_text())
    assert record.get("removing") and not (runs / f"{victim}-done.json").exists()
    assert any(p.name.startswith(victim) for p in runs.iterdir())
    # a rerun of that name finishes the removal before it reads anything: it trains afresh (no half-removed
    # checkpoint resumed, no done record believed) and registers a new version
    rerun = _night(cfg, tmp_path, NIGHTS + 1, "--set", "promotion.margin=100", name=victim)
    assert not rerun.get("already_finished") and rerun.get("resumed_from_epoch") is None
    assert rerun["model_version"] == str(NIGHTS + 1)
    assert "removing" not in json.loads((runs / LEDGER / f"{victim}.json").read_text())
    # and a collection then keeps the newest (the rerun), the champion and the history window's version 1
    after = tmp_path / "after.json"
    assert cli_main([*args, "--summary-json", str(after)]) == 0
    assert [r["run"] for r in json.loads(after.read_text())["removed"]] == [
        f"night-{k:02d}" for k in range(NIGHTS - 2, NIGHTS - KEEP, -1)
    ]
    left = sorted(p.name for p in runs.iterdir() if p.name.startswith("night-") and p.name != "night-02-notes")
    assert {name[:8] for name in left} == {"night-01", victim, f"night-{NIGHTS:02d}"}, left
