"""The README's deployment commands against a real Prefect server on 127.0.0.1: deploy, worker, run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow.dataset as pads
import pytest
from mlflow import MlflowClient

from tests.conftest import churn_config, free_port, new_prefect_home
from tests.faults import wait_registered
from tests.servers import mlflow_server, prefect_env, start as _start, stop as _stop
from tests.servers import prefect_server as prefect_server_process
from trainflow.trainer.recovery import read_events
from trainflow.trainer.runner import checkpoints_on_disk

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
POOL = "trainflow-process"


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory, prefect_harness):
    """`prefect server start` on a free loopback port with its own PREFECT_HOME; the env to reach it."""
    home = new_prefect_home(tmp_path_factory.mktemp("prefect-home"))
    port = free_port()
    server = prefect_server_process(home, port)
    env = {
        **prefect_env(home),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_WORKER_PREFETCH_SECONDS": "5",
    }
    yield env
    _stop(server)


def _prefect(env: dict[str, str], *args: str, timeout: float = 120, cwd: Path = REPO) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(BIN / "prefect"), "--no-prompt", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"prefect {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


# what Prefect's own client retries (prefect.client.base): a server busy writing its SQLite database (its
# scheduler inserting a new deployment's runs) answers 503 to a request it can take a moment later
RETRIED = {429, 502, 503}


def _api(env: dict[str, str], method: str, path: str, body: dict | None = None):
    """One request to the Prefect server's REST API, retried as Prefect's client does; the JSON answer, if any."""
    req = urllib.request.Request(
        f"{env['PREFECT_API_URL']}{path}",
        method=method,
        headers={"Content-Type": "application/json"},
        data=json.dumps(body).encode() if body is not None else None,
    )
    for attempt in range(8):
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                answer = r.read()
            return json.loads(answer) if answer else None
        except urllib.error.HTTPError as exc:
            if exc.code not in RETRIED or attempt == 7:
                raise
        time.sleep(min(2**attempt * 0.25, 5))


def _deployment(env: dict[str, str], name: str) -> dict:
    return _api(env, "GET", f"/deployments/name/{name}")


def _flow_runs(env: dict[str, str], deployment_id: str) -> list[dict]:
    return _api(env, "POST", "/flow_runs/filter", {"deployments": {"id": {"any_": [deployment_id]}}})


def test_deploy_worker_and_deployment_run(prefect_server, tmp_path):
    # the worker's flow runs train the small table in their own processes (Ray Train's local mode, no Ray started:
    # docs/pipeline.md), as a worker on one machine does; a flow run that joins a cluster is test_cluster.py's and
    # the serve test's below
    env = dict(prefect_server)
    # the README's commands, in order
    _prefect(env, "work-pool", "create", POOL, "--type", "process")
    _prefect(env, "deploy", "--prefect-file", "deployments/prefect.yaml", "--all")
    _pause_schedules(env, "watch-data/watch")
    # MLflow as a team runs it: an `mlflow server` on loopback, which the UI check below opens too
    tracking = f"http://127.0.0.1:{free_port()}"
    mlflow_proc = mlflow_server(tmp_path / "mlflow-server", int(tracking.rsplit(":", 1)[1]))
    try:
        cfg = churn_config(tmp_path, rows=2000, mlflow={"tracking_uri": tracking})
        # the worker runs somewhere else: the deployment's pull step must bring flows back to the checkout
        worker = _start(
            [str(BIN / "prefect"), "worker", "start", "--pool", POOL], env, tmp_path / "worker.log", tmp_path
        )
        try:
            _retrain_approved_through_the_api(env, cfg)
            scored = tmp_path / "by-champion"
            _prefect(
                env,
                "deployment",
                "run",
                "batch-inference/champion",
                "--param",
                f"config_path={cfg}",
                "--param",
                json.dumps({"inference.output": str(scored)}).join(["overrides=", ""]),
                "--watch",
                "--watch-timeout",
                "300",
                timeout=360,
            )
            _a_changed_table_starts_one_retrain(env, cfg, tmp_path)
        except AssertionError:
            print((tmp_path / "worker.log").read_text()[-6000:])
            raise
        finally:
            _stop(worker)
        _the_runs_registered_served_and_showed(env, cfg, tmp_path, tracking, scored)
    finally:
        _stop(mlflow_proc)


def _retrain_approved_through_the_api(env: dict[str, str], cfg: Path) -> None:
    """retrain/manual with promotion.approval: required: the worker's run suspends once its gate would promote
    (the worker freed), a person approves through the API, and the worker runs it again to completion."""
    overrides = {"model.params.mlp.epochs": 2, "promotion.approval": "required"}
    _prefect(env, "deployment", "run", "retrain/manual", "--param", f"config_path={cfg}", "--param",
             f"overrides={json.dumps(overrides)}")  # fmt: skip
    deployment = _deployment(env, "retrain/manual")["id"]
    run = _wait_for_state(env, deployment, ("PAUSED",), 420)
    assert run["state"]["name"] == "Suspended"
    _api(env, "POST", f"/flow_runs/{run['id']}/resume", {"run_input": {"approve": True, "reason": "ok", "by": "ci"}})
    assert _wait_for_state(env, deployment, ("COMPLETED",), 420)["id"] == run["id"]


def _wait_for_state(env: dict[str, str], deployment: str, states: tuple[str, ...], timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        runs = _flow_runs(env, deployment)
        if runs and runs[0]["state"]["type"] in states:
            return runs[0]
        assert not runs or runs[0]["state"]["type"] not in ("FAILED", "CRASHED"), runs[0]["state"]
        assert time.monotonic() < deadline, [r["state"] for r in runs]
        time.sleep(1)


def _the_runs_registered_served_and_showed(env, cfg: Path, tmp_path: Path, tracking: str, scored: Path) -> None:
    for name in ("retrain/manual", "batch-inference/champion"):
        runs = _flow_runs(env, _deployment(env, name)["id"])
        assert [r["state"]["type"] for r in runs] == ["COMPLETED"], name
    # the triggered retrain registered nothing: the champion is still the manual run's version 1
    retrain_run = _flow_runs(env, _deployment(env, "retrain/manual")["id"])[0]
    assert retrain_run["parameters"]["overrides"] == {"model.params.mlp.epochs": 2, "promotion.approval": "required"}

    # the outputs: a registered model version that is @champion, with lineage back to this flow run
    client = MlflowClient(tracking_uri=tracking, registry_uri=tracking)
    champion = client.get_model_version_by_alias("churn-test", "champion")
    assert str(champion.version) == "1"
    assert champion.tags["trainflow.promotion.reason"].endswith("approved by ci: ok")  # a person's, through the API
    assert champion.tags["trainflow.prefect_flow_run_id"] == retrain_run["id"]
    runs = client.search_runs([client.get_experiment_by_name("test").experiment_id])
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]  # the retrain's run; its family's nested
    # (the network's keys: in its model section, as its checkpoint keeps them)
    assert [int(r.data.params["model.epochs"]) for r in runs if r is not parent] == [2]
    assert parent.data.tags["trainflow.prefect_flow_run_id"] == retrain_run["id"] and parent.info.status == "FINISHED"
    # predictions from the retrain run and from batch-inference/champion: every scoring row, same values
    first = pads.dataset(tmp_path / "out" / "predictions").to_table()
    second = pads.dataset(scored).to_table()
    assert first.num_rows == second.num_rows == 500
    assert first["customer_id"].to_pylist() == second["customer_id"].to_pylist()
    assert first["prediction"].to_pylist() == second["prediction"].to_pylist()
    _a_person_sees_the_card_and_the_plots(env, retrain_run["id"], client, tmp_path, tracking)


def _a_person_sees_the_card_and_the_plots(
    env, flow_run_id: str, client: MlflowClient, tmp_path: Path, tracking: str
) -> None:
    """In headless Chromium at a laptop's width: the retrain's model card in Prefect's UI (its flow run's artifact)
    and, in the `mlflow server`'s UI, the version's run page (the card as HTML, the training curves, the test rows'
    curves) and the registered version's description: headings and tables rendered, every image decoded and not
    blank, no raw Markdown or HTML escapes. Screenshots in build/ui-screenshots/; with TRAINFLOW_DOCS_SCREENSHOT=1
    (`make screenshots`) the card's top also refreshes docs/model_card.png."""
    from tests.browser import WIDTH, browser, check_page

    found = _api(env, "POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}})
    artifacts = {a["key"]: a for a in found}
    assert {"churn-test-model-card", "churn-test-loss-curve", "churn-test-test-rows"} <= set(artifacts), artifacts
    version = client.get_model_version_by_alias("churn-test", "champion")
    run = client.get_run(version.run_id)
    mlflow_ui = f"{tracking}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}/artifacts"
    with browser() as b:

        def opened(url: str):
            page = b.new_page(viewport={"width": WIDTH, "height": 900})
            page.goto(url)
            return page

        prefect_ui = env["PREFECT_API_URL"].removesuffix("/api")
        page = opened(f"{prefect_ui}/artifacts/artifact/{artifacts['churn-test-model-card']['id']}")
        embedded = 'img[src^="data:image/png"]'
        text = check_page(page, "prefect-model-card", ["The model", "Data", "Lineage"], 1, 2, embedded)
        assert "roc_auc" in text and "test (" in text
        if os.environ.get("TRAINFLOW_DOCS_SCREENSHOT"):
            page.set_viewport_size({"width": WIDTH, "height": 1500})
            page.screenshot(
                path=str(REPO / "docs" / "model_card.png"), clip={"x": 250, "y": 0, "width": 880, "height": 1500}
            )
        card = opened(f"{mlflow_ui}/model_card.html")
        check_page(card, "mlflow-model-card", ["The model", "Data"], 1, 2, frame=_blob_frame)
        for name in ("loss_curve.png", "test_rows.png"):
            check_page(opened(f"{mlflow_ui}/{name}"), f"mlflow-{name[:-4]}", [], 0, 1, 'img[src^="blob:"]')
        described = opened(f"{tracking}/#/models/churn-test/versions/{version.version}")
        described.get_by_text("Gate: promoted").first.wait_for(timeout=60_000)
        text = check_page(described, "mlflow-version", [], 0, 0)
        assert str(tmp_path / "data" / "train.parquet") in text  # a path's underscores stay underscores


def test_hostile_text_is_text_in_every_view(prefect_server, tmp_path):
    """A card whose every string from the data or config is hostile HTML (column names, a slice's value in the gate's
    reason, class names, paths, the model's name), through each view a person opens, in headless Chromium: Prefect's
    artifact page, the card's HTML in MLflow's artifact frame, the registered version's description. No script runs
    (no dialog opens), no element comes from the data, and the strings show as the text they are."""
    from prefect.artifacts import create_markdown_artifact
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tests.browser import browser
    from tests.test_report import hostile_card
    from trainflow.tasks.report import card_html, model_card

    env = prefect_server
    cfg, summary = hostile_card()
    card = model_card(cfg, summary, None, "", "", "test")
    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
        artifact = create_markdown_artifact(markdown=card, key="hostile-card")
    tracking = f"http://127.0.0.1:{free_port()}"
    server = mlflow_server(tmp_path / "mlflow-server", int(tracking.rsplit(":", 1)[1]))
    try:
        client = MlflowClient(tracking_uri=tracking, registry_uri=tracking)
        run = client.create_run(client.create_experiment("hostile"))
        client.log_text(run.info.run_id, card_html(card, "hostile"), "hostile_card.html")
        client.create_registered_model("churn-test")
        version = client.create_model_version("churn-test", f"runs:/{run.info.run_id}/model", run.info.run_id)
        mlflow_ui = f"{tracking}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}/artifacts"
        with browser() as b:
            _hostile_views(env, b, cfg, summary, version, tracking, mlflow_ui, str(artifact))
        client.set_terminated(run.info.run_id, "FINISHED")
    finally:
        _stop(server)


def _hostile_views(env, b, cfg, summary, version, tracking: str, mlflow_ui: str, artifact: str) -> None:
    from tests.browser import SHOTS, _wait_for
    from tests.test_report import HOSTILE
    from trainflow.tasks.register import describe_version

    summary["model_version"] = version.version
    registry = cfg.mlflow.model_copy(update={"tracking_uri": tracking, "registered_model": "churn-test"})
    describe_version(cfg.model_copy(update={"mlflow": registry}), summary)
    prefect_ui = env["PREFECT_API_URL"].removesuffix("/api")
    views = {
        "prefect-hostile-card": (f"{prefect_ui}/artifacts/artifact/{artifact}", None),
        "mlflow-hostile-card": (f"{mlflow_ui}/hostile_card.html", _blob_frame),
        "mlflow-hostile-version": (f"{tracking}/#/models/churn-test/versions/{version.version}", None),
    }
    for name, (url, frame) in views.items():
        page = b.new_page()
        dialogs: list[str] = []
        page.on("dialog", lambda d, seen=dialogs: (seen.append(d.message), d.dismiss()))
        page.goto(url)
        try:
            where = page.main_frame if frame is None else _wait_for(page, frame, name)
            where.get_by_text("fell by 0.1", exact=False).first.wait_for(timeout=60_000)
        except Exception:
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / f"{name}-failed.png"), full_page=True)
            raise
        page.wait_for_timeout(1000)  # an injected handler would have fired by now
        text = where.inner_text("body")
        injected = where.evaluate(
            "() => [...document.querySelectorAll('img[src=\"x\"], img[onerror], script')]"
            ".filter(e => (e.outerHTML || '').includes('alert')).map(e => e.outerHTML)"
        )
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
        assert dialogs == [] and injected == [], (name, dialogs, injected)
        assert HOSTILE[0] in text and HOSTILE[1] in text, (name, text[:3000])
        page.close()


