"""Split and preprocessing on real Ray Data: fit on train only, vectorised transform, JSON round trip."""

import json
import re

import numpy as np
import pyarrow as pa
import pytest
import ray.data

from trainflow.preprocessors.tabular import SchemaDriftError, TabularPreprocessor
from trainflow.config import DataSection
from trainflow.data import arrow_schema
from trainflow.trainer.shards import TableShard
from trainflow.preprocessors.fit import apply_preprocessor, fit_preprocessor
from trainflow.tables.files import check_columns, table_spec
from trainflow.errors import DataError

pytestmark = pytest.mark.usefixtures("ray_local")


def split_table(ds, task: str, label: str, fraction: float, seed: int, key_columns: list[str], materialize: bool):
    """A seeded train/validation split without a test role, by the fold plan: (train, val, train_rows, val_rows)."""
    from trainflow.data import split_roles
    from trainflow.roles.plan import plan_split
    from trainflow.roles.folds import TRAIN, VALIDATION

    plan = plan_split(ds, task, label, 0.0, fraction, seed, key_columns, rows=0)
    parts = split_roles(ds, plan, materialize)
    return parts[TRAIN], parts[VALIDATION], plan.counts["train"], plan.counts["validation"]


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


def test_split_is_seeded_stratified_and_the_same_rows_materialized_or_streamed():
    table = _table(1000)
    # a class of 3 rows (fewer than 1 / 0.2) keeps them all for training
    table = table.set_column(
        table.schema.get_field_index("y"), "y", pa.array(["rare"] * 3 + table["y"].to_pylist()[3:])
    )
    ds = ray.data.from_arrow(table)
    train, val, n_train, n_val = split_table(ds, "classification", "y", 0.2, 3, ["id"], materialize=True)
    val_ids, train_ids = np.sort(_ids(val)), _ids(train)
    assert len(np.intersect1d(val_ids, train_ids)) == 0 and len(val_ids) + len(train_ids) == 1000
    assert (len(train_ids), len(val_ids)) == (n_train, n_val)
    # each class gets about a fifth of its rows in validation (a hash, not an exact count)
    y = table["y"].to_numpy(zero_copy_only=False)
    for cls in ("yes", "no"):
        assert abs((y[val_ids] == cls).sum() / (y == cls).sum() - 0.2) < 0.05
    assert not {0, 1, 2} & set(val_ids.tolist())
    # SGD sees the materialized training rows in a shuffled order, not the file's
    assert not np.array_equal(train_ids, np.sort(train_ids))
    # streamed (lazy, nothing materialized): exactly the same rows on each side
    train_s, val_s, n_train_s, n_val_s = split_table(ds, "classification", "y", 0.2, 3, ["id"], materialize=False)
    assert np.array_equal(val_ids, np.sort(_ids(val_s))) and (n_train_s, n_val_s) == (n_train, n_val)
    assert np.array_equal(np.sort(train_ids), np.sort(_ids(train_s)))
    # the same seed gives the same split; another seed another one
    _, val3, _, _ = split_table(ds, "classification", "y", 0.2, 4, ["id"], materialize=True)
    assert not np.array_equal(val_ids, np.sort(_ids(val3)))


def test_regression_split_holds_out_the_fraction():
    ds = ray.data.from_arrow(_table(1000))
    train, val, n_train, n_val = split_table(ds, "regression", "x (cm)", 0.25, 1, ["x (cm)", "colour", "id"], True)
    assert (n_train, n_val) == (train.count(), val.count()) and abs(n_val - 250) < 50
    assert set(_ids(train)) | set(_ids(val)) == set(range(1000))


