"""A PostgreSQL table or query as the training table, against a real server started here (PostgreSQL 15's binaries):
a run copies what it reads once, in one read-only transaction, to its storage as Parquet, records the copy (server,
query, rows) in its summary, MLflow's dataset input and the model version's tags, and a rerun of its run name reads
that copy although the table grew, with the server gone; the password is never written; a wrong password, a server
that does not answer, a bad query, a query with no rows and a query that would write are refused naming them."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest

from tests.conftest import free_port, write_parquet, xgboost_config
from tests.servers import Postgres
from trainflow.flows.cli import main as cli_main
from trainflow.tables.sample import make_churn_table

pytestmark = [pytest.mark.usefixtures("prefect_harness", "ray_local")]


@pytest.fixture(scope="module")
def postgres():
    server = Postgres(free_port())
    server.load("churn", make_churn_table(1500, seed=1))
    yield server
    server.close()


@pytest.fixture
def password(monkeypatch):
    """libpq's own PGPASSWORD: where a config's password comes from (never the config)."""
    monkeypatch.setenv("PGPASSWORD", Postgres.PASSWORD)


def _config(tmp_path, data: dict, **extra) -> str:
    return xgboost_config(tmp_path, data, "from-postgres", **extra)


def _files_holding(root: Path, secret: str) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and secret.encode() in path.read_bytes():
            found.append(str(path))
    return found


@pytest.mark.e2e
def test_a_postgres_table_is_copied_once_per_run_and_a_rerun_reads_the_copy(tmp_path, postgres, password):
    postgres.execute("CREATE TABLE nightly AS SELECT * FROM churn")
    # the predictions into a PostgreSQL table given no inference.connection: data.connection's server, kept after
    # the source is read from its copy
    write_parquet(make_churn_table(200, seed=2, with_label=False, id_offset=10_000), tmp_path / "score.parquet")
    inference = {"input": "score.parquet", "output": "nightly_scores", "output_format": "postgres"}
    cfg = _config(tmp_path, {"table": "nightly", "connection": postgres.connection}, inference=inference)
    out = tmp_path / "s1.json"
    assert cli_main(["retrain", "--config", cfg, "--summary-json", str(out), "--run-name", "nightly"]) == 0
    first = json.loads(out.read_text())
    assert postgres.execute("SELECT count(*) FROM public.nightly_scores")[0][0] == 200 == first["output_rows"]
    snap = first["data_snapshot"]
    assert (snap["format"], snap["table"], snap["rows"]) == ("postgres", "nightly", 1500)
    assert snap["server"] == f"127.0.0.1:{postgres.port}/postgres" and snap["query"] == 'SELECT * FROM "nightly"'
    assert first["training_rows"] == 1500 and Path(snap["location"]).is_dir()
    # recorded where a person and a script look: the model version's tags and MLflow's dataset input
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    version = client.get_model_version("from-postgres", str(first["model_version"]))
    assert json.loads(version.tags["trainflow.data_snapshot"])["copy_id"] == snap["copy_id"]
    inputs = client.get_run(version.run_id).inputs.dataset_inputs
    assert {i.dataset.name for i in inputs} == {
        f"nightly@{snap['copied_at']} ({r})" for r in ("training", "validation")
    }

    # the table grows: the watch deployment's look (the row count, one query) sees it; the same run name, with the
    # server gone, reads its copy and finds its work done
    from trainflow.config import load_config
    from trainflow.flows.watch import source_fingerprint

    data = load_config(cfg).data
    before = source_fingerprint(data)
    assert source_fingerprint(data) == before
    postgres.load("nightly", make_churn_table(500, seed=3, id_offset=50_000), mode="append")
    assert source_fingerprint(data) != before
    postgres.stop()
    try:
        out = tmp_path / "s2.json"
        assert cli_main(["retrain", "--config", cfg, "--summary-json", str(out), "--run-name", "nightly"]) == 0
    finally:
        postgres.start()
    again = json.loads(out.read_text())
    assert again["model_version"] == first["model_version"] and again["data_snapshot"] == snap
    # the password is in no file the runs wrote (storage, MLflow's store and artifacts, the summaries)
    assert _files_holding(tmp_path, Postgres.PASSWORD) == []


def test_a_copy_is_one_transaction_reused_by_its_run_name_and_a_doubtful_record_is_not_followed(
    tmp_path, postgres, password, monkeypatch
):
    from trainflow.config import load_config
    from trainflow.errors import DataError
    from trainflow.tables.postgres import SqlSource, copy_to_parquet
    from trainflow.tasks.ingest import SOURCE_SUFFIX, pin_source

    query = "SELECT * FROM churn WHERE plan <> 'basic' ORDER BY customer_id;"
    cfg = _config(tmp_path, {"sql": query, "connection": postgres.connection})
    raw = load_config(cfg)
    pinned = pin_source.fn(raw, "r1")
    record = pinned.data.copied_from
    assert pinned.data.format == "parquet" and pinned.data.path == record["location"]
    import pyarrow.dataset as pads

    copy = pads.dataset(record["location"]).to_table()
    expected = postgres.execute("SELECT count(*) FROM churn WHERE plan <> 'basic'")[0][0]
    assert copy.num_rows == record["rows"] == expected > 0
    assert copy.column("customer_id").to_pylist() == sorted(copy.column("customer_id").to_pylist())

    # its run name again, with the server gone: the same copy, no connection made
    postgres.stop()
    try:
        assert pin_source.fn(raw, "r1").data.copied_from == record
    finally:
        postgres.start()

    # a record naming files outside this run's copies (a shared bucket someone else writes to) is not followed: a
    # new copy is made, and the record is left as it was
    where = Path(raw.storage_path) / f"r2{SOURCE_SUFFIX}"
    planted = {**record, "location": str(tmp_path / "elsewhere"), "files": [str(tmp_path / "elsewhere/x.parquet")]}
    where.write_text(json.dumps(planted))
    fresh = pin_source.fn(raw, "r2").data.copied_from
    assert fresh["location"].startswith(str(Path(raw.storage_path) / "r2-source-")) and fresh["rows"] == expected
    assert json.loads(where.read_text()) == planted
    # nor one that passes the prefix but leads out of it (`..`)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "part-00000.parquet").write_bytes(next(Path(record["location"]).glob("part-*.parquet")).read_bytes())
    escaping = f"{Path(raw.storage_path)}/r4-source-0badc0de/../../outside"
    planted = {**record, "location": escaping, "files": [f"{escaping}/part-00000.parquet"]}
    (Path(raw.storage_path) / f"r4{SOURCE_SUFFIX}").write_text(json.dumps(planted))
    fresh = pin_source.fn(raw, "r4").data.copied_from
    assert fresh["location"] != escaping and fresh["location"].startswith(str(Path(raw.storage_path) / "r4-source-"))
    # the copy is the owner's only, as its record is: files 0600 in a 0700 folder
    import stat

    modes = {stat.S_IMODE(f.stat().st_mode) for f in Path(fresh["location"]).glob("part-*.parquet")}
    assert modes == {0o600} and stat.S_IMODE(Path(fresh["location"]).stat().st_mode) == 0o700

    # a copy killed (SIGKILL) before its record was written left its folder: the run name's next copy removes it,
    # and nothing that is not such a copy (another name, a file trainflow does not write)
    storage = Path(raw.storage_path)
    killed, theirs, other = storage / "r3-source-0badc0de", storage / "r3-source-1badc0de", storage / "r3-sources"
    for folder in (killed, theirs, other):
        folder.mkdir()
        (folder / "part-00000.parquet").write_bytes(next(Path(record["location"]).glob("part-*.parquet")).read_bytes())
    (theirs / "notes.txt").write_text("someone else's")
    assert pin_source.fn(raw, "r3").data.copied_from["rows"] == expected
    assert not killed.exists() and theirs.exists() and other.exists()

    # a query that would write is refused by the read-only transaction, and writes nothing; one with no rows is
    # refused, leaving no folder behind
    source = SqlSource.of(raw.data)
    for sql, said in (
        ("DELETE FROM churn RETURNING *", "read-only transaction"),
        ("SELECT * FROM churn WHERE false", "returned no rows"),
    ):
        folder = tmp_path / "copies" / "one"
        with pytest.raises(DataError, match=said):
            copy_to_parquet(SqlSource(source.connection, sql), str(folder))
        assert not folder.exists()
    assert postgres.execute("SELECT count(*) FROM churn")[0][0] == 1500

    # the server goes away in the middle of the copy: an error naming it (exit 1: run it again), the copy's folder
    # removed, nothing recorded; back, the same run name copies again
    import threading

    from trainflow.errors import InfrastructureError

    slow = SqlSource(source.connection, "SELECT c.*, pg_sleep(0.002) FROM churn c")  # about 3 s of rows
    folder = tmp_path / "copies" / "gone"
    stopper = threading.Timer(1.0, postgres.stop)
    stopper.start()
    try:
        with pytest.raises(InfrastructureError, match=f"PostgreSQL at 127.0.0.1:{postgres.port}/postgres went away"):
            copy_to_parquet(slow, str(folder))
    finally:
        stopper.join()
        postgres.start()
    assert not folder.exists()

    # the backend serving the copy frozen (SIGSTOP: no reset, the socket open, nothing sent): the read is
    # cancelled once services.database_read_s passes with no batch, an error naming the server (exit 1: run it
    # again), the copy's folder removed; nothing waits for the backend
    import os
    import signal

    from trainflow.run.services import WAITS

    monkeypatch.setattr(WAITS, "database_read", 3.0)
    slower = SqlSource(source.connection, "SELECT c.*, pg_sleep(0.005) FROM churn c")  # about 8 s of rows
    folder = tmp_path / "copies" / "frozen"
    frozen: list[int] = []

    def freeze() -> None:
        found = postgres.execute(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE '%pg_sleep(0.005)%' AND pid <> pg_backend_pid()"
        )
        frozen.extend(pid for (pid,) in found)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)

    freezer = threading.Timer(1.0, freeze)
    freezer.start()
    try:
        with pytest.raises(InfrastructureError, match=rf"127.0.0.1:{postgres.port}/postgres sent nothing for 3 s"):
            copy_to_parquet(slower, str(folder))
    finally:
        freezer.join()
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    assert frozen and not folder.exists()

    # the watch deployment's watermark: max(data.watermark), one aggregate query; a row with a newer value moves it
    # (a column name with a double quote is quoted as such; a query ending in a comment is read as written)
    from trainflow.flows.watch import source_fingerprint

    postgres.execute('CREATE TABLE marked AS SELECT *, customer_id AS "seen""at" FROM churn WHERE customer_id < 100')
    marked = load_config(cfg, {"data.sql": None, "data.table": "marked", "data.watermark": 'seen"at'}).data
    before = source_fingerprint(marked)
    postgres.execute("UPDATE marked SET age = age + 1")  # no new maximum: the same watermark
    assert source_fingerprint(marked) == before
    postgres.execute('INSERT INTO marked SELECT *, customer_id AS "seen""at" FROM churn WHERE customer_id = 100')
    assert source_fingerprint(marked) != before
    commented = load_config(cfg, {"data.sql": "SELECT * FROM marked -- every row", "data.watermark": 'seen"at'})
    assert source_fingerprint(commented.data) != before


def test_a_wrong_password_a_server_away_and_a_bad_query_are_refused_naming_them(
    tmp_path, postgres, monkeypatch, capsys
):
    monkeypatch.setenv("PGPASSWORD", Postgres.PASSWORD)
    cfg = _config(tmp_path, {"table": "churn", "connection": postgres.connection}, task=None)

    def validate(*sets: str) -> tuple[int, str]:
        code = cli_main(["validate", "--config", cfg, *(a for s in sets for a in ("--set", s))])
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    # the label's values decide the task, read by one query of the label column
    code, said = validate()
    assert code == 0 and "task: classification" in said, said
    # a password in the URI: refused before anything connects, and not shown
    code, said = validate(
        f"data.connection=postgresql://trainflow:{Postgres.PASSWORD}@127.0.0.1:{postgres.port}/postgres"
    )
    assert code == 2 and "carries a password" in said and Postgres.PASSWORD not in said
    for key in ("password", "sslpassword"):
        code, said = validate(f"data.connection={postgres.connection}?{key}={Postgres.PASSWORD}")
        assert code == 2 and f"carries its {key}= parameter" in said and Postgres.PASSWORD not in said, said
    code, said = validate("data.label=churn")
    assert code == 2 and "'churn' is not a column of PostgreSQL table churn on 127.0.0.1" in said, said
    for sql, expected in (
        ("selec * from churn", 'syntax error at or near "selec"'),
        ("SELECT * FROM orders", 'relation "orders" does not exist'),
    ):
        code, said = validate("data.table=null", f"data.sql={sql}")
        assert code == 2 and f"data.sql: PostgreSQL on 127.0.0.1:{postgres.port}/postgres refused it" in said, said
        assert expected in said
    # the password from a Prefect Secret block instead of the environment; a block that does not exist is named
    from prefect.blocks.system import Secret

    Secret(value=Postgres.PASSWORD).save("warehouse-password", overwrite=True)
    monkeypatch.delenv("PGPASSWORD")
    code, said = validate("data.password_secret=warehouse-password")
    assert code == 0 and Postgres.PASSWORD not in said, said
    code, said = validate("data.password_secret=no-such-block")
    assert code == 2 and "data.password_secret: no Prefect Secret block 'no-such-block'" in said, said
    monkeypatch.setenv("PGPASSWORD", "not-the-password")
    code, said = validate()
    assert code == 2 and f"cannot connect to PostgreSQL at 127.0.0.1:{postgres.port}/postgres" in said, said
    assert "password authentication failed" in said and "PGPASSWORD" in said
    # a server that does not answer: waited for as services.database_wait_s says, then exit 1 naming it
    away = free_port()
    code, said = validate(
        f"data.connection=postgresql://trainflow@127.0.0.1:{away}/postgres", "services.database_wait_s=2"
    )
    assert code == 1 and f"PostgreSQL at 127.0.0.1:{away}/postgres did not answer" in said, said
    assert "services.database_wait_s" in said


def test_a_copy_into_an_object_store_is_recorded_there_and_read_back_by_its_run_name(
    tmp_path, postgres, password, moto_server
):
    """storage_path on S3 (moto's server): the copy's files and its record are written there, and the run name's
    next attempt reads them back instead of copying again."""
    import pyarrow.dataset as pads

    from tests.conftest import BUCKET
    from trainflow.config import load_config
    from trainflow.run.storage import filesystem_for, read_text
    from trainflow.tasks.ingest import SOURCE_SUFFIX, pin_source

    cfg = _config(
        tmp_path, {"table": "churn", "connection": postgres.connection}, storage_path=f"s3://{BUCKET}/pg-runs"
    )
    config = load_config(cfg)
    record = pin_source.fn(config, "s3run").data.copied_from
    assert record["location"].startswith(f"s3://{BUCKET}/pg-runs/s3run-source-") and record["rows"] == 1500
    stored = json.loads(read_text(f"s3://{BUCKET}/pg-runs/s3run{SOURCE_SUFFIX}"))
    assert stored["copy_id"] == record["copy_id"] and all(
        f.startswith(record["location"] + "/") for f in stored["files"]
    )
    fs, inner = filesystem_for(record["location"])
    assert pads.dataset(inner, filesystem=fs).count_rows() == 1500
    postgres.stop()  # the next attempt needs no server: it reads what storage holds
    try:
        assert pin_source.fn(config, "s3run").data.copied_from == record
    finally:
        postgres.start()