def _blob_frame(page):
    """MLflow shows an HTML artifact in a frame of its own (a blob: URL)."""
    return next((f for f in page.frames if f.url.startswith("blob:")), None)


def _pause_schedules(env: dict[str, str], name: str) -> None:
    """The deployment's schedules paused and the runs they made deleted: watch-data/watch looks at the demo's table
    every minute, and its runs would hold the deployment's one slot (concurrency_limit 1) while this test's own
    runs of it wait 20-30 s for it."""
    dep = _deployment(env, name)
    for schedule in dep["schedules"]:
        _api(env, "PATCH", f"/deployments/{dep['id']}/schedules/{schedule['id']}", {"active": False})
    for run in _flow_runs(env, dep["id"]):
        if run["state"]["type"] == "SCHEDULED" and run.get("auto_scheduled"):
            _api(env, "DELETE", f"/flow_runs/{run['id']}")


def _a_changed_table_starts_one_retrain(env, cfg, tmp_path):
    """The watch flow records the table's files (its first look, run in this process against the server: a
    deployment run of it would be a fresh process, about 7 s), then watch-data/watch sees them change (touched: new
    modification time, same bytes) and emits trainflow.data.changed; retrain/scheduled's trigger starts exactly one
    retrain of the watched config, which finds the champion's own data and registers nothing. (A look that finds
    nothing changed emits nothing: test_watch_data_emits_only_when_the_files_change.)"""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from trainflow.flows.watch import watch_data

    watch = [
        "deployment",
        "run",
        "watch-data/watch",
        "--param",
        f"config_path={cfg}",
        "--watch",
        "--watch-timeout",
        "120",
    ]
    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
        assert watch_data(str(cfg))["previous"] is None  # the first look records the files: no event
    time.sleep(3)
    scheduled = _deployment(env, "retrain/scheduled")["id"]
    # (the server's scheduler adds the nightly cron's future runs of the demo config to retrain/scheduled and
    # watch-data/watch whenever it wakes: only runs of this test's config are counted)
    assert _runs_of(env, scheduled, cfg) == []
    train = tmp_path / "data" / "train.parquet"
    os.utime(train, (time.time() + 10, time.time() + 10))
    _prefect(env, *watch, timeout=180)
    deadline = time.monotonic() + 240
    while True:
        runs = _runs_of(env, scheduled, cfg)
        if runs and runs[0]["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED"):
            break
        assert time.monotonic() < deadline, runs
        time.sleep(1)
    assert len(runs) == 1 and runs[0]["state"]["type"] == "COMPLETED"
    watched = _runs_of(env, _deployment(env, "watch-data/watch")["id"], cfg)
    assert len(watched) == 1 and watched[0]["state"]["type"] == "COMPLETED"


