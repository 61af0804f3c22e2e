"""A person's approval before a promotion (promotion.approval: required), with Prefect's real suspension: a
deployment's flow run suspends once the gate would promote, holding no lock; resumed with an approval it promotes
(recorded with who and why), with a rejection it does not; unanswered past its timeout Prefect fails it and the next
gate records it not promoted. On the command line: refused before anything starts, or approved with --approve.

The test process runs each flow run of the deployment as a worker's process would (Prefect's flow engine with the
run the server scheduled; `tests/test_deployments.py` runs real workers), against the session's Prefect server."""

from __future__ import annotations

import json
import time
from pathlib import Path

import mlflow
import pytest

from tests.conftest import execute_flow_run as _execute, write_parquet, xgboost_config
from trainflow.flows.cli import main as cli_main
from trainflow.tables.sample import make_churn_table

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness", "ray_local")]

MODEL = "approved"


def _config(tmp_path: Path) -> Path:
    write_parquet(make_churn_table(400, seed=1), tmp_path / "data" / "train.parquet")
    promotion = {"approval": "required", "confidence": None}
    return Path(xgboost_config(tmp_path, {"path": "data/train.parquet"}, MODEL, promotion=promotion))


def test_a_promotion_waits_for_a_person_who_approves_rejects_or_never_answers(tmp_path, capsys):
    from prefect.client.orchestration import get_client
    from prefect.exceptions import FlowPauseTimeout, NotPausedError
    from prefect.flow_runs import resume_flow_run

    from trainflow.run.locks import exclusive

    cfg = _config(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)

    # the command line: nobody could answer there, so nothing starts; --approve is the approval, recorded
    capsys.readouterr()
    assert cli_main(["retrain", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "promotion.approval: required" in err and "--approve" in err and not (tmp_path / "runs").exists()

    with get_client(sync_client=True) as prefect:
        flow_id = prefect.create_flow_from_name("retrain")
        deployment = prefect.create_deployment(flow_id=flow_id, name="approval-test")

        def start(k: int, **overrides) -> object:
            write_parquet(make_churn_table(400 + 50 * k, seed=k), tmp_path / "data" / "train.parquet")
            params = {"config_path": str(cfg), "overrides": overrides or None}
            return prefect.create_flow_run_from_deployment(deployment, parameters=params).id

        # 1: the gate would promote (first model; one boosting round, so the later ones beat it): the run suspends with
        # the evidence shown, holding no lock
        first = start(1, **{"model.params.xgboost.num_boost_round": 1})
        state = _execute(first)
        assert state.is_paused(), state
        [version] = client.search_model_versions(f"name = '{MODEL}'")
        assert version.tags["trainflow.promotion.decision"] == "awaiting_approval"
        assert "trainflow.promotion.approval_deadline" in version.tags
        assert client.get_registered_model(MODEL).aliases == {}
        with exclusive("champion", MODEL, uri, timeout_s=2.0):  # the gate's lock is free while it waits
            pass
        experiment = client.get_experiment_by_name(MODEL).experiment_id
        parents = lambda: client.search_runs([experiment], filter_string="tags.`trainflow.retrain` LIKE '%'")  # noqa: E731
        assert [r.info.status for r in parents()] == ["RUNNING"]  # the retrain's MLflow run waits with it
        from prefect.artifacts import Artifact

        assert "Approve approved version 1 as @champion?" in str(Artifact.get("approval-request").data)
        # approved in Prefect: resumed, the run goes on, promotes, and records who and why
        resume_flow_run(first, run_input={"approve": True, "reason": "numbers checked", "by": "ana"})
        state = _execute(first)
        assert state.is_completed(), state
        assert client.get_registered_model(MODEL).aliases == {"champion": 1}
        assert len(client.search_model_versions(f"name = '{MODEL}'")) == 1  # the resumed run registered nothing new
        assert [r.info.status for r in parents()] == ["FINISHED"]  # and went on in the same MLflow run
        v1 = client.get_model_version(MODEL, "1")
        assert v1.tags["trainflow.promotion.decision"] == "promoted"
        assert "approved by ana: numbers checked" in v1.tags["trainflow.promotion.reason"]
        periods = json.loads(v1.tags["trainflow.champion.periods"])
        assert "approved by ana: numbers checked" in periods[-1]["why"]

        # 2: never answered: past its timeout the resume is refused and Prefect fails the run
        late = start(2, **{"promotion.approval_timeout_h": 0.0003})
        state = _execute(late)
        assert state.is_paused(), state
        time.sleep(2.0)
        with pytest.raises((FlowPauseTimeout, NotPausedError)):  # (NotPaused: the server's expiry service was first)
            resume_flow_run(late, run_input={"approve": True, "reason": "too late", "by": "ana"})
        assert prefect.read_flow_run(late).state.is_failed()

        # 3: rejected: not promoted, with who and why; its gate also records the timed-out request of run 2
        rejected = start(3)
        assert _execute(rejected).is_paused()  # the gate would promote: a person says no
        resume_flow_run(rejected, run_input={"approve": False, "reason": "slice looks off", "by": "bo"})
        assert _execute(rejected).is_completed()
        v3 = client.get_model_version(MODEL, "3")
        assert v3.tags["trainflow.promotion.decision"] == "not_promoted"
        assert v3.tags["trainflow.promotion.reason"].startswith("rejected by bo: slice looks off")
        assert client.get_registered_model(MODEL).aliases == {"champion": 1}
        v2 = client.get_model_version(MODEL, "2")
        assert v2.tags["trainflow.promotion.decision"] == "not_promoted"
        assert "its approval was not answered by" in v2.tags["trainflow.promotion.reason"]
        # the MLflow run that waited with it ends KILLED, saying why; every other retrain's run ended FINISHED
        statuses = sorted(r.info.status for r in parents())
        assert statuses == ["FINISHED", "FINISHED", "KILLED"], statuses

    # the command line's approval: given with the run, recorded as the user's
    write_parquet(make_churn_table(700, seed=9), tmp_path / "data" / "train.parquet")
    out = tmp_path / "s.json"
    assert cli_main(["retrain", "--config", str(cfg), "--approve", "ship it", "--summary-json", str(out)]) == 0
    promotion = json.loads(out.read_text())["promotion"]
    assert promotion["decision"] == "promoted" and "(--approve): ship it" in promotion["reason"]
    assert client.get_registered_model(MODEL).aliases == {"champion": 4}
