"""The review's smaller findings: strict YAML, a storage path of its own, init's YAML through the emitter and
never over its input, text from data escaped in Markdown."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import write_parquet
from trainflow.config import config_from_dict, load_config
from trainflow.errors import ConfigError
from trainflow.scaffold import scaffold
from trainflow.tasks.common import md

BASE = "data: {path: t.parquet, label: y}\ntask: regression\n"


def test_yaml_aliases_and_duplicated_keys_are_refused_naming_the_line(tmp_path):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n" + BASE
    (tmp_path / "bomb.yaml").write_text(bomb)
    with pytest.raises(ConfigError, match="aliases"):
        load_config(tmp_path / "bomb.yaml")
    (tmp_path / "dup.yaml").write_text(BASE + "train: {epochs: 3}\ntrain: {epochs: 5}\n")
    with pytest.raises(ConfigError, match=r"key 'train' appears twice \(lines 3 and 4\)"):
        load_config(tmp_path / "dup.yaml")


@pytest.mark.parametrize("where", ["/", "~", "~/"])
def test_a_storage_path_of_the_root_or_home_folder_is_refused(tmp_path, where):
    with pytest.raises(ConfigError, match="storage_path .* folder of its own"):
        config_from_dict(
            {"data": {"path": "t.parquet", "label": "y"}, "task": "regression", "storage_path": where},
            base_dir=tmp_path,
        )


def test_init_round_trips_any_column_name_and_path_and_never_writes_over_its_input(tmp_path):
    folder = tmp_path / "odd\nray:\n  runtime_env: evil"
    rng = np.random.default_rng(0)
    table = pa.table(
        {"churn 😀": rng.integers(0, 2, 300), "a|b: c": rng.normal(size=300), "<script>": rng.normal(size=300)}
    )
    data = write_parquet(table, folder / "t.parquet")
    out = tmp_path / "trainflow.yaml"
    text = scaffold(str(data), "churn 😀", str(out))
    out.write_text(text)
    cfg = load_config(out)
    assert cfg.data.label == "churn 😀" and Path(cfg.data.path) == data.resolve()
    assert cfg.ray.runtime_env in (None, {}) and text.count("\nray:") == 0
    with pytest.raises(ConfigError, match="never writes over its input"):
        scaffold(str(data), "churn 😀", str(data))


def test_text_from_data_is_escaped_in_markdown():
    assert md("<script>alert(1)</script>") == "&lt;script&gt;alert\\(1\\)&lt;/script&gt;"
    assert md("a|b") == "a\\|b" and md("[x](javascript:y)") == "\\[x\\]\\(javascript:y\\)"
    assert "\n" not in md("line\nbreak")