def _runs_of(env: dict[str, str], deployment_id: str, cfg: Path) -> list[dict]:
    return [r for r in _flow_runs(env, deployment_id) if r["parameters"].get("config_path") == str(cfg)]


def test_schedule_and_concurrency_registered_as_declared(prefect_server):
    env = prefect_server
    if _deployment_missing(env, "retrain/scheduled"):
        _prefect(env, "work-pool", "create", POOL, "--type", "process", "--overwrite")
        _prefect(env, "deploy", "--prefect-file", "deployments/prefect.yaml", "--all")
    scheduled = _deployment(env, "retrain/scheduled")
    [sched] = scheduled["schedules"]
    assert sched["active"] is True
    assert (sched["schedule"]["cron"], sched["schedule"]["timezone"]) == ("0 2 * * *", "UTC")
    assert scheduled["work_pool_name"] == POOL
    assert scheduled["parameters"] == {"config_path": "configs/demo.yaml"}
    assert _deployment(env, "retrain/manual")["schedules"] == []
    for name in ("retrain/scheduled", "retrain/manual"):
        limit = _deployment(env, name)["global_concurrency_limit"]
        assert limit["limit"] == 1, name
    # every deployed run's Prefect client waits out an API away for about services.prefect_wait_s' default
    from trainflow.run.services import WAITS, prefect_retries

    for name in ("retrain/scheduled", "retrain/manual", "batch-inference/champion", "monitor/live", "watch-data/watch"):
        job_env = _deployment(env, name)["job_variables"]["env"]
        assert job_env["PREFECT_CLIENT_MAX_RETRIES"] == str(prefect_retries(WAITS.prefect)), name
    # a worker would run the scheduled flow from the checkout deploy ran in
    steps = scheduled["pull_steps"]
    assert steps == [{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}]


