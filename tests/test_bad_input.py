"""Bad input: a short message naming the file/column/value, exit status 2, nothing written."""

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from tests.conftest import churn_config, write_parquet
from trainflow.cli import main as cli_main
from trainflow.sample import make_churn_table

pytestmark = pytest.mark.usefixtures("prefect_harness", "ray_local")


def _nothing_written(tmp_path):
    assert not (tmp_path / "out").exists(), "predictions were written"
    assert not (tmp_path / "runs").exists(), "a training run was started"
    assert not (tmp_path / "mlflow.db").exists(), "MLflow was written"


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
        ("missing_label", "label column 'churned' not found"),
        ("missing_feature", "feature column(s) ['nope'] not found"),
        ("missing_id", "id column 'customer_id' not found"),
        ("nan_label", "label column 'churned' has 3 missing"),
        ("one_class", "only one class"),
        ("score_missing_column", "inference input"),
        ("bad_config_key", "train.epochz: unknown key"),
        ("local_mode", "scaling.num_workers: the retrain pipeline needs at least 1 Ray Train worker"),
        ("gpu_without_gpus", "asks for 2 worker(s) x (CPU 1, GPU 1) but this cluster can place only 0"),
        ("too_many_workers", "asks for 5 worker(s) x (CPU 1) but this cluster can place only 2 (node 0: CPU 2)"),
    ],
)
def test_bad_training_input(tmp_path, capsys, case, needle):
    base = make_churn_table(300, seed=1)
    if case == "missing_path":
        cfg = churn_config(tmp_path, data={"path": "data/absent.parquet"})
    elif case == "empty_table":
        cfg = _with_table(tmp_path, base.slice(0, 0))
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
        cfg = _with_table(tmp_path, base.set_column(base.schema.get_field_index("churned"), "churned", pa.array(np.zeros(300, np.int64))))
    elif case == "score_missing_column":
        cfg = churn_config(tmp_path)
        write_parquet(make_churn_table(50, seed=3, with_label=False).drop_columns(["region"]), tmp_path / "data" / "score.parquet")
    elif case == "gpu_without_gpus":
        cfg = churn_config(tmp_path, scaling={"num_workers": 2, "use_gpu": True})
    elif case == "too_many_workers":
        cfg = churn_config(tmp_path, scaling={"num_workers": 5})
    elif case == "local_mode":
        cfg = churn_config(tmp_path, scaling={"num_workers": 0})
    else:
        cfg = churn_config(tmp_path, train={"epochz": 3})
    rc, err = _run(capsys, cfg)
    assert rc == 2, err
    assert needle in err
    assert "Traceback" not in err
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
