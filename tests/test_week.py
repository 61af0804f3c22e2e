"""A week of nights: the nightly deployment (the cron of deployments/prefect.yaml) runs seven times on a table that
grows by a day's rows each night. Three nights with retention and approval off, then the team turns both on
(`retention.keep_runs: 2`, `promotion.approval: required`, as a deployment's parameters): every night registers one
version, a person answers every promotion request (rejects one, approves one), the champion is always the last version
promoted and approved, storage grows while nothing is removed and stays bounded once retention is on, and every night
scores every row of the scoring table.

The test process runs each scheduled flow run as a worker's process does (tests/conftest.py execute_flow_run; the
real worker process is tests/test_deployments.py's), against the session's Prefect server."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import mlflow
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import dir_bytes, execute_flow_run, write_parquet, xgboost_config
from trainflow.tables.outputs import output_files, read_manifest
from trainflow.retention import LEDGER
from trainflow.tables.sample import make_churn_table

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness", "ray_local")]

MODEL = "weekly"
NIGHTS = 7
FIRST_WITH_BOTH = 4  # nights 4-7: retention and approval on
SCORING_ROWS = 150
REPO = Path(__file__).resolve().parents[1]


def _nightly_schedule():
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.schedules import CronSchedule

    nightly = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())["definitions"]["schedules"]["nightly"]
    return DeploymentScheduleCreate(schedule=CronSchedule(cron=nightly["cron"], timezone=nightly["timezone"]))


def test_a_week_of_nightly_retrains_with_retention_and_approval_turned_on_midweek(tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.flow_runs import resume_flow_run
    from prefect.states import Scheduled

    train = tmp_path / "data" / "train.parquet"
    write_parquet(
        make_churn_table(SCORING_ROWS, seed=99, with_label=False, id_offset=90_000), tmp_path / "score.parquet"
    )
    cfg = xgboost_config(
        tmp_path,
        {"path": "data/train.parquet"},
        MODEL,
        promotion={"confidence": None},
        inference={"input": "score.parquet", "output": "out/predictions"},
    )
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    runs = tmp_path / "runs"
    days = [make_churn_table(300, seed=1)]
    sizes, ledgers, owners, answers, champions = [], [], [], {}, []

    with get_client(sync_client=True) as prefect:
        deployment = prefect.create_deployment(
            flow_id=prefect.create_flow_from_name("retrain"),
            name="week",
            schedules=[_nightly_schedule()],
            parameters={"config_path": cfg},
        )
        [schedule] = prefect.read_deployment(deployment).schedules
        assert schedule.schedule.cron == "0 2 * * *"
        # the nights of last week at 02:00 (a flow run scheduled in the future would wait for its time)
        today = dt.datetime.now(dt.timezone.utc).replace(hour=2, minute=0, second=0, microsecond=0)
        monday = today - dt.timedelta(days=NIGHTS + 1)
        for k in range(1, NIGHTS + 1):
            # the day's rows appended: the table grows, so every night has something new to train on
            if k > 1:
                days.append(make_churn_table(40, seed=100 + k, id_offset=1_000 * k))
            write_parquet(pa.concat_tables(days), train)
            if k < FIRST_WITH_BOTH:  # one boosting round: the 20-round models of the later nights beat these
                overrides = {"model.params.xgboost.num_boost_round": 1}
            else:
                overrides = {
                    "promotion.approval": "required",
                    "retention.keep_runs": 2,
                    "retention.alias_history_days": 0,
                }
            run = prefect.create_flow_run_from_deployment(
                deployment,
                parameters={"config_path": cfg, "overrides": overrides},
                state=Scheduled(scheduled_time=monday + dt.timedelta(days=k - 1)),
            )
            state = execute_flow_run(run.id)
            if state.is_paused():  # the gate would promote: a person answers (rejects night 4, approves night 5, ...)
                approve = k % 2 == 1
                answers[k] = approve
                reason = {"approve": approve, "reason": f"night {k} reviewed", "by": "ana"}
                resume_flow_run(run.id, run_input=reason)
                state = execute_flow_run(run.id)
            assert state.is_completed(), (k, state)
            sizes.append(dir_bytes(runs))
            ledgers.append(sorted(p.stem for p in (runs / LEDGER).iterdir()))
            champions.append(client.get_registered_model(MODEL).aliases.get("champion"))
            owners.append(sorted({p.name.removesuffix("-split") for p in runs.iterdir() if p.name != LEDGER}))
            # every night's predictions: one for every scoring row, from the champion of that night
            manifest = read_manifest(str(tmp_path / "out" / "predictions"))
            scored = pa.concat_tables(pq.read_table(f) for f in output_files(str(tmp_path / "out" / "predictions")))
            assert scored.num_rows == manifest["rows"] == SCORING_ROWS, k
            assert sorted(scored["customer_id"].to_pylist()) == list(range(90_000, 90_000 + SCORING_ROWS))
            assert manifest["model"] == f"models:/{MODEL}/{champions[-1]}", (k, manifest)

    # one version a night, none deleted (retention.delete_versions is off); each decision as the nights went
    versions = {int(v.version): v for v in client.search_model_versions(f"name = '{MODEL}'")}
    assert sorted(versions) == list(range(1, NIGHTS + 1))
    decision = {k: versions[k].tags["trainflow.promotion.decision"] for k in versions}
    assert decision[1] == "promoted"
    assert all(decision[k] in ("promoted", "not_promoted") for k in range(1, FIRST_WITH_BOTH))
    # the first 20-round night asks, and is rejected; the next asks again and is approved
    assert answers.get(FIRST_WITH_BOTH) is False and answers.get(FIRST_WITH_BOTH + 1) is True, answers
    for k in range(FIRST_WITH_BOTH, NIGHTS + 1):
        reason = versions[k].tags["trainflow.promotion.reason"]
        if k not in answers:  # the gate kept the champion: nobody was asked
            assert decision[k] == "not_promoted" and "approved by" not in reason
        elif answers[k]:
            assert decision[k] == "promoted" and f"approved by ana: night {k} reviewed" in reason
        else:
            assert decision[k] == "not_promoted" and reason.startswith(f"rejected by ana: night {k} reviewed")
    # the champion is always the last version promoted (and, from night 4, approved)
    last_promoted = None
    for k in range(1, NIGHTS + 1):
        last_promoted = k if decision[k] == "promoted" else last_promoted
        assert champions[k - 1] == last_promoted, (k, champions, decision)
    assert client.get_registered_model(MODEL).aliases == {"champion": last_promoted}
    # every night's MLflow run ended as its retrain did, the suspended ones too once answered
    retrains = client.search_runs(
        [client.get_experiment_by_name(MODEL).experiment_id], filter_string="tags.`trainflow.retrain` LIKE '%'"
    )
    assert sorted(r.info.status for r in retrains) == ["FINISHED"] * NIGHTS

    # storage: grows while nothing is removed; once retention is on, only the champion's run and the newest two stay
    # (the folders in storage are exactly the recorded runs: nothing half removed, nothing unrecorded)
    assert sizes[0] < sizes[1] < sizes[2], sizes
    assert [len(names) for names in ledgers[: FIRST_WITH_BOTH - 1]] == [1, 2, 3], ledgers
    assert owners == ledgers, (owners, ledgers)
    assert all(len(names) <= 3 for names in ledgers[FIRST_WITH_BOTH - 1 :]), ledgers
    # bounded in bytes: never more than three of the week's largest runs (20 rounds; the table grows 40 rows a night)
    largest = sizes[-1] / len(ledgers[-1])
    assert all(size <= 3.6 * largest for size in sizes[FIRST_WITH_BOTH - 1 :]), (sizes, ledgers)