_RUN_LOCK = """
import sys, time
from trainflow.run import locks
try:
    with locks.run_lock(sys.argv[1], "nightly", wait=False):
        print("held", flush=True)
        time.sleep(float(sys.argv[2]))
except locks.LockTimeout as exc:
    print("refused:", exc, flush=True)
"""


def _lock(env: dict[str, str], storage: str, hold_s: float) -> subprocess.Popen:
    """A process that takes the run lock of storage's run "nightly" without waiting and holds it hold_s seconds."""
    command = [sys.executable, "-c", _RUN_LOCK, storage, str(hold_s)]
    return subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, text=True)


def _a_holder_killed(env: dict[str, str], storage: str) -> tuple[int, float]:
    """Against a Prefect server a run's lock is a global concurrency slot under a lease the holder renews
    (trainflow/run/locks.py): a holder SIGKILLed keeps it, so a run that does not wait is refused, naming the dead
    holder. (its pid, when it was killed)"""
    holder = _lock(env, storage, 600)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    killed = time.monotonic()
    answer = _lock(env, storage, 0).communicate(timeout=120)[0].strip()
    assert answer.startswith("refused:") and f"process {holder.pid} " in answer, answer
    return holder.pid, killed


def _its_lock_free_after_its_lease(env: dict[str, str], storage: str, pid: int, killed: float) -> None:
    """The killed holder's slot stays taken until its lease runs out and the server's repossessor frees it (a Prefect
    server runs that service; an ephemeral one, as the session's test server, does not): then a run that does not
    wait takes it. (Asked after the serve test's work, which outlasts the lease: its wait costs no time of its own.)"""
    from trainflow.run.locks import LEASE_S

    answers = []
    while True:  # the slot is asked for about every 10 s, each ask a process of its own as a `--no-wait` run is
        answer = _lock(env, storage, 0).communicate(timeout=120)[0].strip()
        answers.append((round(time.monotonic() - killed), answer[:80]))
        if answer == "held":
            break
        assert "is held by process" in answer and f"process {pid} " in answer, answers
        assert time.monotonic() - killed < LEASE_S + 60, answers
        time.sleep(10)
    assert answers[-1][0] >= LEASE_S - 5, answers  # freed by the lease running out, not by the kill


