"""What people look at, for every kind of served model: the training curves of the models it is made of (a family's
run, a bag's fold models, an ensemble's members with their weights), its curves on the judged rows, and a card whose
figures are named by what they are, with no 0, None or NaN where a figure does not apply."""

from __future__ import annotations

import io
import math
import re
from typing import Any

import numpy as np
import pytest

from trainflow.config import config_from_dict
from trainflow.preprocessors.tabular import TabularPreprocessor
from trainflow.tasks.common import png_data_uri
from trainflow.tasks.mlflow_run import leaderboard_table
from trainflow.tasks.report import model_card, outcome_chart, training_curves
from trainflow.trainer.evaluate import Scored


def _pixels(fig) -> np.ndarray:
    from matplotlib.image import imread

    return imread(io.BytesIO(png_data_uri(fig)[0]), format="png")


def _history(epochs: int, start: float, boosted: bool = False) -> list[dict[str, float]]:
    out = []
    for e in range(epochs):
        row = {"epoch": e * (10 if boosted else 1), "val_loss": start / (1 + e)}
        if not boosted:
            row["train_loss"] = 0.9 * start / (1 + e)
        out.append(row)
    return out


def _labels(ax) -> list[str]:
    return [line.get_label() for line in ax.get_lines()]


def test_training_curves_draw_every_model_the_served_one_is_made_of_and_nothing_when_none_reported():
    single = training_curves([{"family": "mlp", "label": "mlp", "history": _history(5, 1.0), "unit": "epoch"}], "t")
    [ax] = single.axes
    assert _labels(ax) == ["mlp validation", "mlp training"] and ax.get_xlabel() == "epoch"
    bag = training_curves(
        [
            {"family": "xgboost", "label": f"fold {i}", "history": _history(4, 1.0 + i, True), "unit": "round"}
            for i in range(3)
        ],
        "t",
    )
    [ax] = bag.axes
    assert _labels(ax) == [f"fold {i} validation" for i in range(3)] and ax.get_xlabel() == "round"
    members = [
        {"family": "mlp", "panel": "mlp, weight 0.52 in the ensemble", "label": "mlp", "history": _history(6, 1.0)},
        {
            "family": "catboost",
            "panel": "catboost, weight 0.48 in the ensemble",
            "label": "catboost",
            "history": _history(9, 0.8, True),
            "unit": "round",
        },
    ]
    ensemble = training_curves(members, "t")
    assert [a.get_title() for a in ensemble.axes] == [m["panel"] for m in members]
    assert all(len(a.get_lines()[0].get_xdata()) > 1 for a in ensemble.axes)  # lines, not empty axes
    assert _pixels(ensemble).std() > 0.05
    # an ensemble handed its own (empty) history, or a model that never reported a finite loss: no plot at all
    assert training_curves([{"family": "ensemble", "label": "", "history": []}], "t") is None
    assert (
        training_curves([{"family": "mlp", "label": "", "history": [{"epoch": 0, "val_loss": math.nan}]}], "t") is None
    )


def _classifier(classes: list, rows: int = 400) -> Scored:
    rng = np.random.default_rng(0)
    prep = TabularPreprocessor(task="classification", label="churned", classes=classes)
    y = rng.integers(0, len(classes), rows)
    outputs = rng.normal(size=(rows, len(classes)))
    outputs[np.arange(rows), y] += 1.5  # some skill
    return Scored(prep, outputs.astype(np.float32), y)


def test_the_judged_rows_give_roc_and_precision_recall_curves_or_predictions_against_the_actual_values():
    binary = outcome_chart(_classifier(["no", "yes"]), "test", "churn v1")
    roc, pr = binary.axes
    [auc] = [label for label in _labels(roc) if label.startswith("yes: AUC")]
    assert 0.7 < float(auc.split()[-1]) < 1.0 and "400 test rows" in roc.get_title()
    assert any(label.startswith("yes: AP") for label in _labels(pr))
    three = outcome_chart(_classifier(["a", "b", "c"]), "validation", "t")
    assert sum(label.startswith(("a:", "b:", "c:")) for label in _labels(three.axes[0])) == 3
    rng = np.random.default_rng(1)
    prep = TabularPreprocessor(task="regression", label="price", label_mean=100.0, label_std=20.0)
    y = rng.normal(size=300)
    regression = outcome_chart(Scored(prep, (y + 0.1 * rng.normal(size=300)).reshape(-1, 1), y), "test", "t")
    [ax] = regression.axes
    assert ax.get_xlabel() == "actual price" and "300 test rows, R2 0.98" in ax.get_title()
    assert ax.collections[0].get_offsets()[:, 0].mean() == pytest.approx(100.0, abs=5.0)  # in the label's units
    # nothing to draw: no rows, or one class only
    assert outcome_chart(None, "test", "t") is None
    one = _classifier(["no", "yes"])
    assert outcome_chart(Scored(one.prep, one.outputs, np.zeros_like(one.labels)), "test", "t") is None


