"""`trainflow monitor`: live performance from later-arriving labels joined with the written predictions, or a
classifier's estimated from its probabilities (the monitor flow)."""

from __future__ import annotations

from typing import Any

from trainflow.flows.cli.flow_command import FlowCommand
from trainflow.flows.cli.parser import CONFIG, OVERRIDES, SUMMARY_JSON


def check(config, args) -> None:
    """What monitor reads, checked before Prefect's server and the flow start (a mistake answered in a second, not
    in ten): inference.output set and holding predictions trainflow wrote (a folder's manifest; a table sink's rows
    the flow reads), and a --labels table that is there."""
    from trainflow.config import infer_format
    from trainflow.errors import DataError
    from trainflow.tables.files import did_you_mean, list_files, open_dataset
    from trainflow.tables.outputs import read_manifest
    from trainflow.tables.sinks import SINK_FORMATS

    output = config.inference.output
    if not output:
        raise DataError("monitor reads the predictions under inference.output; set it in the config")
    if config.inference.output_format not in SINK_FORMATS and read_manifest(output) is None:
        raise DataError(f"{output}: no trainflow predictions here to monitor")
    if args.labels is None:
        return
    if not config.data.id_column:
        raise DataError("monitor joins labels to predictions by data.id_column; set it in the config")
    fmt = infer_format(args.labels)
    list_files(args.labels, fmt, "labels table")
    names = open_dataset(args.labels, fmt, config.data.csv).schema.names  # the files' metadata: no rows read
    for col in (config.data.id_column, config.data.label):
        if col not in names:
            raise DataError(f"{args.labels}: column {col!r} not found; {did_you_mean(col, names)}columns are {names}")


COMMAND = FlowCommand("monitor", "trainflow.flows.monitor:monitor", ("labels",), check=check)
run = COMMAND.run


def add(sub) -> None:
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


def render(s: dict[str, Any]) -> str:
    """The verdict and the figures behind it (the JSON: --summary-json)."""
    m = s.get("monitor") or {}
    f = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
    return "\n".join(
        [
            "",
            "trainflow summary",
            f"  model             {m.get('model_uri')}",
            f"  labelled rows     {m.get('rows')} of {m.get('predictions')} predictions (coverage {m.get('coverage', 0):.0%})"
            if not m.get("estimated")
            else f"  estimated         from the probabilities of {m.get('predictions')} predictions "
            "(CBPE: no labels; holds while they stay calibrated)",
            f"  {m.get('metric', 'metric'):<18}{'estimated' if m.get('estimated') else 'live'} {f(m.get('live_score'))}, "
            f"at registration {f(m.get('validation_score'))}"
            + (f" ({m['baseline_on']})" if m.get("baseline_on") else "")
            + f", drop {f(m.get('drop'))} (max {m.get('max_drop')})",
            f"  verdict           {m.get('verdict')}",
            *(
                [
                    f"  estimated         {m['metric']} {f(m['estimated_metrics'].get(m['metric']))} from the probabilities of "
                    f"the same rows (CBPE), against {f(m.get('live_score'))} from their labels"
                ]
                if m.get("estimated_metrics") and m.get("metric") in m["estimated_metrics"]
                else []
            ),
        ]
    )
