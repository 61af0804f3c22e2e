from pathlib import Path

import pytest

from trainflow.config import config_from_dict, load_config
from trainflow.errors import ConfigError

BASE = {"data": {"path": "t.parquet", "label": "y"}, "task": "classification"}


def test_defaults_and_relative_paths_resolve_against_config_folder(tmp_path):
    cfg = config_from_dict(dict(BASE), base_dir=tmp_path)
    assert cfg.data.path == str(tmp_path / "t.parquet")
    assert cfg.data.format == "parquet"
    assert cfg.storage_path == str(tmp_path / "runs")
    assert cfg.mlflow.tracking_uri == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert cfg.checkpoint.mode == "min"  # inferred from val_loss
    # model.type auto: the built-in families and their weighted ensemble
    assert cfg.model.candidates == ["mlp", "xgboost", "lightgbm", "catboost", "ensemble"]


def test_uri_paths_are_kept_and_format_is_inferred(tmp_path):
    raw = {**BASE, "data": {"path": "s3://bucket/table.csv", "label": "y"}}
    cfg = config_from_dict(raw, base_dir=tmp_path)
    assert cfg.data.path == "s3://bucket/table.csv"
    assert cfg.data.format == "csv"


@pytest.mark.parametrize(
    "raw, needle",
    [
        ({**BASE, "trian": {}}, "trian: unknown key; did you mean train?"),
        ({**BASE, "train": {"foldz": 3}}, "train.foldz: unknown key; did you mean train.folds?"),
        ({**BASE, "train": {"epochz": 3}}, "train.epochz: unknown key; did you mean model.params.mlp.epochs?"),
        # a network key that never was a train key is not taken from there as a moved one
        ({**BASE, "train": {"dropout": 0.2}}, "train.dropout: unknown key; did you mean model.params.mlp.dropout?"),
        # a value no member of the union takes: one line, every valid value (auto included), the closest one
        (
            {**BASE, "model": {"type": "xgbost"}},
            "model.type: Input should be 'auto', or 'mlp', 'torch', 'xgboost', "
            "'lightgbm', 'catboost', 'extra_trees' or 'realmlp', or a valid list (got 'xgbost'); did you mean 'xgboost'?",
        ),
        ({**BASE, "model": {"type": ["mlp", "catbost"]}}, "model.type.1: Input should be 'mlp'"),
        (
            {**BASE, "model": {"params": {"mlp": {"epochs": "x"}}}},
            "model.params.mlp.epochs: Input should be a valid integer, unable to parse string as an integer",
        ),
        # the earlier place, still read: a bad value named where it was written
        ({**BASE, "train": {"epochs": 0}}, "train.epochs: must be >= 1 or 'auto' (got 0)"),
        ({**BASE, "split": {"validation_fraction": 1.5}}, "split.validation_fraction"),
        ({**BASE, "task": "ranking"}, "task"),
        ({"task": "regression"}, "data: required key is missing"),
        ({**BASE, "checkpoint": {"metric": "val_rmse"}}, "val_rmse"),
        ({**BASE, "scaling": {"resources_per_worker": {"GPU": 1}}}, "use_gpu"),
        ({**BASE, "inference": {"input": "x.parquet"}}, "inference"),
        ({**BASE, "data": {"path": "t", "label": "y", "features": ["y"]}}, "label or id"),
    ],
)
def test_invalid_configs_name_the_key(raw, needle, tmp_path):
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw, base_dir=tmp_path)
    assert needle in str(err.value)


