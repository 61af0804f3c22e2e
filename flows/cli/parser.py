"""The `trainflow` command's arguments: one parser, with parent parsers for the options most commands share."""

from __future__ import annotations

import argparse
from typing import Any

from trainflow.errors import TrainflowError

DESCRIPTION = (
    "The `trainflow` command: each work command is a Prefect flow run (on a configured Prefect server, or Prefect's "
    "temporary one); with no Prefect API configured, a small predict, a skipped retrain and validate run in this process."
)
ANSWER_JSON = "also write the answer as JSON to this file"


def _shared(*options: tuple[str, dict[str, Any]]) -> argparse.ArgumentParser:
    """A parent parser holding options (flag, add_argument's keywords) that several commands take."""
    parent = argparse.ArgumentParser(add_help=False)
    for flag, kwargs in options:
        parent.add_argument(flag, **kwargs)
    return parent


CONFIG = _shared(("--config", {"required": True, "help": "the YAML config file (trainflow init writes one)"}))
OVERRIDES = _shared(
    (
        "--set",
        {
            "action": "append",
            "default": [],
            "metavar": "KEY=VALUE",
            "help": "override a config key (YAML value), e.g. train.epochs=5; repeatable",
        },
    )
)
SUMMARY_JSON = _shared(("--summary-json", {"help": "also write the summary as JSON to this file"}))
NO_WAIT = _shared(
    (
        "--no-wait",
        {
            "dest": "wait",
            "action": "store_false",
            "help": "fail at once, naming the holder, when another start of this --run-name is running (default: wait "
            "for it)",
        },
    )
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trainflow")
    except PackageNotFoundError:  # a checkout run without installing it
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainflow", description=DESCRIPTION)
    p.add_argument("--debug", action="store_true", help="show full tracebacks")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}", help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser(
        "retrain",
        help="train, select, register and predict from a config",
        parents=[CONFIG, OVERRIDES, SUMMARY_JSON, NO_WAIT],
    )
    r.add_argument("--run-name", help="Ray Train run name; an existing name resumes that run")
    r.add_argument(
        "--force",
        action="store_true",
        help="retrain even when the data and training config are those of the current champion",
    )
    r.add_argument(
        "--approve",
        metavar="REASON",
        help="with promotion.approval: required, approve this run's promotion now (recorded with REASON and you); "
        "the gate still decides whether to promote",
    )

    t = sub.add_parser(
        "tune",
        help="Ray Tune sweep over the config's tune.search_space, then register the best",
        parents=[CONFIG, OVERRIDES, SUMMARY_JSON, NO_WAIT],
    )
    t.add_argument("--run-name", help="sweep name")
    t.add_argument(
        "--resume",
        action="store_true",
        help="restore the sweep --run-name names from its folder (unpickles Ray Tune's state: only your own)",
    )

    pr = sub.add_parser(
        "predict",
        help="batch inference with a registered model or a checkpoint",
        parents=[CONFIG, OVERRIDES, SUMMARY_JSON],
    )
    pr.add_argument("--model", help="models:/name@alias, models:/name/version, runs:/... or a checkpoint folder")

    mo = sub.add_parser(
        "monitor",
        help="live performance: join later-arriving labels with the written predictions "
        "(without labels: a classifier's estimated from its probabilities)",
        parents=[CONFIG, OVERRIDES, SUMMARY_JSON],
    )
    mo.add_argument(
        "--labels",
        help="a table (file, folder or URI) of id column + label; without it a classifier's "
        "performance is estimated from its probabilities (CBPE)",
    )

    sv = sub.add_parser("serve", help="serve deployments/prefect.yaml's deployments in this process (flow.serve)")
    sv.add_argument("--config", help="config_path for every served deployment (default: each one's own)")
    sv.add_argument("--prefect-file", help="deployment file (default: the checkout's deployments/prefect.yaml)")
    sv.add_argument("--limit", type=int, help="at most this many flow runs at once")

    rp = sub.add_parser(
        "replay",
        help="replay the retraining policies over the table's history (needs split.time_column): what each would "
        "have served, period by period, at what training cost",
        parents=[CONFIG, OVERRIDES, SUMMARY_JSON],
    )
    rp.add_argument(
        "--every",
        required=True,
        metavar="PERIOD",
        help="the period between cutoffs: day, week, month, quarter or a number of days (a numeric time column: a "
        "number in its units)",
    )
    rp.add_argument(
        "--from",
        dest="start",
        metavar="DATE",
        help="the first cutoff (default: the first period start with a third of the rows before it)",
    )
    rp.add_argument(
        "--to", dest="end", metavar="DATE", help="the last cutoff (default: the end of the last full period)"
    )
    rp.add_argument(
        "--policies",
        help="comma-separated: gate, always, every-N (every-2, every-4, ...), never, warm (default: gate, always, "
        "every-2, every-4, never, warm)",
    )
    rp.add_argument("--run-name", help="the replay's name; a replay rerun under its name resumes after its last period")

    sub.add_parser(
        "validate",
        help="every check a retrain makes before training (table, scoring table, output, "
        "memory, champion baseline); exit 0 or 2",
        parents=[CONFIG, OVERRIDES, SUMMARY_JSON],
    )

    i = sub.add_parser("init", help="write a commented config for a table and its label")
    i.add_argument("--data", required=True, help="the table: file, folder, glob or URI")
    i.add_argument("--label", required=True, help="the column to predict")
    i.add_argument("--out", default="trainflow.yaml", help="the config file to write (default: trainflow.yaml)")
    i.add_argument("--force", action="store_true", help="replace an existing --out")

    c = sub.add_parser("config", help="the config's JSON schema, or a config file resolved")
    csub = c.add_subparsers(dest="config_command", required=True)
    csub.add_parser("schema", help="print the JSON schema of the config, with a description for every key")
    csub.add_parser(
        "show",
        help="print the config as trainflow resolves it (defaults, paths, inferred task)",
        parents=[CONFIG, OVERRIDES],
    )

    at_help = "only the version that served at this time (ISO 8601, e.g. 2026-11-24T03:00; UTC when no offset is given)"
    ch = sub.add_parser(
        "champion",
        help="which version served as @champion at a time (--at), its history, or a rollback to an earlier version",
    )
    # `trainflow champion --at TIME --config F`: `trainflow champion history --at TIME --config F`
    ch.add_argument("--at", help=at_help)
    ch.add_argument(
        "--config",
        help="the config naming the registered model and tracking URI (with --at, or alone for the whole history)",
    )
    ch.add_argument("--summary-json", help=ANSWER_JSON)
    chsub = ch.add_subparsers(dest="champion_command")
    for holder, name in ((chsub, "history"), (sub, "history"), (chsub, "rollback"), (sub, "rollback")):
        short = holder is sub  # `trainflow history` and `trainflow rollback`: the same as `trainflow champion ...`
        if name == "history":
            cp = holder.add_parser(
                name,
                help="every version that served as @champion: since, until, why, replaced by"
                + (" (trainflow champion history)" if short else ""),
            )
            cp.add_argument("--at", help=at_help)
        else:
            cp = holder.add_parser(
                name,
                help="move @champion back to a version, through the gate's lock and records"
                + (" (trainflow champion rollback)" if short else ""),
            )
            cp.add_argument(
                "--to",
                metavar="VERSION",
                help="the model version to serve again (default: the one the current champion replaced)",
            )
            cp.add_argument("--reason", required=True, help="why: recorded with the move")
            cp.add_argument(
                "--force",
                action="store_true",
                help="roll back even to a version whose recorded score misses promotion.min_score, that the gate "
                "rejected, or that never served",
            )
        cp.add_argument("--config", required=True, help="the config naming the registered model and tracking URI")
        cp.add_argument("--summary-json", help=ANSWER_JSON)

    g = sub.add_parser(
        "gc",
        help="apply the config's retention now: remove the run folders of earlier retrains that nothing needs",
        parents=[CONFIG, OVERRIDES, SUMMARY_JSON],
    )
    g.add_argument(
        "--dry-run", action="store_true", help="list what would be removed and kept, and why; remove nothing"
    )

    s = sub.add_parser("sample", help="write the bundled synthetic sample tables")
    s.add_argument("--out", default="data/sample", help="the folder to write train.parquet and score.parquet to")
    s.add_argument("--rows", type=int, default=100_000, help="training table rows")
    s.add_argument("--score-rows", type=int, default=20_000, help="scoring table rows")
    s.add_argument("--seed", type=int, default=7, help="the generator's seed")
    s.add_argument("--force", action="store_true", help="rewrite even if the files exist")
    return p


def parse_overrides(items: list[str]) -> dict[str, Any]:
    import yaml

    from trainflow.config import load_yaml

    out = {}
    for item in items:
        if "=" not in item:
            raise TrainflowError(f"--set {item!r}: expected KEY=VALUE, e.g. train.epochs=5")
        key, value = item.split("=", 1)
        try:
            out[key.strip()] = load_yaml(value)
        except yaml.YAMLError as exc:
            raise TrainflowError(f"--set {item!r}: the value is not valid YAML ({str(exc).splitlines()[0]})") from None
    return out
