"""What people look at, for every kind of served model: the training curves of the models it is made of (a family's
run, a bag's fold models, an ensemble's members with their weights), its curves on the judged rows, and a card whose
figures are named by what they are, with no 0, None or NaN where a figure does not apply."""

from __future__ import annotations

import io
import math
import re

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
