"""Delta Lake and Apache Iceberg tables read at one snapshot, for real (local Delta tables written by `deltalake`,
pyiceberg's SQL catalog on SQLite): a run records the snapshot it read in its summary, its card, MLflow's dataset input
and the model version's tags; a rerun of the same run name reads that snapshot although the table grew, so it finds
its work done; data.snapshot pins an older one; a snapshot or table that does not exist, and a table format read as
plain Parquet files, are refused naming them."""

from __future__ import annotations

import json

import deltalake
import mlflow
import pytest

from tests.conftest import xgboost_config
from trainflow.flows.cli import main as cli_main
from trainflow.tables.sample import make_churn_table

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness", "ray_local")]


def _config(tmp_path, data: dict, **extra) -> str:
    return xgboost_config(tmp_path, data, "sourced", **extra)


def _retrain(cfg: str, out, *args: str) -> dict:
    assert cli_main(["retrain", "--config", cfg, "--summary-json", str(out), *args]) == 0
    return json.loads(out.read_text())


def test_a_delta_table_is_read_at_its_version_and_a_rerun_reads_what_the_first_attempt_read(tmp_path, capsys):
    table = tmp_path / "lake" / "customers"
    deltalake.write_deltalake(str(table), make_churn_table(1500, seed=1))  # version 0
    deltalake.write_deltalake(str(table), make_churn_table(500, seed=3, id_offset=50_000), mode="append")  # 1
    cfg = _config(tmp_path, {"path": "lake/customers", "format": "delta"})
    first = _retrain(cfg, tmp_path / "s1.json", "--run-name", "nightly")
    snap = first["data_snapshot"]
    assert (snap["format"], snap["snapshot"], first["training_rows"]) == ("delta", 1, 2000)
    assert snap["table"] == str(table) and first["data_fingerprint"].startswith("snapshot:")
    # recorded where a person and a script look: the model version's tags and MLflow's dataset input
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    version = client.get_model_version("sourced", str(first["model_version"]))
    assert json.loads(version.tags["trainflow.data_snapshot"])["snapshot"] == 1
    inputs = client.get_run(version.run_id).inputs.dataset_inputs
    assert {i.dataset.name for i in inputs} == {"customers@1 (training)", "customers@1 (validation)"}
    # the table grows; the watch deployment's look sees the new version (from the log, no rows read); the same run
    # name reads version 1 again: the same data, so the finished run is found
    from trainflow.config import load_config
    from trainflow.flows.watch import source_fingerprint

    data = load_config(cfg).data
    before = source_fingerprint(data)
    assert source_fingerprint(data) == before == first["data_fingerprint"]
    deltalake.write_deltalake(str(table), make_churn_table(700, seed=4, id_offset=90_000), mode="append")  # 2
    assert source_fingerprint(data) != before
    again = _retrain(cfg, tmp_path / "s2.json", "--run-name", "nightly")
    assert again["data_snapshot"]["snapshot"] == 1 and again["model_version"] == first["model_version"]
    # data.snapshot pins an older version ("last Tuesday's table"; a whole retrain of it: the Iceberg test below)
    from trainflow.tables.sources import read_arrow, resolve_snapshot

    data = load_config(cfg, {"data.snapshot": 0}).data
    assert read_arrow(data, resolve_snapshot(data)).num_rows == 1500
    capsys.readouterr()
    # refused by name: a version the table does not have; the table's Parquet files read as a plain folder
    assert cli_main(["retrain", "--config", cfg, "--set", "data.snapshot=7"]) == 2
    assert "no version 7" in capsys.readouterr().err
    plain = _config(tmp_path, {"path": "lake/customers"})
    assert cli_main(["retrain", "--config", plain]) == 2
    assert "a Delta table; read it as one (data.format: delta)" in capsys.readouterr().err
    # today's version lost a column the champion was trained on: the check against the champion's training data
    # (made on the snapshot the champion read) refuses it before anything trains, naming the column
    fewer = make_churn_table(700, seed=5, id_offset=95_000).drop_columns(["age"])
    deltalake.write_deltalake(str(table), fewer, mode="overwrite", schema_mode="overwrite")  # 3
    cfg = _config(tmp_path, {"path": "lake/customers", "format": "delta"})  # (the plain one was written over it)
    assert cli_main(["validate", "--config", cfg]) == 2
    err = capsys.readouterr().err
    assert "fails validation against sourced version 1" in err and "gone ['age']" in err, err[-2000:]


def test_an_iceberg_table_is_read_at_a_snapshot_of_its_catalog_and_a_missing_one_is_named(tmp_path, capsys):
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = {"uri": f"sqlite:///{tmp_path / 'catalog.db'}", "warehouse": f"file://{tmp_path / 'warehouse'}"}
    first_rows = make_churn_table(1500, seed=1)
    iceberg = SqlCatalog("default", **catalog)
    iceberg.create_namespace("crm")
    customers = iceberg.create_table("crm.customers", schema=first_rows.schema)
    customers.append(first_rows)
    oldest = customers.current_snapshot().snapshot_id
    customers.append(make_churn_table(500, seed=3, id_offset=50_000))
    cfg = _config(tmp_path, {"path": "crm.customers", "format": "iceberg", "catalog": catalog})
    s = _retrain(cfg, tmp_path / "s.json", "--set", f"data.snapshot={oldest}")
    assert (s["data_snapshot"]["snapshot"], s["training_rows"]) == (oldest, 1500)
    assert s["data_snapshot"]["table_id"] == str(customers.metadata.table_uuid)
    capsys.readouterr()
    assert cli_main(["retrain", "--config", cfg, "--set", "data.snapshot=12345"]) == 2
    assert "crm.customers: the Iceberg table has no snapshot 12345" in capsys.readouterr().err
    assert cli_main(["retrain", "--config", cfg, "--set", "data.path=crm.orders"]) == 2
    assert "the Iceberg catalog has no table 'crm.orders'" in capsys.readouterr().err
    # the catalog's credentials never reach what trainflow shows
    secret = {**catalog, "s3.secret-access-key": "hunter2-very-secret"}
    assert cli_main(["config", "show", "--config", cfg, "--set", f"data.catalog={json.dumps(secret)}"]) == 0
    assert "hunter2-very-secret" not in capsys.readouterr().out