def test_fit_uses_train_only_and_transform_matches_numpy():
    table = _table()
    spec = _spec(table)
    train_part = table.slice(0, 300)
    prep = fit_preprocessor(ray.data.from_arrow(train_part), spec, "classification")
    x = train_part["x (cm)"].to_numpy(zero_copy_only=False)
    assert prep.numeric["x (cm)"]["mean"] == pytest.approx(np.nanmean(x))
    assert prep.numeric["x (cm)"]["std"] == pytest.approx(np.nanstd(x))
    assert (prep.numeric["x (cm)"]["min"], prep.numeric["x (cm)"]["max"]) == pytest.approx((np.nanmin(x), np.nanmax(x)))
    assert prep.classes == ["no", "yes"]
    # a missing text value is a category of its own; x had missing values, so it gets an indicator
    assert prep.categorical["colour"]["categories"] == ["<missing>", "blue", "green", "red"]
    assert prep.numeric["x (cm)"]["na"] and not prep.numeric["flag"]["na"]
    assert prep.feature_names() == [
        "x (cm)",
        "x (cm)_na",
        "flag",
        "colour=<missing>",
        "colour=blue",
        "colour=green",
        "colour=red",
    ]

    batch = table.slice(300, 100)
    out = prep.transform_batch(batch)
    feats = out["features"]
    assert feats.dtype == np.float32 and feats.shape == (100, 7)
    xs = batch["x (cm)"].to_numpy(zero_copy_only=False)
    # values outside the training range are clipped to it before scaling
    clipped = np.clip(np.where(np.isnan(xs), np.nanmean(x), xs), np.nanmin(x), np.nanmax(x))
    assert (clipped != np.where(np.isnan(xs), np.nanmean(x), xs)).any()  # the check below covers clipping
    np.testing.assert_allclose(feats[:, 0], (clipped - np.nanmean(x)) / np.nanstd(x), rtol=1e-5)
    np.testing.assert_array_equal(feats[:, 1], np.isnan(xs))
    assert np.allclose(feats[:, 3:].sum(axis=1), 1.0)
    np.testing.assert_array_equal(feats[:, 3], batch["colour"].is_null().to_numpy(zero_copy_only=False))
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
    lenient = prep.transform_features(
        table.set_column(3, "colour", pa.array(["purple"] * table.num_rows)), strict=False
    )
    assert lenient[:, 3:].sum() == 0


def test_globs_and_csv_folders_read_every_matching_file(tmp_path):
    import pyarrow.csv as pacsv

    from trainflow.data import read_table

    (tmp_path / "csv").mkdir()
    for i in range(3):
        pacsv.write_csv(pa.table({"x": [i, i + 10], "y": [0, 1]}), tmp_path / "csv" / f"part-{i}.csv")
    (tmp_path / "csv" / "_SUCCESS").write_text("")  # markers are not data
    (tmp_path / "csv" / "csv_notes.md").write_text("mine")  # matched by its real extension, not a substring
    ds, files, _ = read_table(str(tmp_path / "csv"), "csv")
    assert [f.rsplit("/", 1)[-1] for f in files] == ["part-0.csv", "part-1.csv", "part-2.csv"]
    assert sorted(r["x"] for r in ds.take_all()) == [0, 1, 2, 10, 11, 12]
    ds, files, _ = read_table(str(tmp_path / "csv" / "part-[02].csv"), "csv")
    assert len(files) == 2 and ds.count() == 4
    with pytest.raises(DataError, match="the pattern matches no files"):
        read_table(str(tmp_path / "csv" / "*.parquet"), "parquet")
    # another dialect: semicolons, single quotes, Latin-1 text, read as the config's data.csv says
    from trainflow.config import CsvSection

    (tmp_path / "latin").mkdir()
    (tmp_path / "latin" / "t.csv").write_bytes("city;n\n'Zürich; Süd';1\n'Besançon';2\n".encode("latin-1"))
    dialect = CsvSection(delimiter=";", quote_char="'", encoding="latin-1")
    ds, _, _ = read_table(str(tmp_path / "latin"), "csv", csv=dialect)
    assert [r["city"] for r in ds.take_all()] == ["Zürich; Süd", "Besançon"]
    ds, _, _ = read_table(str(tmp_path / "latin"), "csv", csv=CsvSection(delimiter=";", quote_char="'"))
    with pytest.raises(DataError, match="column 'city' holds text that is not UTF-8; set data.csv.encoding"):
        check_columns(arrow_schema(ds, "t"), DataSection(path="t.csv", label="n"), "regression", "t")


@pytest.mark.parametrize(
    "labels, classes",
    [
        (pa.array([1, 2, 1, 2] * 25, pa.decimal128(5, 1)), [1.0, 2.0]),
        (pa.array([True, False, False, True] * 25), [False, True]),
    ],
)
def test_decimal_and_boolean_labels_fit_and_round_trip_as_json(tmp_path, labels, classes):
    table = pa.table({"x": np.arange(100, dtype=float), "y": labels})
    spec = table_spec(table.schema, DataSection(path="mem", label="y"), "classification", "mem")
    prep = fit_preprocessor(ray.data.from_arrow(table), spec, "classification")
    prep.save(tmp_path)
    loaded = TabularPreprocessor.load(tmp_path)
    assert loaded.classes == classes
    idx = loaded.transform_label(table)
    assert [classes[i] for i in idx[:4]] == [float(v) if not isinstance(v, bool) else v for v in labels[:4].to_pylist()]


