"""The @champion alias's history and rollback on a real MLflow registry (SQLite): every move trainflow makes is
recorded on the versions it touches; a rollback goes through the champion lock and records who and why."""

import datetime as dt
import json

import pytest
import yaml

from tests.conftest import sqlite_registry, write_config
from trainflow.champion import PERIODS_TAG, history, record_move, serving_at
from trainflow.flows.cli import main as cli_main
from trainflow.run.tracking import CHAMPION


@pytest.fixture
def registry(tmp_path):
    client, uri = sqlite_registry(tmp_path)
    cfg = write_config(
        tmp_path,
        {
            "data": {"path": str(tmp_path / "t.parquet"), "label": "y"},
            "task": "regression",
            "mlflow": {"tracking_uri": uri, "registered_model": "m"},
        },
    )
    return client, cfg


def test_moves_are_recorded_and_a_rollback_goes_back_with_its_reason(registry, capsys):
    client, cfg = registry
    client.set_registered_model_alias("m", CHAMPION, "1")  # the gate's moves, as tasks/promote.py records them
    record_move(client, "m", None, "1", "first model: there is no champion yet", "the gate (run a)")
    client.set_registered_model_alias("m", CHAMPION, "2")
    record_move(client, "m", "1", "2", "val_loss 0.4 beats 0.5", "the gate (run b)")
    rows = history(client, "m")
    assert [(r["version"], r["until"] is None) for r in rows] == [("1", False), ("2", True)]
    assert rows[0]["replaced_by"] == "2" and rows[0]["replaced_why"] == "val_loss 0.4 beats 0.5"
    assert serving_at(client, "m", dt.datetime.fromisoformat(rows[1]["since"]))["version"] == "2"
    assert serving_at(client, "m", dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)) is None

    # version 3 set by hand in MLflow (no record); a rollback to 1 closes 2's open period and 3's unknown one, and
    # says who and why
    client.set_registered_model_alias("m", CHAMPION, "3")
    out = cfg.parent / "rollback.json"
    assert (
        cli_main(
            [
                "champion",
                "rollback",
                "--config",
                str(cfg),
                "--to",
                "1",
                "--reason",
                "v2 mislabels refunds",
                "--summary-json",
                str(out),
            ]
        )
        == 0
    )
    moved = json.loads(out.read_text())
    assert moved["moved"] and moved["previous"] == "3" and moved["champion"] == "1"
    assert str(client.get_model_version_by_alias("m", CHAMPION).version) == "1"
    rows = history(client, "m")
    assert [r["version"] for r in rows if r["until"] is None] == ["1"]  # one version serving
    by_version = {r["version"]: r for r in rows if r["version"] != "1"}
    assert by_version["2"]["replaced_why"].startswith("the alias was moved outside trainflow")
    assert by_version["3"]["since"] is None and by_version["3"]["why"] == "set outside trainflow"
    assert rows[-1]["version"] == "1" and rows[-1]["why"] == "rollback: v2 mislabels refunds"
    assert rows[-1]["by"].startswith("rollback by ") and rows[-1]["replaced"] == "3"
    capsys.readouterr()
    assert cli_main(["champion", "history", "--config", str(cfg)]) == 0
    printed = capsys.readouterr().out
    assert "serving" in printed and "rollback: v2 mislabels refunds" in printed

    # nothing to move, a version that does not exist, no reason: exit 0 / 2 with the alias untouched
    assert cli_main(["champion", "rollback", "--config", str(cfg), "--to", "1", "--reason", "again"]) == 0
    assert "nothing moved" in capsys.readouterr().out
    assert cli_main(["champion", "rollback", "--config", str(cfg), "--to", "9", "--reason", "x"]) == 2
    assert "has no version '9'" in capsys.readouterr().err
    assert cli_main(["champion", "rollback", "--config", str(cfg), "--to", "2", "--reason", " "]) == 2
    assert str(client.get_model_version_by_alias("m", CHAMPION).version) == "1"
    # under a floor (promotion.min_score): a version whose gate's recorded score misses it, or has none, is refused
    # (exit 2, nothing moved) unless --force, which the history says
    floored = write_config(
        cfg.parent,
        {**yaml.safe_load(cfg.read_text()), "promotion": {"metric": "val_r2", "mode": "max", "min_score": 0.5}},
        "floor.yaml",
    )
    client.set_model_version_tag("m", "2", "trainflow.promotion.challenger_score", "0.31")
    client.set_model_version_tag("m", "3", "trainflow.promotion.challenger_score", "0.72")
    assert cli_main(["champion", "rollback", "--config", str(floored), "--to", "2", "--reason", "x"]) == 2
    assert "its gate's score 0.31 misses promotion.min_score 0.5" in capsys.readouterr().err
    assert str(client.get_model_version_by_alias("m", CHAMPION).version) == "1"
    assert cli_main(["champion", "rollback", "--config", str(floored), "--to", "3", "--reason", "v3 is fine"]) == 0
    assert cli_main(["champion", "rollback", "--config", str(floored), "--to", "1", "--reason", "back"]) == 2
    assert "its score is not recorded" in capsys.readouterr().err
    assert (
        cli_main(["champion", "rollback", "--config", str(floored), "--to", "2", "--reason", "needed", "--force"]) == 0
    )
    assert str(client.get_model_version_by_alias("m", CHAMPION).version) == "2"
    assert (
        history(client, "m")[-1]["why"]
        == "rollback: needed (forced: its gate's score 0.31 misses promotion.min_score 0.5)"
    )
    # `trainflow rollback` without --to: back to the version the serving champion replaced (3), as the history says;
    # `trainflow history` is `trainflow champion history`
    assert cli_main(["rollback", "--config", str(floored), "--reason", "2 was a mistake"]) == 0
    assert str(client.get_model_version_by_alias("m", CHAMPION).version) == "3"
    capsys.readouterr()
    assert cli_main(["history", "--config", str(cfg), "--at", history(client, "m")[-1]["since"]]) == 0
    assert "rollback: 2 was a mistake" in capsys.readouterr().out
    # `trainflow champion --at TIME` answers the same: which version served then
    assert cli_main(["champion", "--at", history(client, "m")[-1]["since"], "--config", str(cfg)]) == 0
    assert "rollback: 2 was a mistake" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # neither a command nor --config: argparse's usage error, exit 2
        cli_main(["champion", "--at", history(client, "m")[-1]["since"]])
    client.set_registered_model_alias("m", CHAMPION, "2")  # set by hand: no record of what it replaced
    assert cli_main(["rollback", "--config", str(cfg), "--reason", "x"]) == 2
    assert "records no version before the serving @champion" in capsys.readouterr().err
    client.set_registered_model_alias("m", CHAMPION, "3")
    # a tag someone else wrote is not trusted as history, and never fails a move
    client.set_model_version_tag("m", "2", PERIODS_TAG, "not json")
    assert all(r["version"] != "2" for r in history(client, "m"))


