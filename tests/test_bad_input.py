"""Bad input: a short message naming the file/column/value, exit status 2, nothing written."""

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from tests.conftest import churn_config, empty_mlflow_store, write_parquet
from trainflow.flows.cli import main as cli_main
from trainflow.tables.sample import make_churn_table

pytestmark = pytest.mark.usefixtures("prefect_harness", "ray_local")


def _nothing_written(tmp_path):
    assert not (tmp_path / "out").exists(), "predictions were written"
    assert not (tmp_path / "runs").exists(), "a training run was started"
    db = tmp_path / "mlflow.db"  # the empty store the test put there, as it was
    assert not db.exists() or db.read_bytes() == empty_mlflow_store().read_bytes(), "MLflow was written"


def _run(capsys, cfg, *extra):
    rc = cli_main(["retrain", "--config", str(cfg), *extra])
    return rc, capsys.readouterr().err


def _with_table(tmp_path, table):
    cfg = churn_config(tmp_path)
    write_parquet(table, tmp_path / "data" / "train.parquet")
    return cfg


@pytest.mark.parametrize(
    "case, needle",
    [
        ("missing_path", "no such file or folder"),
        ("empty_table", "has no rows"),
        ("empty_table_task_unset", "train.parquet: the table has no rows"),
        ("no_labels_task_unset", "label column 'churned' has no value in any of its 300 rows"),
        ("missing_label", "label column 'churned' not found"),
        ("missing_feature", "feature column(s) ['nope'] not found"),
        ("missing_id", "id column 'customer_id' not found"),
        ("nan_label", "label column 'churned' has 3 missing"),
        ("one_class", "only one class"),
        ("too_many_classes", "has 150 classes over"),
        ("quantity_as_classes", "holds 332 distinct numbers over 3,000 rows"),
        ("two_valued_regression", "under task: regression holds at most two values"),
        ("score_missing_column", "inference input"),
        ("score_missing_file", "inference.input"),
        ("bad_config_key", "train.epochz: unknown key"),
        ("local_mode", "scaling.num_workers: the retrain pipeline needs at least 1 Ray Train worker"),
        ("gpu_without_gpus", "asks for 2 worker(s) x (CPU 1, GPU 1) but this cluster can place only 0"),
        ("too_many_workers", "asks for 5 worker(s) x (CPU 1) but this cluster can place only 2 (node 0: CPU 2)"),
        ("score_wrong_kind", "column 'age' is text or date (string) but the training table"),
        ("score_null_ids", "id column 'customer_id' is empty in 2 row(s)"),
        ("score_unseen_error", "column 'plan' has category 'platinum' that the model never saw"),
        ("duplicate_columns", "column name(s) ['age'] appear more than once"),
        ("semicolon_csv", "the header reads as one column: if ';' separates its values, set data.csv.delimiter: ';'"),
        ("tab_csv_task_unset", 'if "\\t" separates its values, set data.csv.delimiter: "\\t"'),
        ("reserved_id", "id_column: 'prediction' is a name the predictions use"),
        ("overlapping_output", "overlaps data.path"),
        ("user_folder_output", "holds files trainflow did not write (notes.txt)"),
    ],
)
def test_bad_training_input(tmp_path, capsys, case, needle):
    base = make_churn_table(300, seed=1)
    if case == "missing_path":
        cfg = churn_config(tmp_path, data={"path": "data/absent.parquet"})
    elif case == "empty_table":
        cfg = _with_table(tmp_path, base.slice(0, 0))
    elif case in ("empty_table_task_unset", "no_labels_task_unset"):  # nothing to tell the task from: said as such
        cfg = churn_config(tmp_path, task=None)
        unlabelled = base.set_column(base.schema.get_field_index("churned"), "churned", pa.nulls(300, pa.int64()))
        write_parquet(
            base.slice(0, 0) if case == "empty_table_task_unset" else unlabelled, tmp_path / "data" / "train.parquet"
        )
    elif case == "missing_label":
        cfg = _with_table(tmp_path, base.drop_columns(["churned"]))
    elif case == "missing_feature":
        cfg = churn_config(tmp_path, data={"features": ["age", "nope"]})
    elif case == "missing_id":
        cfg = _with_table(tmp_path, base.drop_columns(["customer_id"]))
    elif case == "nan_label":
        y = base["churned"].to_numpy().astype(float)
        y[[3, 50, 90]] = np.nan
        cfg = _with_table(tmp_path, base.set_column(base.schema.get_field_index("churned"), "churned", pa.array(y)))
    elif case == "one_class":
        cfg = _with_table(
            tmp_path,
            base.set_column(base.schema.get_field_index("churned"), "churned", pa.array(np.zeros(300, np.int64))),
        )
    elif case == "too_many_classes":  # a quantity in whole units under task: classification (2 rows a class)
        y = pa.array(np.arange(300, dtype=np.int64) // 2)
        cfg = _with_table(tmp_path, base.set_column(base.schema.get_field_index("churned"), "churned", y))
    elif case == "quantity_as_classes":  # whole numbers, about 9 rows each, under an explicit task: classification
        big = make_churn_table(3000, seed=1)
        y = pa.array(np.random.default_rng(0).integers(0, 332, 3000), pa.int64())  # every one of 332 values used
        cfg = _with_table(tmp_path, big.set_column(big.schema.get_field_index("churned"), "churned", y))
    elif case == "two_valued_regression":  # a 0/1 class under task: regression
        cfg = churn_config(tmp_path, task="regression", checkpoint={"metric": "val_loss"})
    elif case == "score_missing_column":
        cfg = churn_config(tmp_path)
        write_parquet(
            make_churn_table(50, seed=3, with_label=False).drop_columns(["region"]), tmp_path / "data" / "score.parquet"
        )
    elif case == "score_missing_file":
        cfg = churn_config(tmp_path, inference={"input": "data/absent.parquet"})
        needle = f"inference.input {tmp_path / 'data' / 'absent.parquet'}: no such file or folder"
    elif case == "gpu_without_gpus":
        cfg = churn_config(tmp_path, scaling={"num_workers": 2, "use_gpu": True})
    elif case == "too_many_workers":
        cfg = churn_config(tmp_path, scaling={"num_workers": 5})
    elif case in ("score_wrong_kind", "score_null_ids", "score_unseen_error"):
        score = make_churn_table(50, seed=3, with_label=False)
        if case == "score_wrong_kind":
            score = score.set_column(
                score.schema.get_field_index("age"),
                "age",
                pa.array([None if v is None else str(v) for v in score["age"].to_pylist()]),
            )
        elif case == "score_null_ids":
            ids = score["customer_id"].to_pylist()
            ids[4] = ids[9] = None
            score = score.set_column(
                score.schema.get_field_index("customer_id"), "customer_id", pa.array(ids, pa.int64())
            )
        else:
            plans = score["plan"].to_pylist()
            score = score.set_column(score.schema.get_field_index("plan"), "plan", pa.array(["platinum"] + plans[1:]))
        cfg = churn_config(tmp_path, inference={"on_unseen": "error"})
        write_parquet(score, tmp_path / "data" / "score.parquet")
    elif case == "duplicate_columns":
        (tmp_path / "data").mkdir()
        doubled = pa.Table.from_arrays([*base.columns, base["age"]], names=[*base.column_names, "age"])
        pacsv.write_csv(doubled, tmp_path / "data" / "train.csv")
        cfg = churn_config(tmp_path, data={"path": "data/train.csv"})
    elif case in ("semicolon_csv", "tab_csv_task_unset"):  # a CSV whose values another character separates
        (tmp_path / "data").mkdir()
        pacsv.write_csv(
            base, tmp_path / "data" / "train.csv", pacsv.WriteOptions(delimiter=";" if case[0] == "s" else "\t")
        )
        task = {"task": None} if case == "tab_csv_task_unset" else {}
        cfg = churn_config(tmp_path, data={"path": "data/train.csv"}, **task)
    elif case == "reserved_id":
        cfg = churn_config(tmp_path, data={"id_column": "prediction"})
    elif case == "overlapping_output":
        cfg = churn_config(tmp_path, inference={"output": "data"})
    elif case == "user_folder_output":
        cfg = churn_config(tmp_path)
        (tmp_path / "out" / "predictions").mkdir(parents=True)
        (tmp_path / "out" / "predictions" / "notes.txt").write_text("mine")
    elif case == "local_mode":
        cfg = churn_config(tmp_path, scaling={"num_workers": 0})
    else:
        cfg = churn_config(tmp_path, train={"epochz": 3})
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    rc, err = _run(capsys, cfg)
    assert rc == 2, err
    assert needle in err
    assert "Traceback" not in err and "distinct whole numbers" not in err  # (no task guessed from no values)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before  # every file byte-identical
    if case != "user_folder_output":
        _nothing_written(tmp_path)


def test_text_in_a_numeric_csv_column_is_named(tmp_path, capsys):
    table = make_churn_table(400, seed=1)
    ages = [str(v) if v is not None else "" for v in table["age"].to_pylist()]
    ages[17] = "forty-two"
    table = table.set_column(table.schema.get_field_index("age"), "age", pa.array(ages))
    (tmp_path / "data").mkdir()
    pacsv.write_csv(table, tmp_path / "data" / "train.csv")
    cfg = churn_config(tmp_path, data={"path": "data/train.csv"})
    rc, err = _run(capsys, cfg)
    assert rc == 2 and "column 'age'" in err and "'forty-two'" in err
    _nothing_written(tmp_path)


def test_unwritable_output_fails_before_training(tmp_path, capsys):
    blocker = tmp_path / "file-not-folder"
    blocker.write_text("x")
    cfg = churn_config(tmp_path, inference={"output": str(blocker / "predictions")})
    rc, err = _run(capsys, cfg)
    assert rc == 2 and "is a file, not a folder" in err
    assert not (tmp_path / "runs").exists()


def test_a_run_name_that_cannot_be_a_folder_is_refused_before_anything_starts(tmp_path, capsys):
    # (with --force no skip check runs first; before, the flow started, with its Prefect server, and its first task
    # refused the name seconds later)
    from prefect.client.orchestration import get_client

    cfg = churn_config(tmp_path)
    with get_client(sync_client=True) as client:
        runs = client.count_flow_runs()
        for name in ("../escape", "a b/c", "x" * 129):
            rc, err = _run(capsys, cfg, "--force", "--run-name", name)
            assert rc == 2 and f"run name {name!r}: use letters, digits, '.', '_' or '-' (at most 128)" in err, err
            assert "Traceback" not in err
        assert client.count_flow_runs() == runs  # no flow run started
    _nothing_written(tmp_path)


def test_monitors_and_predicts_mistakes_are_answered_before_anything_starts(tmp_path, capsys):
    # (each was the flow's own error, 10-11 s later, after Prefect's server and the flow run had started)
    from prefect.client.orchestration import get_client

    from trainflow.tables.outputs import write_output

    cfg = churn_config(tmp_path)
    output = tmp_path / "out" / "predictions"
    labels = tmp_path / "labels.parquet"
    write_parquet(make_churn_table(20, seed=5).select(["customer_id", "age"]), labels)
    cases = [
        (
            ["--set", "inference.input=null", "--set", "inference.output=null"],
            "monitor reads the predictions under inference.output; set it",
        ),
        ([], f"{output}: no trainflow predictions here to monitor"),
        (["--labels", str(tmp_path / "nope.parquet")], f"labels table {tmp_path / 'nope.parquet'}: no such file"),
        (["--labels", str(labels)], f"{labels}: column 'churned' not found; columns are ['customer_id', 'age']"),
    ]
    with get_client(sync_client=True) as client:
        runs = client.count_flow_runs()
        for k, (extra, needle) in enumerate(cases):
            if k == 2:  # predictions trainflow wrote, from here on
                write_output(pa.table({"customer_id": [1], "prediction": [0]}), str(output), 1, {"model": "m"})
            assert cli_main(["monitor", "--config", str(cfg), *extra]) == 2
            err = capsys.readouterr().err
            assert needle in err and "Traceback" not in err, err
        # a scoring table that is not there
        assert cli_main(["predict", "--config", str(cfg), "--set", "inference.input=data/absent.parquet"]) == 2
        assert f"inference.input {tmp_path / 'data' / 'absent.parquet'}: no such file or folder" in (
            capsys.readouterr().err
        )
        assert client.count_flow_runs() == runs  # no flow run started
