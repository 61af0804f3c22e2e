"""A user's own nn.Module (model.type: torch): imported by its path, built with the fitted widths, checked before training."""

import pytest
import torch
from torch import nn

from trainflow.preprocessors.tabular import TabularPreprocessor
from trainflow.trainer.families.network import check_model, model_for
from trainflow.config import config_from_dict
from trainflow.errors import ConfigError


class WrongShape(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.layer = nn.Linear(in_features, out_features + 1)

    def forward(self, x):
        return self.layer(x)


def _prep() -> TabularPreprocessor:
    # two numbers and one embedded text column of 3 values (+ the unknown code) at position 2
    return TabularPreprocessor(
        task="classification",
        label="y",
        classes=["a", "b", "c"],
        feature_order=["x1", "x2", "shop"],
        numeric={"x1": {"mean": 0.0, "std": 1.0}, "x2": {"mean": 0.0, "std": 1.0}},
        embedded={"shop": {"categories": ["p", "q", "r"], "dim": 3}},
    )


def _cfg(**model):
    return config_from_dict(
        {"data": {"path": "t.parquet", "label": "y"}, "task": "classification", "model": {"type": "torch", **model}}
    ).model.model_dump()


def test_the_example_module_is_built_with_the_fitted_widths_and_its_embeddings():
    cfg = _cfg(class_path="trainflow.examples.tabular_resnet:TabularResNet", init_args={"width": 16, "blocks": 1})
    check_model(_prep(), cfg)
    net = model_for(_prep(), cfg)
    assert [(t.num_embeddings, t.embedding_dim) for t in net.tables] == [(4, 3)] and net.stem.out_features == 16
    x = torch.tensor([[0.5, -1.0, 2.0], [0.0, 0.0, 0.0]])
    assert net(x).shape == (2, 3)
    # the dotted form of the path works too, and the same weights load into a fresh build (as serving does)
    again = model_for(_prep(), {**cfg, "class_path": "trainflow.examples.tabular_resnet.TabularResNet"})
    again.load_state_dict(net.state_dict())


@pytest.mark.parametrize(
    ("class_path", "init_args", "message"),
    [
        ("trainflow.examples.nope:Net", {}, "cannot import module 'trainflow.examples.nope'"),
        ("trainflow.examples.tabular_resnet:Missing", {}, "has no torch.nn.Module subclass named 'Missing'"),
        ("trainflow.examples.tabular_resnet:torch", {}, "has no torch.nn.Module subclass named 'torch'"),
        (
            "trainflow.examples.tabular_resnet:TabularResNet",
            {"depth": 3},
            "cannot be built with in_features=3, out_features=3 and init_args {'depth': 3}",
        ),
        ("tests.test_user_model:WrongShape", {}, "gave output \\(2, 4\\); expected \\(2, 3\\)"),
    ],
    ids=["module", "class", "not-a-module", "init-args", "output-shape"],
)
def test_a_bad_user_module_fails_before_training_naming_the_class_path(class_path, init_args, message):
    with pytest.raises(ValueError, match=message) as err:
        check_model(_prep(), _cfg(class_path=class_path, init_args=init_args))
    assert class_path in str(err.value)


def test_model_family_keys_are_validated():
    with pytest.raises(ConfigError, match="model.type torch needs model.class_path"):
        _cfg()
    with pytest.raises(ConfigError, match="model.class_path and model.init_args are for model.type: torch"):
        config_from_dict(
            {"data": {"path": "t.parquet", "label": "y"}, "task": "regression", "model": {"init_args": {"width": 3}}}
        )


def test_the_registered_model_carries_the_package_of_the_users_module_a_namespace_package_too(tmp_path):
    """serving_code copies the top-level package your module is in beside trainflow's serving modules: a regular
    package from its __init__.py's folder, a namespace package (a folder without __init__.py, no origin) from the
    folder the module is in."""
    from pathlib import Path

    from trainflow.tasks.model_package import serving_code

    tests_dir = Path(__file__).resolve().parent
    assert not (tests_dir / "__init__.py").exists()  # `tests` is a namespace package
    paths = serving_code(tmp_path / "ns", "tests.faults:HeldNet")
    assert paths[1:] == [str(tmp_path / "ns" / "user" / "tests")]
    assert (tmp_path / "ns" / "user" / "tests" / "faults.py").read_bytes() == (tests_dir / "faults.py").read_bytes()
    import tomllib  # a regular package: copied from its __init__.py's folder (a lone module: the file)

    paths = serving_code(tmp_path / "file", "tomllib:TOMLDecodeError")
    assert paths[1:] == [str(tmp_path / "file" / "user" / "tomllib")]
    assert (tmp_path / "file" / "user" / "tomllib" / "__init__.py").exists() and tomllib
