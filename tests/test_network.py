"""trainflow's network with periodic numeric embeddings (model.numeric_embedding) and label smoothing: built from the
fitted preprocessor, sized before allocation, served from its checkpoint (weights only) exactly as it trained."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import tiny_preprocessor, tiny_table
from trainflow.config import config_from_dict
from trainflow.errors import ConfigError
from trainflow.trainer.serving.checkpoint import save_checkpoint
from trainflow.trainer.families.network import EmbeddingMLP, check_model, model_for, network_parameters
from trainflow.trainer.serving.servable import load_servable


def _config(tmp_path, **model):
    return config_from_dict(
        {
            "data": {"path": "mem", "label": "y"},
            "task": "classification",
            "model": {"type": "mlp", "hidden_sizes": [8], **model},
        },
        base_dir=tmp_path,
    ).to_dict()


def test_continuous_positions_are_the_number_values_and_date_parts_only():
    prep = tiny_preprocessor()
    names = prep.feature_names()
    assert [names[i] for i in prep.continuous_positions()] == ["x1", "x2"]  # not the one-hot slots or the code


def test_periodic_embeddings_take_the_continuous_values_and_serve_from_the_checkpoint(tmp_path):
    prep, raw = tiny_preprocessor(), _config(tmp_path, numeric_embedding="periodic")
    torch.manual_seed(0)
    model = model_for(prep, raw["model"])
    assert isinstance(model, EmbeddingMLP) and model.periodic is not None
    assert sum(p.numel() for p in model.parameters()) == network_parameters(
        prep, raw["model"]
    )  # sized before allocation
    check_model(prep, raw["model"])
    x = torch.from_numpy(prep.transform_features(tiny_table()))
    x2 = x.clone()
    x2[:, prep.continuous_positions()[0]] += 0.5  # a continuous value moves the output through its embedding
    with torch.no_grad():
        assert not torch.allclose(model(x), model(x2))
    d = tmp_path / "ckpt"
    d.mkdir()
    save_checkpoint(d, model.state_dict(), {"epoch": 0}, {"val_loss": 0.5}, [], prep.to_dict(), raw)
    served = load_servable(d)  # torch.load(weights_only=True) inside
    with torch.no_grad():
        want = model.eval()(x).numpy()
    assert np.allclose(served.predict(x.numpy()), want, atol=1e-5)  # the network's outputs, as trained
    plain = model_for(prep, _config(tmp_path, numeric_embedding="none")["model"])
    assert plain.periodic is None  # numeric_embedding none: the code embeddings and the layers as before


def test_auto_embeds_periodically_up_to_a_million_training_rows(tmp_path, monkeypatch):
    from trainflow.trainer.families import network as model_module

    prep, raw = tiny_preprocessor(), _config(tmp_path)
    assert raw["model"]["numeric_embedding"] == "auto" and model_for(prep, raw["model"]).periodic is not None
    monkeypatch.setattr(model_module, "PERIODIC_MAX_ROWS", prep.train_rows - 1)  # a table past the threshold
    assert model_for(prep, raw["model"]).periodic is None
    assert network_parameters(prep, raw["model"]) == sum(p.numel() for p in model_for(prep, raw["model"]).parameters())


def test_label_smoothing_is_validated_and_is_part_of_the_networks_training_hash(tmp_path):
    base = {"data": {"path": "x.parquet", "label": "y"}, "task": "classification"}
    smooth = config_from_dict({**base, "model": {"params": {"mlp": {"label_smoothing": 0.1}}}})
    assert smooth.training_hash("mlp") != config_from_dict(base).training_hash("mlp")
    assert smooth.training_hash("xgboost") == config_from_dict(base).training_hash("xgboost")
    with pytest.raises(ConfigError, match="model.params.mlp.label_smoothing"):
        config_from_dict({**base, "model": {"params": {"mlp": {"label_smoothing": 1.0}}}})
    with pytest.raises(ConfigError, match="model.numeric_embedding"):
        config_from_dict({**base, "model": {"numeric_embedding": "fourier"}})


def test_tabm_trains_its_members_on_every_row_and_serves_their_mean_probability(tmp_path):
    from trainflow.trainer.families.network import TabMHead
    from trainflow.trainer.loop import member_loss

    prep = tiny_preprocessor()
    raw = _config(tmp_path, architecture="tabm", tabm_k=4, hidden_sizes=[16, 16], numeric_embedding="none", dropout=0.0)
    torch.manual_seed(0)
    model = model_for(prep, raw["model"])
    assert isinstance(model.mlp, TabMHead) and model.mlp.k == 4
    assert sum(p.numel() for p in model.parameters()) == network_parameters(
        prep, raw["model"]
    )  # sized on the meta device
    check_model(prep, raw["model"])
    x = torch.from_numpy(prep.transform_features(tiny_table()))
    model.train()
    members = model(x)
    assert members.shape == (len(x), 4, 2)  # every member's logits on every row
    y = torch.zeros(len(x), dtype=torch.long)
    want = sum(torch.nn.functional.cross_entropy(members[:, i], y) for i in range(4)) / 4
    assert torch.allclose(member_loss(torch.nn.CrossEntropyLoss(), members, y), want)  # each member's loss, averaged
    model.eval()  # no dropout: the members' outputs in training are the ones evaluation averages
    with torch.no_grad():
        served_logits = model(x)
    assert served_logits.shape == (len(x), 2)
    assert torch.allclose(served_logits.softmax(-1), members.softmax(-1).mean(1), atol=1e-6)  # the members' mean
    d = tmp_path / "ckpt"
    d.mkdir()
    save_checkpoint(d, model.state_dict(), {"epoch": 0}, {"val_loss": 0.5}, [], prep.to_dict(), raw)
    assert np.allclose(load_servable(d).predict(x.numpy()), served_logits.numpy(), atol=1e-5)
    # its keys only change the network's training hash when it is TabM; a plain MLP's hash is as before them
    base = {"data": {"path": "x.parquet", "label": "y"}, "task": "classification"}
    tabm = config_from_dict({**base, "model": {"architecture": "tabm"}})
    assert tabm.training_hash("mlp") != config_from_dict(base).training_hash("mlp")
    assert config_from_dict({**base, "model": {"tabm_k": 8}}).training_hash("mlp") == config_from_dict(
        base
    ).training_hash("mlp")
    assert tabm.training_hash("xgboost") == config_from_dict(base).training_hash("xgboost")
    with pytest.raises(ConfigError, match="model.architecture"):
        config_from_dict({**base, "model": {"architecture": "resnet"}})
    with pytest.raises(ConfigError, match="model.architecture: applies to mlp"):
        config_from_dict({**base, "model": {"type": "xgboost", "architecture": "tabm"}})
