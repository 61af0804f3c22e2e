"""Split and preprocessing on real Ray Data: fit on train only, vectorised transform, JSON round trip."""

import json

import numpy as np
import pyarrow as pa
import pytest
import ray.data

from preprocessors.tabular import SchemaDriftError, TabularPreprocessor
from trainflow.config import DataSection
from trainflow.data import SPLIT_KEY, apply_preprocessor, check_columns, fit_preprocessor, split_table, table_spec
from trainflow.errors import DataError

pytestmark = pytest.mark.usefixtures("ray_local")


def _table(n=400, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(5.0, 2.0, n)
    mask = np.zeros(n, bool)
    mask[::10] = True
    return pa.table(
        {
            "id": np.arange(n),
            "x (cm)": pa.array(x, mask=mask),
            "flag": pa.array(rng.random(n) < 0.3),
            "colour": pa.array(rng.choice(["red", "green", "blue"], n).astype(object), mask=np.arange(n) % 7 == 0),
            "y": np.where(rng.random(n) < 0.25, "yes", "no"),
        }
    )


def _spec(table):
    data = DataSection(path="mem", label="y", id_column="id")
    return table_spec(table.schema, data, "classification", "mem")


def test_check_columns_classifies_and_rejects():
    table = _table()
    spec = _spec(table)
    assert spec.numeric == ["x (cm)", "flag"] and spec.categorical == ["colour"]
    with pytest.raises(DataError, match="label column 'nope' not found"):
        check_columns(table.schema, DataSection(path="m", label="nope"), "classification", "m")
    with pytest.raises(DataError, match="regression needs a numeric label"):
        check_columns(table.schema, DataSection(path="m", label="y"), "regression", "m")
    with_list = table.append_column("tags", pa.array([[1]] * table.num_rows))
    with pytest.raises(DataError, match="'tags' has type list"):
        check_columns(with_list.schema, DataSection(path="m", label="y"), "classification", "m")


def _ids(ds) -> np.ndarray:
    return np.concatenate([b["id"] for b in ds.iter_batches(batch_format="numpy")])


def test_stratified_split_is_seeded_exact_per_class_and_shuffles_train():
    train, val, n_train, n_val = split_table(ray.data.from_arrow(_table(1000)), "classification", "y", 0.2, seed=3)
    val_ids, train_ids = np.sort(_ids(val)), _ids(train)
    assert len(np.intersect1d(val_ids, train_ids)) == 0 and len(val_ids) + len(train_ids) == 1000
    assert (len(train_ids), len(val_ids)) == (n_train, n_val)
    # exactly int(n_class * 0.2) validation rows of each class, as Ray's stratified split counts them
    y = _table(1000)["y"].to_numpy(zero_copy_only=False)
    for cls in ("yes", "no"):
        assert (y[val_ids] == cls).sum() == int((y == cls).sum() * 0.2)
    # SGD sees the training rows in a shuffled order, not the file's
    assert not np.array_equal(train_ids, np.sort(train_ids))
    # the same seed gives the same split; another seed another one
    _, val2, _, _ = split_table(ray.data.from_arrow(_table(1000)), "classification", "y", 0.2, seed=3)
    assert np.array_equal(val_ids, np.sort(_ids(val2)))
    _, val3, _, _ = split_table(ray.data.from_arrow(_table(1000)), "classification", "y", 0.2, seed=4)
    assert not np.array_equal(val_ids, np.sort(_ids(val3)))


def test_regression_split_holds_out_the_fraction():
    train, val, n_train, n_val = split_table(ray.data.from_arrow(_table(1000)), "regression", "x (cm)", 0.25, seed=1)
    assert (n_train, n_val) == (750, 250) == (train.count(), val.count())
    assert SPLIT_KEY not in val.schema().names and set(_ids(train)) | set(_ids(val)) == set(range(1000))


def test_fit_uses_train_only_and_transform_matches_numpy():
    table = _table()
    spec = _spec(table)
    train_part = table.slice(0, 300)
    prep = fit_preprocessor(ray.data.from_arrow(train_part), spec, "classification")
    x = train_part["x (cm)"].to_numpy(zero_copy_only=False)
    assert prep.numeric["x (cm)"]["mean"] == pytest.approx(np.nanmean(x))
    assert prep.numeric["x (cm)"]["std"] == pytest.approx(np.nanstd(x))
    assert prep.classes == ["no", "yes"]
    assert prep.categorical["colour"]["categories"] == ["blue", "green", "red"]
    assert prep.num_features == 2 + 3

    out = prep.transform_batch(table.slice(300, 100))
    feats = out["features"]
    assert feats.dtype == np.float32 and feats.shape == (100, 5)
    xs = table.slice(300, 100)["x (cm)"].to_numpy(zero_copy_only=False)
    expected = (np.where(np.isnan(xs), np.nanmean(x), xs) - np.nanmean(x)) / np.nanstd(x)
    np.testing.assert_allclose(feats[:, 0], expected, rtol=1e-5)
    assert np.allclose(feats[:, 2:].sum(axis=1), 1.0)  # one-hot, nulls imputed with the most frequent
    assert set(out["label"]) <= {0, 1}


def test_ray_transform_equals_inference_transform_after_json_round_trip(tmp_path):
    table = _table()
    spec = _spec(table)
    prep = fit_preprocessor(ray.data.from_arrow(table), spec, "classification")
    prep.save(tmp_path)
    assert json.loads((tmp_path / "preprocessor.json").read_text())["task"] == "classification"
    loaded = TabularPreprocessor.load(tmp_path)
    packed = apply_preprocessor(ray.data.from_arrow(table), prep).take_batch(table.num_rows, batch_format="numpy")
    np.testing.assert_array_equal(packed["features"], loaded.transform_features(table, strict=True))


def test_schema_drift_is_named():
    table = _table()
    prep = fit_preprocessor(ray.data.from_arrow(table), _spec(table), "classification")
    with pytest.raises(SchemaDriftError, match="'colour' has category 'purple'"):
        prep.transform_features(table.set_column(3, "colour", pa.array(["purple"] * table.num_rows)), strict=True)
    with pytest.raises(SchemaDriftError, match="column 'x \\(cm\\)' is missing"):
        prep.transform_features(table.drop_columns(["x (cm)"]), strict=True)
    # lenient mode (validation rows) encodes an unseen category as all zeros
    lenient = prep.transform_features(table.set_column(3, "colour", pa.array(["purple"] * table.num_rows)), strict=False)
    assert lenient[:, 2:].sum() == 0


def test_globs_and_csv_folders_read_every_matching_file(tmp_path):
    import pyarrow.csv as pacsv

    from trainflow.data import read_table

    (tmp_path / "csv").mkdir()
    for i in range(3):
        pacsv.write_csv(pa.table({"x": [i, i + 10], "y": [0, 1]}), tmp_path / "csv" / f"part-{i}.csv")
    (tmp_path / "csv" / "_SUCCESS").write_text("")  # markers are not data
    ds, files, _ = read_table(str(tmp_path / "csv"), "csv")
    assert [f.rsplit("/", 1)[-1] for f in files] == ["part-0.csv", "part-1.csv", "part-2.csv"]
    assert sorted(r["x"] for r in ds.take_all()) == [0, 1, 2, 10, 11, 12]
    ds, files, _ = read_table(str(tmp_path / "csv" / "part-[02].csv"), "csv")
    assert len(files) == 2 and ds.count() == 4
    with pytest.raises(DataError, match="the pattern matches no files"):
        read_table(str(tmp_path / "csv" / "*.parquet"), "parquet")


def test_input_example_is_a_typical_row_from_the_fitted_state():
    from trainflow.tracking import example_input

    table = _table().append_column("visits", pa.array(np.arange(400) % 5))
    spec = _spec(table)
    prep = fit_preprocessor(ray.data.from_arrow(table), spec, "classification")
    example = example_input(prep, spec.mlflow_types)
    assert list(example.columns) == prep.feature_order and len(example) == 1
    row = example.iloc[0]
    assert row["x (cm)"] == pytest.approx(prep.numeric["x (cm)"]["mean"])
    assert row["visits"] == 2 and row["flag"] == False  # noqa: E712 - a numpy bool
    assert row["colour"] == prep.categorical["colour"]["fill"]
    # the model's own transform takes it like any scoring row
    assert prep.transform_features(pa.Table.from_pandas(example, preserve_index=False), strict=True).shape == (1, prep.num_features)