def test_a_rollback_to_a_version_the_gate_rejected_or_that_never_served_needs_force_and_a_plain_number(
    tmp_path, capsys
):
    client, uri = sqlite_registry(tmp_path, versions=4)
    cfg = write_config(
        tmp_path,
        {
            "data": {"path": str(tmp_path / "t.parquet"), "label": "y"},
            "task": "regression",
            "mlflow": {"tracking_uri": uri, "registered_model": "m"},
        },
    )
    client.set_registered_model_alias("m", CHAMPION, "1")
    record_move(client, "m", None, "1", "first model: there is no champion yet", "the gate (run a)")
    client.set_registered_model_alias("m", CHAMPION, "2")
    record_move(client, "m", "1", "2", "val_loss 0.4 beats 0.5", "the gate (run b)")
    client.set_model_version_tag("m", "3", "trainflow.promotion.decision", "not_promoted")
    client.set_model_version_tag("m", "3", "trainflow.promotion.reason", "val_loss 0.6 does not beat 0.4")
    for to in (" 2", "01", "2.0", "-1"):  # read strictly: no version by accident
        assert cli_main(["champion", "rollback", "--config", str(cfg), "--to", to, "--reason", "x"]) == 2
        assert "is not a model version number" in capsys.readouterr().err
    assert cli_main(["champion", "rollback", "--config", str(cfg), "--to", "3", "--reason", "x"]) == 2
    assert "the gate did not promote it (val_loss 0.6 does not beat 0.4)" in capsys.readouterr().err
    assert cli_main(["champion", "rollback", "--config", str(cfg), "--to", "4", "--reason", "x"]) == 2
    assert "it never served as @champion" in capsys.readouterr().err
    assert str(client.get_model_version_by_alias("m", CHAMPION).version) == "2"
    assert cli_main(["champion", "rollback", "--config", str(cfg), "--to", "3", "--reason", "needed", "--force"]) == 0
    assert history(client, "m")[-1]["why"].startswith("rollback: needed (forced: the gate did not promote it")
    assert cli_main(["champion", "rollback", "--config", str(cfg), "--to", "1", "--reason", "served before"]) == 0
