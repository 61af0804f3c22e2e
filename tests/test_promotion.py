"""The champion/challenger decision and its config."""

import math

import pytest

from trainflow.tasks.gate_rules import decide
from trainflow.config import config_from_dict
from trainflow.errors import ConfigError


@pytest.mark.parametrize(
    ("challenger", "champion", "mode", "margin", "promoted"),
    [
        (0.80, 0.75, "max", 0.0, True),
        (0.75, 0.75, "max", 0.0, False),  # a tie keeps the champion
        (0.76, 0.75, "max", 0.02, False),  # better, but not by the margin
        (0.78, 0.75, "max", 0.02, True),
        (0.40, 0.50, "min", 0.0, True),
        (0.55, 0.50, "min", 0.0, False),
        (math.nan, 0.50, "min", 0.0, False),  # a NaN challenger never wins
        (None, 0.50, "min", 0.0, False),
        (0.50, None, "min", 0.0, True),  # a champion that cannot be scored loses
    ],
)
def test_decide(challenger, champion, mode, margin, promoted):
    ok, reason = decide(challenger, champion, mode, margin)
    assert ok is promoted
    assert reason


def _cfg(**sections):
    return config_from_dict({"data": {"path": "t.parquet", "label": "y"}, "task": "classification", **sections})


def test_promotion_defaults_follow_the_checkpoint_metric():
    cfg = _cfg(checkpoint={"metric": "val_roc_auc"})
    assert (cfg.promotion.metric, cfg.promotion.mode, cfg.promotion.margin) == ("val_roc_auc", "max", 0.0)
    cfg = _cfg(checkpoint={"metric": "train_loss"})
    assert (cfg.promotion.metric, cfg.promotion.mode) == ("val_loss", "min")
    cfg = _cfg(promotion={"metric": "val_f1", "margin": 0.01})
    assert (cfg.promotion.metric, cfg.promotion.mode, cfg.promotion.margin) == ("val_f1", "max", 0.01)


@pytest.mark.parametrize(
    ("promotion", "message"),
    [
        ({"metric": "val_r2"}, "promotion.metric: 'val_r2' is not a validation metric for classification"),
        ({"metric": "train_loss"}, "promotion.metric: 'train_loss'"),
        ({"margin": -0.1}, "promotion.margin"),
        ({"threshold": 1}, "promotion.threshold: unknown key"),
    ],
)
def test_promotion_config_errors(promotion, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _cfg(promotion=promotion)
