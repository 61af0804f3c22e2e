"""Predictions appended to a table as one commit per scoring run, for real: a local Delta table, an Iceberg table of
pyiceberg's SQL catalog, a PostgreSQL table on a server started here. Each row carries the model version and the
scoring run's id; a retry of a scoring run appends nothing twice; a run that fails mid-write leaves the table as it
was; an existing table of other columns is refused before anything is scored, naming them; a folder of other files
is never written into."""

from __future__ import annotations

import json
from pathlib import Path

import deltalake
import pyarrow as pa
import pytest
import yaml

from tests.conftest import free_port, write_parquet, xgboost_config
from tests.servers import Postgres
from trainflow.flows.cli import main as cli_main
from trainflow.tables.sample import make_churn_table

pytestmark = [pytest.mark.usefixtures("prefect_harness", "ray_local")]
SCORED = 300


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One retrain whose predictions go to a new Delta table (the model the other checks score with)."""
    tmp = tmp_path_factory.mktemp("sinks")
    write_parquet(make_churn_table(1500, seed=1), tmp / "train.parquet")
    write_parquet(make_churn_table(SCORED, seed=2, with_label=False, id_offset=10_000), tmp / "score.parquet")
    cfg = xgboost_config(
        tmp,
        {"path": "train.parquet"},
        "scored",
        inference={"input": "score.parquet", "output": "lake/scores", "output_format": "delta"},
    )
    out = tmp / "summary.json"
    assert cli_main(["retrain", "--config", cfg, "--run-name", "nightly", "--summary-json", str(out)]) == 0
    return tmp, cfg, json.loads(out.read_text())


@pytest.fixture(scope="module")
def postgres():
    server = Postgres(free_port())
    yield server
    server.close()


def _pg_sets(postgres, table: str) -> dict[str, str]:
    return {
        "inference.output_format": "postgres",
        "inference.output": table,
        "inference.connection": postgres.connection,
    }


def _predict(cfg: str, capsys, *sets: str) -> tuple[int, str]:
    code = cli_main(["predict", "--config", cfg, *(a for s in sets for a in ("--set", s))])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_a_retrain_appends_its_predictions_to_a_delta_table_as_one_commit(trained, capsys):
    tmp, cfg, summary = trained
    table = deltalake.DeltaTable(str(tmp / "lake" / "scores"))
    rows = table.to_pyarrow_table()
    assert (table.version(), rows.num_rows, summary["output_rows"]) == (0, SCORED, SCORED)
    assert set(rows.column("model_version").to_pylist()) == {f"models:/scored/{summary['model_version']}"}
    assert set(rows.column("scoring_run").to_pylist()) == {"nightly"}
    assert rows.column_names == [
        "customer_id",
        "prediction",
        "proba_0",
        "proba_1",
        "model_version",
        "scoring_run",
        "scored_at",
    ]
    assert table.metadata().description == "trainflow predictions"
    # a predict appends its own commit; the first stays as it was
    code, said = _predict(cfg, capsys)
    assert code == 0, said
    table = deltalake.DeltaTable(str(tmp / "lake" / "scores"))
    runs = table.to_pyarrow_table().column("scoring_run").to_pylist()
    assert table.version() == 1 and len(runs) == 2 * SCORED and runs.count("nightly") == SCORED
    # monitor reads the newest scoring run's rows from the table and joins the labels that arrived since
    labels = make_churn_table(SCORED, seed=2, id_offset=10_000).select(["customer_id", "churned"])
    write_parquet(labels, tmp / "labels.parquet")
    out = tmp / "monitor.json"
    assert (
        cli_main(["monitor", "--config", cfg, "--labels", str(tmp / "labels.parquet"), "--summary-json", str(out)]) == 0
    )
    watched = json.loads(out.read_text())["monitor"]
    assert watched["rows"] == SCORED and watched["model_version"] == str(summary["model_version"]), watched

    # a Delta table of other columns: refused before scoring, naming them, and left as it was
    other = tmp / "lake" / "theirs"
    deltalake.write_deltalake(str(other), pa.table({"customer_id": [1], "score": [0.5]}))
    code, said = _predict(cfg, capsys, f"inference.output={other}")
    assert code == 2 and "lacks column(s) ['prediction'" in said and "has column(s) ['score']" in said, said
    assert deltalake.DeltaTable(str(other)).version() == 0
    # a folder of other files is not a Delta table trainflow writes into
    (tmp / "reports").mkdir()
    (tmp / "reports" / "q3.csv").write_text("a\n1\n")
    code, said = _predict(cfg, capsys, f"inference.output={tmp / 'reports'}")
    assert code == 2 and "holds files that are not a Delta table (q3.csv)" in said, said


def test_a_scoring_run_is_one_commit_retried_once_and_a_failed_write_leaves_each_table_as_it_was(
    trained, postgres, monkeypatch, capsys
):
    from pyiceberg.catalog.sql import SqlCatalog

    from trainflow.tables import sinks
    from trainflow.config import load_config

    tmp, cfg, summary = trained
    monkeypatch.setenv("PGPASSWORD", Postgres.PASSWORD)
    catalog = {"uri": f"sqlite:///{tmp / 'catalog.db'}", "warehouse": f"file://{tmp / 'warehouse'}"}
    SqlCatalog("default", **catalog).create_namespace("crm")
    targets = {
        "postgres": ("inference.output_format=postgres", "inference.output=public.scores")
        + (f"inference.connection={postgres.connection}",),
        "iceberg": ("inference.output_format=iceberg", "inference.output=crm.scores")
        + (f"inference.catalog={json.dumps(catalog)}",),
    }

    def count(kind: str) -> int:
        if kind == "postgres":
            return postgres.execute("SELECT count(*) FROM public.scores")[0][0]
        return SqlCatalog("default", **catalog).load_table("crm.scores").scan().to_arrow().num_rows

    real = sinks.with_run_columns

    def dies(batches, model, run_id):
        yield next(real(batches, model, run_id))
        raise ConnectionError("the scoring process died mid-write")

    for kind, sets in targets.items():
        code, said = _predict(cfg, capsys, *sets)  # the table is created with the first scoring run's rows
        assert code == 0, said
        assert count(kind) == SCORED
        # a write that fails after its first batch (a killed process, a lost connection): nothing is committed
        monkeypatch.setattr(sinks, "with_run_columns", dies)
        code, said = _predict(cfg, capsys, *sets, "inference.batch_size=50")
        assert code != 0 and "died mid-write" in said, said
        monkeypatch.setattr(sinks, "with_run_columns", real)
        assert count(kind) == SCORED
        # a retry of a committed scoring run appends nothing
        config = load_config(cfg, {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in sets)})
        sink = sinks.Sink.of(config)
        batch = pa.table({"customer_id": [1], "prediction": [0], "proba_0": [0.5], "proba_1": [0.5]})
        run = sink.columns() and "retried-run"
        assert sinks.write_sink(batch, sink, 1, "models:/scored/1", run) == 1
        assert sinks.write_sink(batch, sink, 1, "models:/scored/1", run) == 1
        assert count(kind) == SCORED + 1
        # what monitor joins labels to: the newest scoring run's rows and the model that made them
        model, newest = sink.latest()
        assert model == "models:/scored/1" and newest.column("scoring_run").to_pylist() == ["retried-run"], kind

    # a PostgreSQL table of other columns (someone else's): refused before scoring, naming them; never altered
    postgres.execute("CREATE TABLE public.theirs (customer_id bigint, score double precision)")
    code, said = _predict(
        cfg, capsys, *targets["postgres"][:1], "inference.output=public.theirs", targets["postgres"][2]
    )
    assert code == 2 and "PostgreSQL table public.theirs, which trainflow did not create" in said, said
    assert postgres.execute("SELECT count(*) FROM public.theirs")[0][0] == 0
    # a retrain into it is refused before the table is read or anything trained
    into_theirs = (*targets["postgres"][:1], "inference.output=public.theirs", targets["postgres"][2])
    code = cli_main(["retrain", "--config", cfg, "--force", *(a for s in into_theirs for a in ("--set", s))])
    said = capsys.readouterr().err
    assert code == 2 and "PostgreSQL table public.theirs, which trainflow did not create" in said, said
    assert "epoch" not in said and Path(tmp / "lake" / "scores").is_dir()

    # a bare name is the table the server resolves it to (search_path "$user", public): a user's own table there
    # (the schema named as the login) is refused and left as it was, comment included, and nothing goes to public
    for sql in (
        f"CREATE SCHEMA {Postgres.USER}",
        f"CREATE TABLE {Postgres.USER}.churn_scores AS SELECT * FROM public.scores",
        f"COMMENT ON TABLE {Postgres.USER}.churn_scores IS 'finance team table: do not modify'",
    ):
        postgres.execute(sql)
    bare = (*targets["postgres"][:1], "inference.output=churn_scores", targets["postgres"][2])
    code, said = _predict(cfg, capsys, *bare)
    assert code == 2 and f"the PostgreSQL table {Postgres.USER}.churn_scores, which trainflow did not" in said, said
    assert postgres.execute(
        f"SELECT obj_description('{Postgres.USER}.churn_scores'::regclass), to_regclass('public.churn_scores')"
    ) == [("finance team table: do not modify", None)]
    # a bare name no table has yet: created in current_schema(), and that one table is checked, counted and read
    config = load_config(cfg, _pg_sets(postgres, "fresh_scores"))
    sink = sinks.Sink.of(config)
    assert sinks.write_sink(batch, sink, 1, "models:/scored/1", "bare-run") == 1
    assert sinks.write_sink(batch, sink, 1, "models:/scored/1", "bare-run") == 1  # a retry: nothing twice
    assert postgres.execute(
        f"SELECT count(*), obj_description('{Postgres.USER}.fresh_scores'::regclass) FROM {Postgres.USER}.fresh_scores"
    ) == [(1, "trainflow predictions")]
    assert sink.latest()[0] == "models:/scored/1"
    # another model under the same scoring run's name is not a retry: refused, nothing written
    with pytest.raises(sinks.DataError, match="already holds scoring run 'bare-run'.s predictions of"):
        sinks.write_sink(batch, sink, 1, "models:/scored/2", "bare-run")
    assert postgres.execute(f"SELECT count(*) FROM {Postgres.USER}.fresh_scores")[0][0] == 1
    # a class name PostgreSQL would cut to 63 bytes is refused before a table is made, naming the column
    long_class = "c" * 60
    with pytest.raises(sinks.DataError, match=f"proba_{long_class}.*longer than PostgreSQL's 63 bytes"):
        sinks.Sink.of(load_config(cfg, _pg_sets(postgres, "long_scores"))).check(
            sinks.prediction_columns("customer_id", [0, long_class])
        )