def test_load_config_applies_dotted_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data: {path: t.parquet, label: y}\ntask: regression\ntrain: {epochs: 3}\n")
    # (train.epochs: the network's epochs at their earlier place, read with a warning naming the new one)
    with pytest.warns(FutureWarning, match="train.epochs is deprecated: write it as model.params.mlp.epochs"):
        cfg = load_config(path, {"train.epochs": 7, "checkpoint.metric": "val_r2"})
    assert cfg.model.epochs == 7 and "epochs" not in cfg.to_dict()["train"]
    assert cfg.checkpoint.mode == "max"
    with pytest.raises(ConfigError, match="train.epochs"):
        load_config(path, {"train.epochs": "many"})
    cfg = load_config(path, {"model.params.mlp.epochs": 9, "train.epochs": 7})  # the new place wins
    assert cfg.model.epochs == 9
    # the warning names the block of the network the config trains (a user's module: model.params.torch)
    with pytest.warns(FutureWarning, match="train.epochs is deprecated: write it as model.params.torch.epochs"):
        load_config(path, {"model.type": "torch", "model.params.torch.class_path": "a.b:C", "train.epochs": 7})


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = Path(tmp_path / "bad.yaml")
    bad.write_text("data: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_shipped_configs_validate_and_share_the_sample():
    configs = Path(__file__).resolve().parents[1] / "configs"
    demo, sweep = load_config(configs / "demo.yaml"), load_config(configs / "tune.yaml")
    assert demo.data.path == sweep.data.path and demo.inference.input == sweep.inference.input
    assert demo.inference.output != sweep.inference.output  # a sweep never overwrites the demo's predictions
    tune = sweep.require_tune()
    assert (tune.metric, tune.mode, tune.scheduler) == ("val_roc_auc", "max", "asha")
    assert set(tune.search_space) == {"model.params.mlp.learning_rate", "model.params.mlp.batch_size"}


def test_model_type_auto_trains_every_built_in_family(tmp_path):
    cfg = config_from_dict({**BASE, "model": {"type": "auto", "params": {"num_leaves": 15}}}, base_dir=tmp_path)
    assert cfg.model.families == ["mlp", "xgboost", "lightgbm", "catboost"]
    # cross-fitted (small tables): the strongest defaults train first, each time budget's first call; one split: as listed
    assert cfg.model.training_order(5) == ["catboost", "lightgbm", "xgboost", "mlp"]
    assert cfg.model.training_order(1) == ["xgboost", "mlp", "catboost", "lightgbm"]  # one split: the fastest first
    listed = config_from_dict({**BASE, "model": {"type": ["mlp", "catboost"]}}, base_dir=tmp_path)
    assert listed.model.training_order(5) == ["mlp", "catboost"]  # a user's list keeps its order
    assert cfg.for_family("lightgbm").model.type == "lightgbm"  # each its own run, as a listed type
    with pytest.raises(ConfigError, match="model.class_path and model.init_args are for model.type: torch"):
        config_from_dict({**BASE, "model": {"type": "auto", "class_path": "a.b:C"}}, base_dir=tmp_path)
    # a sweep under auto trains one family per trial: the family is searched beside the user's keys
    from trainflow.trainer.tune import sweep_space

    swept = config_from_dict(
        {**BASE, "model": {"type": "auto"}, "tune": {"search_space": {"train.learning_rate": {"choice": [0.01]}}}},
        base_dir=tmp_path,
    )
    assert sweep_space(swept)["model.type"] == {"choice": ["mlp", "xgboost", "lightgbm", "catboost"]}


def test_off_and_on_are_words_in_yaml_so_the_keys_that_take_off_read_them():
    """YAML 1.1 reads `off` as false: `train.time_limit: off` and `train.refit: off` (in a file or --set) were refused
    as False. They are the words now; a boolean key still reads them (pydantic's "off" is false)."""
    from trainflow.config import load_yaml

    raw = load_yaml("train:\n  time_limit: off\n  refit: off\nmodel:\n  ensemble: off\nsplit:\n  backtest_fit: no\n")
    assert raw["train"] == {"time_limit": "off", "refit": "off"} and raw["split"]["backtest_fit"] is False
    config = config_from_dict({"data": {"path": "t.parquet", "label": "y"}, "task": "regression", **raw})
    assert (config.train.time_limit, config.train.refit, config.model.ensemble) == ("off", "off", False)