def test_input_example_is_a_typical_row_from_the_fitted_state():
    from trainflow.tasks.model_package import example_input

    table = _table().append_column("visits", pa.array(np.arange(400) % 5))
    spec = _spec(table)
    prep = fit_preprocessor(ray.data.from_arrow(table), spec, "classification")
    example = example_input(prep, spec.mlflow_types)
    assert list(example.columns) == prep.feature_order and len(example) == 1
    row = example.iloc[0]
    assert row["x (cm)"] == pytest.approx(prep.numeric["x (cm)"]["mean"])
    assert row["visits"] == 2 and row["flag"] == False  # noqa: E712 - a numpy bool
    assert row["colour"] == prep.categorical["colour"]["mode"] == "green"
    # the model's own transform takes it like any scoring row
    assert prep.transform_features(pa.Table.from_pandas(example, preserve_index=False), strict=True).shape == (
        1,
        prep.num_features,
    )


def _wide_table(n=3000, seed=0):
    """A 1,000-value product code (a few values rare), a 3-value region, and a numeric column."""
    rng = np.random.default_rng(seed)
    codes = np.array([f"P{i:04d}" for i in range(1000)], dtype=object)
    product = codes[rng.integers(0, 1000, n)]
    product[0] = "RARE-ONCE"  # seen in training fewer than min_frequency times
    return pa.table(
        {
            "id": np.arange(n),
            "product": pa.array(product),
            "region": pa.array(rng.choice(["n", "s", "e"], n).astype(object)),
            "amount": rng.normal(size=n),
            "y": (rng.random(n) < 0.5).astype(np.int64),
        }
    )


def test_wide_text_is_embedded_with_rare_values_and_unseen_values_on_the_unknown_code():
    from trainflow.config import PreprocessSection
    from trainflow.preprocessors.fit import check_unseen, count_unseen

    table = _wide_table()
    spec = table_spec(table.schema, DataSection(path="mem", label="y", id_column="id"), "classification", "mem")
    prep = fit_preprocessor(ray.data.from_arrow(table), spec, "classification", PreprocessSection(min_frequency=2))
    assert set(prep.embedded) == {"product"} and set(prep.categorical) == {"region"}
    vocab = prep.embedded["product"]["categories"]
    counts = {v: c for v, c in zip(*np.unique(table["product"].to_numpy(zero_copy_only=False), return_counts=True))}
    assert vocab == sorted(v for v, c in counts.items() if c >= 2) and "RARE-ONCE" not in vocab and len(vocab) > 700
    # fastai's rule: min(600, round(1.6 * n ** 0.56)) over the vocabulary plus the unknown code
    assert prep.embedded["product"]["dim"] == round(1.6 * (len(vocab) + 1) ** 0.56)
    # the packed width does not grow with the cardinality: one code column for 1,000 values
    assert prep.num_features == 1 + 3 + 1 and prep.embedding_slots() == [
        (0, len(vocab) + 1, prep.embedded["product"]["dim"])
    ]
    packed = prep.transform_features(table)
    rare = np.array([counts[v] < 2 for v in table["product"].to_pylist()])
    assert rare[0] and (packed[rare, 0] == 0).all()  # rare values share the unknown code
    assert packed[~rare, 0].min() >= 1 and packed[:, 0].max() == len(vocab)

    scoring = table.slice(0, 50).set_column(1, "product", pa.array(["NEW-1"] * 10 + [vocab[1]] * 40))
    x = prep.transform_features(scoring)
    assert (x[:10, 0] == 0).all() and (x[10:, 0] == 2).all()
    # JSON round trip keeps the vocabularies, and the network takes the packed rows
    from trainflow.trainer.families.network import model_for

    loaded = TabularPreprocessor.from_dict(json.loads(json.dumps(prep.to_dict())))
    net = model_for(loaded, {"hidden_sizes": [8], "dropout": 0.0})
    import torch

    assert net(torch.from_numpy(x)).shape == (50, 2)
    # counted per column, and a clear error when the user asked for strict inference
    unseen = count_unseen(ray.data.from_arrow(scoring), prep)
    assert unseen == {"product": {"rows": 10, "example": "NEW-1"}}
    with pytest.raises(DataError, match="column 'product' has category 'NEW-1'.*10 row"):
        check_unseen(unseen, prep, "score.parquet")