def _deployment_missing(env: dict[str, str], name: str) -> bool:
    try:
        _deployment(env, name)
        return False
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return True
        raise


def test_trainflow_serve_registers_the_same_deployments_a_cancel_stops_the_run_and_a_killed_lock_holder_is_outlived(
    prefect_server, ray_local, tmp_path
):
    # the served runs join the tests' running Ray, as on an existing cluster
    env = {
        **prefect_server,
        "RAY_ADDRESS": ray_local.get_runtime_context().gcs_address,
        **{k: v for k, v in os.environ.items() if k.startswith("RAY_AUTH_")},
    }
    # a run lock's holder SIGKILLed now, its lock asked for again once the served runs are done (after its lease)
    locked = str(tmp_path / "locked")
    holder, killed = _a_holder_killed(prefect_server, locked)
    serve = _start([str(BIN / "trainflow"), "serve", "--limit", "1"], env, tmp_path / "serve.log", tmp_path)
    try:
        demo = str(REPO / "configs" / "demo.yaml")
        deadline = time.monotonic() + 120
        # served deployments replace the deployed ones: no pull step, config_path resolved to the checkout
        while not all(
            _served(env, name, demo) for name in ("retrain/scheduled", "retrain/manual", "batch-inference/champion")
        ):
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(1)
        _cancel_stops_a_served_run(env, serve, tmp_path)
    finally:
        _stop(serve)
    dep = _deployment(env, "retrain/scheduled")
    assert dep["schedules"][0]["schedule"]["cron"] == "0 2 * * *"
    assert dep["global_concurrency_limit"]["limit"] == 1
    assert _deployment(env, "retrain/manual")["schedules"] == []
    _its_lock_free_after_its_lease(prefect_server, locked, holder, killed)