def _summary(family: str, folds: int) -> dict:
    ensemble = family == "ensemble"
    chose = "oof" if folds > 1 else "val"
    candidates = [
        {
            "family": "ensemble",
            "run_name": "r-ensemble",
            f"{chose}_roc_auc": 0.91,
            "test_roc_auc": 0.9,
            "epoch": None,
            "epochs_run": None,
            "unit": None,
            "train_s": 1.2,
        },
        {
            "family": "mlp",
            "run_name": "r-mlp",
            f"{chose}_roc_auc": 0.89,
            "test_roc_auc": 0.88,
            "epoch": 7,
            "epochs_run": 12,
            "unit": "epoch",
            "train_s": 30.5,
        },
        {
            "family": "catboost",
            "run_name": "r-catboost",
            f"{chose}_roc_auc": 0.88,
            "test_roc_auc": 0.87,
            "epoch": 140,
            "epochs_run": 200,
            "unit": "round",
            "train_s": 12.0,
        },
    ]
    return {
        "registered_model": "churn",
        "model_version": "3",
        "model_family": family,
        "run_name": "r",
        "data_path": "d.parquet",
        "data_fingerprint": "abc",
        "training_rows": 1000,
        "train_rows": 640,
        "validation_rows": 160,
        "test_rows": 200,
        "folds": folds,
        "epochs_run": 0 if ensemble else 12,
        "training_budget": {} if ensemble else {"unit": "epoch"},
        "best_checkpoint": {
            "epoch": 0 if ensemble else 7,
            "metrics": {f"{chose}_roc_auc": 0.91, f"{chose}_loss": 0.3, "epoch": 7},
        },
        "test_metrics": {"test_roc_auc": 0.9, "test_loss": 0.31},
        **({"oof_metrics": {"oof_roc_auc": 0.91}, "oof_rows": 800} if folds > 1 else {}),
        "candidates": candidates if ensemble else None,
        "ensemble": {
            "members": [{"family": "mlp", "weight": 0.52}, {"family": "catboost", "weight": 0.48}],
            "rounds": 50,
            "rows": 800,
            "weighted_on": "out-of-fold",
        }
        if ensemble
        else None,
        "promotion": {
            "decision": "promoted",
            "metric": "val_roc_auc",
            "mode": "max",
            "margin": 0.0,
            "rows": 200,
            "judged_on": "test",
            "challenger_version": "3",
            "challenger_score": 0.9,
            "champion_version": None,
            "champion_score": None,
            "reason": "no champion",
            "serving_version": "3",
        },
        "mlflow_run_id": "run",
        "ray_run_path": "/runs/r",
        "model_uri": "models:/churn/3",
        "predictions_path": None,
    }


@pytest.mark.parametrize("family,folds", [("ensemble", 5), ("mlp", 5), ("mlp", 1)])
def test_the_card_is_true_for_an_ensemble_a_bag_and_a_single_family(family, folds):
    cfg = config_from_dict(
        {"data": {"path": "d.parquet", "label": "churned"}, "task": "classification", "model": {"type": "auto"}}
    )
    summary = _summary(family, folds)
    card = model_card(cfg, summary, None, "", "", "test")
    model = card[card.index("## The model") : card.index("## What the model relies on")]
    assert "Best checkpoint" not in card and "epoch 0 of 0" not in card
    # metrics named by what they are, the rows each column came from in its header
    chose = "out-of-fold (800 rows)" if folds > 1 else "validation (160 rows)"
    assert f"| metric | {chose} | test (200 rows) |" in model
    assert "| roc_auc | 0.91 | 0.9 |" in model and "| loss | 0.3 | 0.31 |" in model and "val_" not in model
    # no plot: the card says why instead of an empty picture
    assert "No training curve:" in model and "No plot of the test rows" in model and "![" not in model
    if family == "ensemble":
        assert "`mlp` 0.52, `catboost` 0.48" in model and "no epochs or rounds of its own" in model
        board = card[card.index("## Candidates") :]
        header = next(line for line in board.splitlines() if line.startswith("| family"))
        assert [c.strip() for c in header.strip("|").split("|")] == list(leaderboard_table(summary))
        ensemble_row = next(line for line in board.splitlines() if line.startswith("| ensemble"))
        assert "— (no epochs of its own)" in ensemble_row and "| 1.2 |" in ensemble_row
    elif folds > 1:
        assert "the mean of 5 fold models" in model
    else:
        assert "kept: epoch 7 of the 12 run this time" in model
    tables = [line for line in card.splitlines() if line.startswith("|")]
    assert not [line for line in tables if re.search(r"\|\s*(None|nan|NaN)\s*\|", line)], tables