def test_dates_and_iso_text_become_numeric_parts():
    import datetime

    from trainflow.preprocessors.fit import check_text_columns

    n = 200
    base = datetime.datetime(2013, 1, 1, 5, 0)
    stamps = [base + datetime.timedelta(hours=7 * i) for i in range(n)]
    table = pa.table(
        {
            "when": pa.array(stamps, pa.timestamp("us")),
            "when_text": pa.array(
                [None if i % 10 == 0 else s.strftime("%Y-%m-%d %H:%M:%S") for i, s in enumerate(stamps)]
            ),
            "y": np.arange(n, dtype=np.float64),
        }
    )
    spec = table_spec(table.schema, DataSection(path="mem", label="y"), "regression", "mem")
    assert spec.dates == ["when"] and spec.categorical == ["when_text"]
    check_text_columns(ray.data.from_arrow(table), spec, parse_dates=True, source="mem")
    assert spec.dates == ["when", "when_text"] and spec.categorical == []
    prep = fit_preprocessor(ray.data.from_arrow(table), spec, "regression")
    names = prep.feature_names()
    assert names[:8] == [
        f"when_{p}" for p in ("year", "month", "day", "dayofweek", "dayofyear", "elapsed", "hour", "minute")
    ]
    assert names[-1] == "when_text_na" and "when_na" not in names
    x = prep.transform_features(table)
    year = prep.dates["when"]["stats"]["year"]
    np.testing.assert_allclose(x[:, 0] * year["std"] + year["mean"], [s.year for s in stamps], rtol=1e-5)
    hour = prep.dates["when"]["stats"]["hour"]
    np.testing.assert_allclose(x[:, 6] * hour["std"] + hour["mean"], [s.hour for s in stamps], atol=1e-4)
    # the text column gives the same parts where present, and its missing indicator where not
    present = np.arange(n) % 10 != 0
    hour_t = prep.dates["when_text"]["stats"]["hour"]
    np.testing.assert_allclose(
        (x[:, 14] * hour_t["std"] + hour_t["mean"])[present], np.array([s.hour for s in stamps])[present], atol=1e-4
    )
    np.testing.assert_array_equal(x[:, -1], [i % 10 == 0 for i in range(n)])


def test_a_packed_row_too_wide_for_memory_fails_naming_the_column_and_an_oom_is_recognised():
    from ray.exceptions import OutOfMemoryError

    from trainflow.config import PreprocessSection
    from trainflow.trainer.memory import check_packed_size, is_out_of_memory

    table = _wide_table()
    spec = table_spec(table.schema, DataSection(path="mem", label="y", id_column="id"), "classification", "mem")
    # every value one-hot (a user's max_onehot far above the column's 1,000 values)
    wide = fit_preprocessor(ray.data.from_arrow(table), spec, "classification", PreprocessSection(max_onehot=5000))
    assert wide.num_features > 900
    with pytest.raises(DataError, match="'product' \\([0-9]+ one-hot features\\).*preprocess.max_onehot"):
        check_packed_size(wide, 10**6, batch_rows=512, num_workers=2, memory_bytes=16 * 2**20, source="t.parquet")
    # with the default the column is embedded and the same budget holds
    narrow = fit_preprocessor(ray.data.from_arrow(table), spec, "classification")
    est = check_packed_size(narrow, 10**6, batch_rows=512, num_workers=2, memory_bytes=16 * 2**20, source="t.parquet")
    assert est["bytes_per_row"] == narrow.num_features * 4 + 8
    try:
        try:
            raise OutOfMemoryError("Task was killed due to the node running low on memory.")
        except OutOfMemoryError as inner:
            raise RuntimeError("Training failed") from inner
    except RuntimeError as exc:
        assert is_out_of_memory(exc)
    assert not is_out_of_memory(RuntimeError("worker 1: injected failure in epoch 1"))