def _cancel_stops_a_served_run(env, serve, tmp_path):
    """Cancelling a served retrain from Prefect (SIGTERM to its process) stops Ray at once and retries nothing:
    the run ends Cancelled within seconds, no worker group starts again, and its checkpoint stays for a rerun."""
    cfg = churn_config(tmp_path, rows=6000, network={"epochs": 8, "batch_size": 32}, checkpoint={"min_interval_s": 0})
    run = tmp_path / "runs" / "cancelled"
    _prefect(
        env, "deployment", "run", "retrain/manual", "--param", f"config_path={cfg}", "--param", "run_name=cancelled"
    )
    # (the deployment keeps its id across deploy and serve: pick this run among the earlier test's)
    [flow_run] = [
        r
        for r in _flow_runs(env, _deployment(env, "retrain/manual")["id"])
        if r["parameters"].get("run_name") == "cancelled"
    ]
    wait_registered(run, 0, timeout_s=300, alive=lambda: serve.poll() is None)
    _prefect(env, "flow-run", "cancel", flow_run["id"])
    cancelled_at, state = time.monotonic(), None
    while time.monotonic() - cancelled_at < 90:
        state = _flow_run(env, flow_run["id"])["state"]["type"]
        if state == "CANCELLED":
            break
        time.sleep(0.5)
    assert state == "CANCELLED", (tmp_path / "serve.log").read_text()[-4000:]
    starts = [e for e in read_events(str(run)) if e["event"] == "worker_start"]
    time.sleep(5)  # a retried train task would start a new worker group now
    assert [e for e in read_events(str(run)) if e["event"] == "worker_start"] == starts and len(
        starts
    ) == 1  # one worker
    assert checkpoints_on_disk(str(run)), "the checkpoint a rerun resumes from is gone"


def _flow_run(env: dict[str, str], flow_run_id: str) -> dict:
    return _api(env, "GET", f"/flow_runs/{flow_run_id}")


def _served(env: dict[str, str], name: str, config_path: str) -> bool:
    try:
        dep = _deployment(env, name)
    except urllib.error.HTTPError:
        return False
    return not dep["pull_steps"] and dep["parameters"] == {"config_path": config_path}


@pytest.mark.usefixtures("prefect_harness")
def test_watch_data_emits_only_when_the_files_change(tmp_path):
    """The watch flow, run in this process: the first look records the table's files, a look at the same files finds
    them unchanged (no event), a touched file (new modification time, same bytes) is a change (the event that starts
    retrain/scheduled: test_deploy_worker_and_deployment_run)."""
    from trainflow.flows.watch import watch_data

    cfg = churn_config(tmp_path, rows=200)
    first = watch_data(str(cfg))
    assert first["changed"] is False and first["previous"] is None
    assert watch_data(str(cfg)) == {**first, "previous": first["fingerprint"]}
    train = tmp_path / "data" / "train.parquet"
    os.utime(train, (time.time() + 10, time.time() + 10))
    changed = watch_data(str(cfg))
    assert changed["changed"] is True and changed["previous"] == first["fingerprint"] != changed["fingerprint"]