HOSTILE = ("<img src=x onerror=alert(1)>", "<script>alert(2)</script>", "cost $_$ total")


def hostile_card() -> tuple[Any, dict[str, Any]]:
    """A config and a summary whose every string from the data or config is hostile HTML or mathtext: the id, time and
    group column names in the split line, a slice's value in the gate's reason and the slices table, feature and
    class names, paths, the registered model's name, the PostgreSQL copy's query."""
    img, script, money = HOSTILE
    cfg = config_from_dict(
        {
            "data": {"path": f"/data/{script}/t.parquet", "label": "churned", "id_column": img},
            "task": "classification",
            "model": {"type": "xgboost"},
            "mlflow": {"registered_model": "churn"},
        }
    )
    summary = _summary("xgboost", 1)
    summary.update(
        {
            "registered_model": f"churn{script}",
            "data_path": f"/data/{script}/t.parquet",
            "split": f"test by hash of {img}, validation by hash of {img}",
            "split_path": f"/runs/{img}/split.parquet",
            "predictions_path": f"/out/{script}",
            "output_rows": 10,
            "input_rows": 10,
            "unseen_categories": {f"plan={img}": 3},
            "slices": {img: {money: {"rows": 40, "val_roc_auc": 0.7}, script: {"rows": 40, "val_roc_auc": 0.8}}},
            "feature_importance": [{"column": money, "importance": 0.1, "importance_std": 0.01}],
            "data_snapshot": {
                "format": "postgres",
                "table": None,
                "query": f"SELECT '{script}' AS `x`",
                "server": "127.0.0.1:5432/db",
                "rows": 10,
                "copied_at": "2026-12-01T00:00:00Z",
                "location": f"/runs/{img}",
            },
        }
    )
    summary["promotion"]["reason"] = f"slice {img}={script} fell by 0.1"
    return cfg, summary


def test_text_from_data_and_config_is_text_in_the_card_and_its_html():
    from trainflow.tasks.report import card_html

    cfg, summary = hostile_card()
    card = model_card(cfg, summary, "file:///runs/<b>x</b>/loss_curve.png", "", "", "test")
    html = card_html(card, summary["registered_model"])
    # no tag or handler from the data in the HTML: every hostile string is text (escaped), nothing else
    assert (
        "<script" not in html
        and "<img src=" not in html.replace('<img alt="', "")
        and "onerror=alert" not in (html.replace("onerror=alert(1)&gt;", ""))
    ), html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "&lt;script&gt;alert(2)&lt;/script&gt;" in html
    # in the Markdown (the Prefect artifact, MLflow's .md) every one is escaped or in a code span
    outside_code = re.sub(r"(`+)[^`].*?\1", "", card.split("## Config")[0])
    assert "<" not in outside_code, [line for line in outside_code.splitlines() if "<" in line]
    # the config's JSON cannot close its fence
    assert card.count("\n```json\n") == 1 and card.rstrip().endswith("```")


def test_text_from_data_is_text_in_every_chart():
    """A `$` in a feature, a class or a slice's value is a dollar sign: matplotlib's mathtext would fail to parse
    `cost $_$ total` when the chart is drawn (after the version was registered and @champion moved)."""
    from trainflow.tasks.drift import bar_chart
    from trainflow.tasks.report import backtest_chart, importance_chart

    money = HOSTILE[2]
    charts = [
        outcome_chart(_classifier(["no", money]), "test", f"churn {money}"),
        importance_chart([{"column": money, "importance": 0.1, "importance_std": 0.01}], "val_roc_auc", money),
        bar_chart({"columns": {money: {"score": 0.3, "threshold": 0.2, "verdict": "drifted"}}}),
        training_curves([{"family": "mlp", "label": money, "history": [{"epoch": 1, "val_loss": 0.5}]}], money),
        backtest_chart(
            {"metric": "val_roc_auc", "unit": "day", "by_time": {"test": [{"start": money, "end": "b", "value": 0.8}]}},
            money,
        ),
    ]
    for fig in charts:
        png, _ = png_data_uri(fig)  # drawn: mathtext would raise here
        assert png.startswith(b"\x89PNG")
        texts = [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_parse_math")) if money in t.get_text()]
        assert texts and all(not t.get_parse_math() for t in fig.findobj(lambda a: hasattr(a, "get_parse_math")))