def test_a_pin_record_storage_holds_for_another_table_is_not_followed_nor_overwritten(tmp_path):
    """The run name's record is a claim read from storage: one naming another table (another id) or a snapshot other
    than data.snapshot is not followed, and the run's own first record is never overwritten."""
    from trainflow.config import load_config
    from trainflow.tasks.ingest import SOURCE_SUFFIX, pin_source

    table = tmp_path / "lake" / "customers"
    deltalake.write_deltalake(str(table), make_churn_table(300, seed=1))
    deltalake.write_deltalake(str(table), make_churn_table(300, seed=2, id_offset=5_000), mode="append")  # 1
    config = load_config(_config(tmp_path, {"path": "lake/customers", "format": "delta"}))
    record = tmp_path / "runs" / f"nightly{SOURCE_SUFFIX}"
    record.parent.mkdir(parents=True)
    planted = {"format": "delta", "table": str(table), "snapshot": 0, "table_id": "someone-elses-table"}
    record.write_text(json.dumps(planted))
    assert pin_source.fn(config, "nightly").data.snapshot == 1  # the table's current version, not the planted 0
    assert json.loads(record.read_text()) == planted  # left as it was
    # the run's own record is followed: a rerun of another name reads its first attempt's version after growth
    first = pin_source.fn(config, "weekly")
    deltalake.write_deltalake(str(table), make_churn_table(300, seed=3, id_offset=9_000), mode="append")  # 2
    assert first.data.snapshot == 1 and pin_source.fn(config, "weekly").data.snapshot == 1
    # a pin to another version than the config's data.snapshot is not followed either
    pinned = config.model_copy(update={"data": config.data.model_copy(update={"snapshot": 2})})
    assert pin_source.fn(pinned, "weekly").data.snapshot == 2


def test_orc_files_are_a_table_like_any_other_picked_by_their_extension_and_fingerprinted(tmp_path, capsys):
    """ORC (one file and one registry line in trainflow/tables/sources/): a folder of .orc files trains, its scoring
    table predicts every row, an unchanged folder is found unchanged (its fingerprint from the files' bytes), a new
    file is new data; a path ending in .orc needs no data.format; its decoded size comes from a decoded stripe."""
    import pyarrow.dataset as pads
    import pyarrow.orc as orc

    from trainflow.config import load_config
    from trainflow.flows.watch import source_fingerprint
    from trainflow.tables.files import in_memory_bytes, list_files

    folder = tmp_path / "orc"
    folder.mkdir()
    first, second = make_churn_table(1200, seed=1), make_churn_table(800, seed=3, id_offset=50_000)
    orc.write_table(first, folder / "part-0.orc")
    orc.write_table(second, folder / "part-1.orc")
    (folder / "notes.txt").write_text("not a table")  # another extension: not read
    orc.write_table(make_churn_table(300, seed=2, with_label=False, id_offset=90_000), tmp_path / "score.orc")
    out = tmp_path / "predictions"
    cfg = _config(tmp_path, {"path": "orc", "format": "orc"}, inference={"input": "score.orc", "output": str(out)})
    s = _retrain(cfg, tmp_path / "s1.json")
    assert s["training_rows"] == 2000 and s["data_fingerprint"].startswith("content:")
    assert s["output_rows"] == 300 == pads.dataset(out, format="parquet").to_table().num_rows
    again = _retrain(cfg, tmp_path / "s2.json")
    assert again["skipped"]["champion_version"] == s["model_version"]
    data = load_config(cfg).data
    before = source_fingerprint(data)
    orc.write_table(make_churn_table(400, seed=4, id_offset=70_000), folder / "part-2.orc")
    assert source_fingerprint(data) != before
    capsys.readouterr()
    assert cli_main(["retrain", "--config", cfg, "--set", "data.format=xlsx"]) == 2
    err = capsys.readouterr().err
    assert "data.format" in err and "'orc'" in err and "'xlsx'" in err, err
    # a file that is not ORC though it is named so: refused naming it, nothing trained
    (folder / "part-3.orc").write_bytes(b"not an orc file at all")
    assert cli_main(["retrain", "--config", cfg]) == 2
    err = capsys.readouterr().err
    assert "part-3.orc" in err and "as orc" in err, err[-2000:]
    # (these configs replace the one above) a folder of .orc files named without data.format: the hint says how
    assert cli_main(["retrain", "--config", _config(tmp_path, {"path": "orc"})]) == 2
    assert "holds no .parquet files (it holds orc files:" in capsys.readouterr().err
    one = load_config(_config(tmp_path, {"path": "orc/part-0.orc"})).data
    assert one.format == "orc"
    fs, files = list_files(one.path, one.format)
    assert 0.5 < in_memory_bytes(fs, files, "orc") / first.nbytes < 2
