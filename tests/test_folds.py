"""The fold plan: three roles per row by a seeded hash, stratified, stable as a table grows, stored with a model and
read back strictly; a table too small to judge anything is refused naming the counts."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet  # noqa: F401 - pa.parquet
import pytest
import ray.data

from trainflow.data import split_roles
from trainflow.roles.plan import plan_split
from trainflow.errors import DataError
from trainflow.roles.folds import MAX_TEST_ROWS, TEST, TRAIN, VALIDATION, FoldPlan, check_sizes, effective_test_fraction

pytestmark = pytest.mark.usefixtures("ray_local")


def _table(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    y = np.where(rng.random(rows) < 0.3, "yes", "no")
    y[:4] = "rare"  # 4 rows: too few for a test or validation share of 0.2
    return pa.table({"id": np.arange(rows), "x": rng.normal(size=rows), "y": y})


def _ids(ds) -> np.ndarray:
    return np.sort(np.concatenate([b["id"] for b in ds.iter_batches(batch_format="numpy")]))


def test_three_roles_stratified_disjoint_and_the_same_materialized_or_streamed():
    table = _table(3000)
    ds = ray.data.from_arrow(table)
    plan = plan_split(ds, "classification", "y", 0.2, 0.25, 7, ["id"], rows=3000)
    parts = split_roles(ds, plan, materialize=True)
    ids = {r: _ids(p) for r, p in parts.items()}
    assert sum(len(v) for v in ids.values()) == 3000 and len(np.unique(np.concatenate(list(ids.values())))) == 3000
    assert {k: len(ids[r]) for k, r in (("train", TRAIN), ("validation", VALIDATION), ("test", TEST))} == plan.counts
    y = table["y"].to_numpy(zero_copy_only=False)
    for cls in ("yes", "no"):  # a fifth of each class is test, a quarter of the rest validation
        assert abs((y[ids[TEST]] == cls).sum() / (y == cls).sum() - 0.2) < 0.04
        assert abs((y[ids[VALIDATION]] == cls).sum() / (y == cls).sum() - 0.8 * 0.25) < 0.04
    assert set(range(4)) <= set(ids[TRAIN].tolist())  # the rare class is trained on, never judged alone
    streamed = split_roles(ds, plan, materialize=False)
    assert all(np.array_equal(ids[r], _ids(p)) for r, p in streamed.items())


def test_a_table_that_grows_keeps_its_test_rows_and_a_stored_plan_reads_back():
    small = plan_split(ray.data.from_arrow(_table(2000)), "regression", "x", 0.2, 0.2, 3, ["id"], rows=2000)
    grown_table = _table(4000)
    grown = plan_split(ray.data.from_arrow(grown_table), "regression", "x", 0.2, 0.2, 3, ["id"], rows=4000)
    first = grown_table.slice(0, 2000)
    # the same rows keep the test role (a fixed hash range above EXACT_TEST_ROWS rows); validation rows are cut at the
    # ranks (their exact share), so a row near that cut may move between validation and training as the table grows
    assert np.array_equal(small.roles(first) == TEST, grown.roles(first) == TEST)
    assert (
        int((grown.roles(grown_table) == VALIDATION).sum())
        == grown.counts["validation"]
        == round((4000 - grown.counts["test"]) * 0.2)
    )
    assert np.array_equal(small.held_out(first), small.roles(first) == TEST)
    assert FoldPlan.from_dict(grown.to_dict()) == grown
    with pytest.raises(ValueError, match="not a split plan"):
        FoldPlan.from_dict({**grown.to_dict(), "test_fraction": 1.5})


def test_the_test_role_is_capped_and_a_table_too_small_is_refused_naming_the_counts():
    assert effective_test_fraction(0.2, 10_000_000) == MAX_TEST_ROWS / 10_000_000
    assert effective_test_fraction(0.2, 1000) == 0.2 and effective_test_fraction(0.0, 1000) == 0.0
    tiny = plan_split(ray.data.from_arrow(_table(40)), "regression", "x", 0.2, 0.2, 1, ["id"], rows=40)
    with pytest.raises(DataError, match=r"t.parquet: 40 rows are too few .*train \d+, validation \d+, test \d+ rows"):
        check_sizes(tiny.counts, "t.parquet", tiny)
    ok = plan_split(ray.data.from_arrow(_table(150)), "classification", "y", 0.2, 0.2, 1, ["id"], rows=150)
    check_sizes(ok.counts, "t.parquet", ok)  # 150 rows: enough to train, choose and judge


def test_a_plan_knows_when_it_holds_out_every_test_row_of_another():
    base = FoldPlan(seed=3, key_columns=("id",), test_fraction=0.2, validation_fraction=0.2)
    from dataclasses import replace

    assert base.holds_out_every_test_row_of(base)
    assert replace(base, test_fraction=0.3).holds_out_every_test_row_of(base)  # a wider test range covers it
    assert not base.holds_out_every_test_row_of(replace(base, test_fraction=0.3))
    assert not replace(base, seed=4).holds_out_every_test_row_of(base)
    table = _table(2000)
    wide, narrow = replace(base, test_fraction=0.3), base
    assert (wide.held_out(table) | ~narrow.held_out(table)).all()  # what the shortcut relies on


def test_an_assignment_cut_short_is_written_again_whole(tmp_path):
    from trainflow.tasks.split import ASSIGNMENT_PLAN, write_assignment
    import pyarrow.dataset as pads

    table = _table(500)
    ds = ray.data.from_arrow(table)
    plan = plan_split(ds, "classification", "y", 0.2, 0.2, 1, ["id"], rows=500)
    where = tmp_path / "run-split"
    where.mkdir()
    pa.parquet.write_table(table.slice(0, 100).select(["id"]), where / "left-by-a-killed-run.parquet")
    write_assignment(ds, plan, "id", str(where))
    written = pads.dataset(where, format="parquet").to_table()
    assert written.num_rows == 500 and (where / ASSIGNMENT_PLAN).is_file()
    assert sorted(written["id"].to_pylist()) == list(range(500))
    roles = dict(zip(written["id"].to_pylist(), written["role"].to_pylist()))
    assert sum(r == "test" for r in roles.values()) == plan.counts["test"]
    write_assignment(ds, plan, "id", str(where))  # a rerun finds it whole and leaves it
    assert pads.dataset(where, format="parquet").to_table().num_rows == 500


def test_folds_cover_every_non_test_row_once_stay_put_as_the_table_grows_and_cut_disjoint_parts():
    from trainflow.data import fold_parts

    table = _table(3000)
    ds = ray.data.from_arrow(table)
    plan = plan_split(ds, "classification", "y", 0.2, 0.2, 7, ["id"], rows=3000, folds=4)
    assert plan.folds == 4 and plan.counts["validation"] == 0
    roles, folds = plan.roles(table), plan.fold_ids(table)
    assert (folds[roles == TEST] == -1).all() and set(folds[roles != TEST].tolist()) == {0, 1, 2, 3}
    sizes = np.bincount(folds[roles != TEST])
    assert sizes.min() > 0.8 * sizes.max() and [plan.counts[f"fold {k}"] for k in range(4)] == sizes.tolist()
    grown = plan_split(
        ray.data.from_arrow(_table(6000)), "classification", "y", 0.2, 0.2, 7, ["id"], rows=6000, folds=4
    )
    # the same rows keep their test role; the folds' cuts sit at the ranks of the rows there are, so as the table grows a
    # row moves to a neighbouring fold only where a cut moved past it (a few percent of rows)
    assert np.array_equal(grown.roles(table) == TEST, roles == TEST)
    assert (grown.fold_ids(table) == folds).mean() > 0.9
    assert max(sizes) - min(sizes) <= 4  # each fold its share of every class (rounding per class)
    fit_rows = split_roles(ds, plan, materialize=True)[TRAIN]
    for k in range(4):
        train, held = fold_parts(fit_rows, plan, k, materialize=False)
        a, b = _ids(train), _ids(held)
        assert not set(a) & set(b) and len(a) + len(b) == (roles != TEST).sum()
        assert np.array_equal(np.sort(b), np.sort(table["id"].to_numpy()[folds == k]))
    assert FoldPlan.from_dict(plan.to_dict()) == plan


def test_auto_folds_follow_the_row_count_and_need_a_test_role():
    from trainflow.roles.folds import AUTO_FOLD_ROWS, AUTO_FOLDS, resolve_folds

    assert resolve_folds("auto", AUTO_FOLD_ROWS, 0.2) == AUTO_FOLDS
    assert resolve_folds("auto", AUTO_FOLD_ROWS + 1, 0.2) == 1
    assert resolve_folds(3, 10**6, 0.2) == 3 and resolve_folds("auto", 100, 0.0) == 1
    from trainflow.config import Config

    with pytest.raises(ValueError, match="train.folds"):
        Config.model_validate(
            {
                "data": {"path": "t.parquet", "label": "y"},
                "task": "regression",
                "train": {"folds": 5},
                "split": {"test_fraction": 0},
            }
        )


def test_a_wine_sized_table_is_never_refused_and_its_folds_are_as_even_as_the_rows_allow():
    """113 rows, three classes, 5 cross-fitting folds (train.folds: auto), over 60 seeds: the test role and every fold
    get their share of each class (the hash's rank cut per class), so the table is never refused; the counts the
    plan reports are what its roles and folds give, and they add up to the table's rows."""
    rng = np.random.default_rng(0)
    for seed in range(60):
        table = pa.table(
            {
                "a": rng.normal(size=113),
                "b": rng.normal(size=113),
                "y": rng.choice(["x", "y", "z"], 113, p=[0.4, 0.35, 0.25]),
            }
        )
        plan = plan_split(table, "classification", "y", 0.15, 0.2, seed, ["a", "b", "y"], 113, "auto", "wine.csv")
        check_sizes(plan.counts, "wine.csv", plan)  # never refused
        roles, folds = plan.roles(table), plan.fold_ids(table)
        sizes = np.bincount(folds[roles != TEST], minlength=plan.folds)
        assert plan.folds == 5 and sizes.max() - sizes.min() <= 3, sizes
        assert [plan.counts[f"fold {k}"] for k in range(5)] == sizes.tolist()
        assert plan.counts["test"] == int((roles == TEST).sum()) and 15 <= plan.counts["test"] <= 19
        assert plan.counts["train"] + plan.counts["validation"] + plan.counts["test"] == 113
        assert FoldPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan  # stored and read back whole
    # refused only where even balanced folds are too small: 40 rows in 5 folds leave 6 or 7 per fold; the message
    # counts the table's rows once, the folds as a breakdown of the training rows
    small = table.slice(0, 40)
    plan = plan_split(small, "classification", "y", 0.15, 0.2, 1, ["a", "b", "y"], 40, 5, "small.csv")
    with pytest.raises(DataError, match=r"small.csv: 40 rows are too few .* \(the train rows in 5 folds of \d+, "):
        check_sizes(plan.counts, "small.csv", plan)


def _dated(rows: int, seed: int = 0) -> pa.Table:
    """rows over 2013, several a day (ties on the date), a customer column and a binary label."""
    import datetime as dt

    rng = np.random.default_rng(seed)
    days = np.sort(rng.integers(0, 365, rows))
    return pa.table(
        {
            "day": pa.array([dt.date(2013, 1, 1) + dt.timedelta(days=int(d)) for d in days]),
            "x": rng.normal(size=rows),
            "customer": rng.integers(0, 150, rows),
            "y": rng.choice(["no", "yes"], rows),
        }
    )


def test_roles_by_time_are_the_newest_rows_and_never_split_a_day():
    table = _dated(3000)
    plan = plan_split(table, "classification", "y", 0.2, 0.2, 42, ["x", "y"], 3000, 1, "t.parquet", "day")
    day = np.array([d.toordinal() for d in table["day"].to_pylist()])
    roles = plan.roles(table)
    assert (
        day[roles == TRAIN].max()
        < day[roles == VALIDATION].min()
        <= day[roles == VALIDATION].max()
        < day[roles == TEST].min()
    )  # train, then validation, then test: no day on two sides of a cut
    assert abs(plan.counts["test"] - 600) < 20 and plan.counts == {
        "train": int((roles == TRAIN).sum()),
        "validation": int((roles == VALIDATION).sum()),
        "test": int((roles == TEST).sum()),
    }
    assert "test: 2013-1" in plan.describe() and f"{plan.counts['test']:,} rows" in plan.describe()
    assert FoldPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    # cross-fitting by time: blocks of the non-test rows, each a run of days
    folded = plan_split(table, "classification", "y", 0.2, 0.2, 42, ["x", "y"], 3000, 5, "t.parquet", "day")
    ids = folded.fold_ids(table)
    blocks = [(day[ids == k].min(), day[ids == k].max()) for k in range(5)]
    assert all(a[0] > b[1] for a, b in zip(blocks, blocks[1:]))  # fold 0 the newest block, fold 4 the oldest
    # the backtest's earlier model: the recent model's procedure one block back in time, on rows it could read
    from trainflow.data import earlier_parts
    from trainflow.roles.folds import NO_FOLD

    for p, recent_val in ((plan, roles == VALIDATION), (folded, ids == 0)):
        mine = p.earlier_roles(table)
        recent_train = (roles != TEST) & ~recent_val
        assert not (mine != NO_FOLD)[~recent_train].any()  # never a test row, nor the recent model's held-out rows
        assert (
            day[mine == TRAIN].max() < day[mine == VALIDATION].min()
            and day[mine == VALIDATION].max() < day[recent_val].min()
        )
        assert (mine == VALIDATION).sum() == p.earlier["validation_rows"] and abs(
            p.earlier["validation_rows"] - recent_val.sum()
        ) < 20  # as many as it early-stopped on, days whole
        assert (mine == TRAIN).sum() == p.earlier["rows"] and dt.date.fromordinal(day[mine == TRAIN].max()) == dt.date(
            1970, 1, 1
        ) + dt.timedelta(days=p.earlier["end"])
        assert FoldPlan.from_dict(json.loads(json.dumps(p.to_dict()))).earlier == p.earlier
        fit_rows = table.filter(pa.array(recent_train | (recent_val & (p.folds > 1))))  # split_roles' TRAIN
        a, b = earlier_parts(fit_rows, p, True)
        assert (a.num_rows, b.num_rows) == ((mine == TRAIN).sum(), (mine == VALIDATION).sum())
    assert plan_split(_dated(40), "classification", "y", 0.2, 0.2, 42, ["x", "y"], 40, 1, "t", "day").earlier is None
    # the table grows by a month: the test window moves forward; the old plan holds out every newer row, so a gate
    # between a model of the old table and one of the grown table needs no row-by-row check
    grown_table = pa.concat_tables(
        [
            table,
            _dated(300, seed=1).set_column(
                0, "day", pa.array([d.replace(year=2014, month=1) for d in _dated(300, seed=1)["day"].to_pylist()])
            ),
        ]
    )
    grown = plan_split(grown_table, "classification", "y", 0.2, 0.2, 42, ["x", "y"], 3300, 1, "t", "day")
    assert plan.holds_out_every_test_row_of(grown) and not grown.holds_out_every_test_row_of(plan)
    assert plan.held_out(grown_table)[grown.roles(grown_table) == TEST].all()


def test_a_missing_or_textual_time_and_a_group_too_large_are_refused_naming_them():
    table = _dated(400)
    days = table["day"].to_pylist()
    days[3] = days[70] = None
    with pytest.raises(DataError, match=r"t.parquet: split.time_column 'day' is missing in 2 of 400 rows"):
        plan_split(
            table.set_column(0, "day", pa.array(days)),
            "classification",
            "y",
            0.2,
            0.2,
            1,
            ["x"],
            400,
            1,
            "t.parquet",
            "day",
        )
    with pytest.raises(DataError, match=r"split.time_column 'day' has type string; it needs dates"):
        plan_split(
            table.set_column(0, "day", pa.array([str(d) for d in table["day"].to_pylist()])),
            "classification",
            "y",
            0.2,
            0.2,
            1,
            ["x"],
            400,
            1,
            "t.parquet",
            "day",
        )
    customers = table["customer"].to_numpy().copy()
    customers[:150] = 7  # one customer with 150 of 400 rows: more than the test role's 80
    with pytest.raises(DataError, match=r"group 7 of split.group_column 'customer' has 15\d rows, more than the"):
        plan_split(
            table.set_column(2, "customer", pa.array(customers)),
            "classification",
            "y",
            0.2,
            0.2,
            1,
            ["x"],
            400,
            1,
            "t.parquet",
            None,
            "customer",
        )


def test_roles_by_group_keep_a_groups_rows_together_and_time_reports_the_groups_it_splits():
    table = _dated(3000)
    plan = plan_split(table, "classification", "y", 0.2, 0.2, 42, ["x", "y"], 3000, 5, "t.parquet", None, "customer")
    roles, folds, groups = plan.roles(table), plan.fold_ids(table), table["customer"].to_numpy()
    assert all(len(set(zip(roles[groups == g], folds[groups == g]))) == 1 for g in np.unique(groups))
    assert 500 < plan.counts["test"] < 700 and "group column 'customer'" in plan.describe()
    both = plan_split(table, "classification", "y", 0.2, 0.2, 42, ["x", "y"], 3000, 1, "t.parquet", "day", "customer")
    assert both.groups_split > 100 and f"{both.groups_split:,} group(s) of 'customer'" in both.describe()
    from trainflow.config import config_from_dict

    cfg = config_from_dict(
        {"data": {"path": "t.parquet", "label": "y"}, "task": "classification", "split": {"group_column": "customer"}}
    )
    assert cfg.data.default_features(table.column_names) == ["day", "x"]  # a group's id is no feature


def test_roles_by_group_are_stratified_by_each_groups_class_and_a_new_group_takes_the_overall_cuts():
    # 60 patients, 9 of them sick (every row of a patient has their class): the hash alone can leave the test role
    # without a sick patient; cut within each class, each class's groups give the test role its share of rows
    rng = np.random.default_rng(3)
    patient = np.repeat(np.arange(60), rng.integers(8, 13, 60))
    sick = np.isin(patient, np.arange(0, 60, 7))
    table = pa.table({"id": np.arange(len(patient)), "patient": patient, "x": rng.normal(size=len(patient)), "y": sick})
    ds = ray.data.from_arrow(table)
    plan = plan_split(ds, "classification", "y", 0.2, 0.25, 5, ["id"], table.num_rows, 1, "p.parquet", None, "patient")
    assert sorted(plan.group_strata) == ["false", "true"] and len(plan.group_strata["true"]) == 9
    assert "stratified by each group's majority class (60 groups)" in plan.describe()
    parts = split_roles(ds, plan, materialize=False)
    ids = {r: _ids(p) for r, p in parts.items()}
    assert {k: len(ids[r]) for k, r in (("train", TRAIN), ("validation", VALIDATION), ("test", TEST))} == plan.counts
    for role in (TEST, VALIDATION, TRAIN):  # every role holds sick patients, each a patient's every row
        assert sick[ids[role]].any() and not sick[ids[role]].all()
        assert not set(patient[ids[role]]) & set(patient[np.setdiff1d(np.arange(len(patient)), ids[role])])
    assert abs(sick[ids[TEST]].sum() / sick.sum() - 0.2) < 0.12  # the hash alone: 0.45 with this seed
    # stored and read back as written; a corrupted stratum list is refused
    stored = json.loads(json.dumps(plan.to_dict()))
    assert FoldPlan.from_dict(stored) == plan
    with pytest.raises(ValueError, match="not a split plan"):
        FoldPlan.from_dict({**stored, "group_strata": {"true": [0.9, 0.1]}})
    # a patient new since the plan was made takes the cuts of all rows; a known patient keeps its role
    grown = pa.concat_tables([table, pa.table({"id": [10_000], "patient": [999], "x": [0.0], "y": [True]})])
    assert plan.group_stratum(plan.keys(grown))[-1] == "" and np.array_equal(plan.roles(grown)[:-1], plan.roles(table))
    # with folds, each class's groups are spread over every fold
    folded = plan_split(table, "classification", "y", 0.2, 0.25, 11, ["id"], table.num_rows, 3, "p", None, "patient")
    fold = folded.fold_ids(table)
    assert all(sick[fold == i].any() for i in range(3))


def test_times_of_any_unit_read_exactly_and_placeholder_times_and_degenerate_splits_are_refused_naming_them():
    """Nanosecond, second and millisecond-date times plan as the microseconds did; a far-future placeholder, an
    infinite time, one time for every row, one group, and rows without a group are refused naming the column,
    what ties or is missing, and the count."""
    table = _dated(400)
    stamps = pa.array([dt.datetime(2020, 1, 1) + dt.timedelta(hours=h) for h in range(400)], pa.timestamp("us"))

    def plan(column: str, values: pa.Array, group: bool = False):
        t = table.set_column(table.schema.get_field_index(column), column, values)
        time, by = (None, column) if group else (column, None)
        return plan_split(t, "classification", "y", 0.2, 0.2, 1, ["x"], 400, 1, "t.parquet", time, by)

    reference = plan("day", stamps).counts
    nanos = pa.array(stamps.cast(pa.int64()).to_numpy() * 1000 + 1, pa.int64()).cast(pa.timestamp("ns"))
    assert plan("day", nanos).counts == plan("day", stamps.cast(pa.timestamp("s"))).counts == reference
    days = pa.array([dt.date(2020, 1, 1) + dt.timedelta(days=d // 8) for d in range(400)], pa.date64())
    assert plan("day", days).counts == plan("day", days.cast(pa.date32())).counts
    sentinel = stamps.to_pylist()[:-5] + [dt.datetime(9999, 12, 31, 23, 59, 59)] * 5
    with pytest.raises(DataError, match=r"'day' is after 2200-01-01T00:00:00 in 5 of 400 rows \(the latest 9999-12-31"):
        plan("day", pa.array(sentinel, pa.timestamp("us")))
    with pytest.raises(DataError, match=r"'day' is infinite in 3 of 400 rows"):
        plan("day", pa.array([float(i) for i in range(397)] + [float("inf")] * 3))
    with pytest.raises(DataError, match=r"'day' has one value \(2020-01-01\) in all 400 rows: no row is newer"):
        plan("day", pa.array([dt.date(2020, 1, 1)] * 400))
    with pytest.raises(DataError, match=r"split.group_column 'customer' holds one group in all 400 rows"):
        plan("customer", pa.array([7] * 400), group=True)
    with pytest.raises(DataError, match=r"'customer' is missing in 400 of 400 rows \(every row\)"):
        plan("customer", pa.array([None] * 400, pa.int64()), group=True)
    some = [None if i % 20 == 0 else i % 50 for i in range(400)]
    with pytest.raises(DataError, match=r"'customer' is missing in 20 of 400 rows; rows without a group would all"):
        plan("customer", pa.array(some, pa.int64()), group=True)