def test_distinct_text_values_are_counted_in_bounded_memory():
    from trainflow.preprocessors.fit import BoundedValueCounter, aggregate as aggregate_streaming

    # 20,000 one-off ids (a UUID-like column nobody declared) and three values seen 500 times each, in 8 blocks
    ids = [f"u{i:06d}" for i in range(20_000)] + ["hot-a"] * 500 + ["hot-b"] * 500 + ["hot-c"] * 500 + [None] * 7
    rng = np.random.default_rng(0)
    ds = ray.data.from_arrow(pa.table({"u": pa.array(list(rng.permutation(np.array(ids, dtype=object))))})).repartition(
        8
    )
    counted = aggregate_streaming(ds, [BoundedValueCounter("u", alias_name="c", keep=64)])["c"]
    assert len(counted["values"]) <= 64
    got = dict(zip(counted["values"], counted["counts"]))
    assert (got["hot-a"], got["hot-b"], got["hot-c"], got[None]) == (500, 500, 500, 7)


def _close(a, b):
    """Equal fitted states, floats to 1e-9 relative (Ray merges per-block partial sums; here it is one block)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _close(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _close(x, y)
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12, nan_ok=True)
    else:
        assert a == b


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_a_table_in_memory_is_fitted_and_packed_here_as_ray_data_does_it(task):
    """A small table's split parts are pyarrow tables (ingest reads it in this process): the fit (numbers, booleans,
    decimals, text, dates, the drift baseline) and the packed rows equal Ray Data's over the same rows."""
    import datetime
    import decimal

    from trainflow.preprocessors.fit import pack

    n = 700
    rng = np.random.default_rng(3)
    table = (
        _table(n, seed=3)
        .append_column(
            "when",
            pa.array(
                [datetime.datetime(2020, 1, 1) + datetime.timedelta(hours=int(h)) for h in rng.integers(0, 9000, n)],
                pa.timestamp("us"),
            ),
        )
        .append_column(
            "price", pa.array([decimal.Decimal(f"{v:.2f}") for v in rng.normal(50, 9, n)], pa.decimal128(9, 2))
        )
    )
    if task == "regression":
        table = table.set_column(table.schema.get_field_index("y"), "y", pa.array(rng.normal(3, 2, n)))
    spec = table_spec(table.schema, DataSection(path="mem", label="y", id_column="id"), task, "mem")
    assert spec.dates == ["when"] and "price" in spec.numeric
    here = fit_preprocessor(table, spec, task)
    there = fit_preprocessor(ray.data.from_arrow(table), spec, task)
    _close(here.to_dict(), there.to_dict())
    train, val = table.slice(0, 500), table.slice(500)
    packed_here = pack(train, val, here, materialize=True)
    assert all(isinstance(p, pa.Table) for p in packed_here)  # held in this process: no Ray
    packed_here = [TableShard(p) for p in packed_here]  # read as a fit in Ray Train's local mode reads it
    packed_there = pack(ray.data.from_arrow(train), ray.data.from_arrow(val), here, materialize=True)
    for a, b in zip(packed_here, packed_there):
        rows_a = np.concatenate([r["features"] for r in a.iter_batches(batch_format="numpy")])
        rows_b = np.concatenate([r["features"] for r in b.iter_batches(batch_format="numpy")])
        np.testing.assert_array_equal(rows_a, rows_b)
        labels = [np.concatenate([r["label"] for r in d.iter_batches(batch_format="numpy")]) for d in (a, b)]
        np.testing.assert_array_equal(*labels)


@pytest.mark.parametrize(
    "task, label, said",
    [
        (
            "classification",
            [1] * 40,
            "has only one class ([1]) in the training rows; classification needs at least two",
        ),
        (
            "regression",
            [0.0, 1.0] * 20,
            "under task: regression holds at most two values in its 40 training rows (about 0 and "
            "0.9981): that is a class",
        ),  # the fine asinh bins the values fall in
    ],
)
def test_the_fit_refuses_a_label_that_cannot_be_what_the_task_says(task, label, said):
    """The fit's own check on the training rows (the pre-flight makes it on small tables before anything starts)."""
    table = pa.table({"x": np.arange(40, dtype=np.float64), "y": label})
    spec = table_spec(table.schema, DataSection(path="t.parquet", label="y"), task, "t.parquet")
    with pytest.raises(DataError, match=re.escape(f"t.parquet: label column 'y' {said}")):
        fit_preprocessor(table, spec, task)
