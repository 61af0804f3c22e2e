"""`trainflow replay`: the retraining policies replayed over the table's history (the replay flow)."""

from __future__ import annotations

from typing import Any

from trainflow.flows.cli.flow_command import FlowCommand
from trainflow.flows.cli.parser import CONFIG, OVERRIDES, SUMMARY_JSON


def _check(config, args) -> None:
    """Refused before anything starts: the key, the period, the policies."""
    from trainflow.flows.replay import check_request

    check_request(config, args.every, args.policies, args.start, args.end)


COMMAND = FlowCommand(
    "replay",
    "trainflow.flows.replay:replay",
    ("every", "start", "end", "policies", "run_name"),
    check=_check,
    preflight=True,
    unlabelled_ok=True,  # a replay leaves out and counts the rows whose label is missing
    prepare_store=True,
)
run = COMMAND.run


def add(sub) -> None:
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


def render(s: dict[str, Any]) -> str:
    """`trainflow replay`'s summary: each period's score per policy (+: retrained and promoted, =: retrained, the gate
    kept the model serving), each policy's totals and the recommendation (the JSON: --summary-json)."""
    r = s.get("replay") or {}
    policies = list(r.get("policies") or {})
    f = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
    shown = str(r.get("metric", "metric")).removeprefix("val_")
    lines = [
        "",
        "trainflow replay",
        f"  run name          {s.get('run_name')}",
        f"  metric            {shown} ({'higher' if r.get('mode') == 'max' else 'lower'} is better; + retrained and "
        "promoted, = retrained and kept out by the gate)",
        "  " + f"{'period':<7}{'from':<12}{'to':<12}{'rows':>7}  " + "".join(f"{p:>10}" for p in policies),
    ]
    for period in r.get("periods") or []:
        cells = []
        for p in policies:
            v = period["policies"].get(p) or {}
            mark = ("+" if v.get("promoted") else "=") if v.get("trained") else " "
            cells.append(f"{f(v.get('score')) + mark:>10}")
        note = f"  ({period['note']})" if period.get("note") else ""
        lines.append(
            f"  {period['period']:<7}{period['start']:<12}{period['end']:<12}{period['rows']:>7}  {''.join(cells)}{note}"
        )
    lines.append("  " + f"{'policy':<10}{'mean':>9}{'regret':>9}{'train s':>10}{'retrains':>10}{'promotions':>12}")
    for p, t in (r.get("policies") or {}).items():
        lines.append(
            f"  {p:<10}{f(t.get('mean_score')):>9}{f(t.get('regret')):>9}{t.get('training_s', 0):>10.1f}"
            f"{t.get('retrains', 0):>10}{t.get('promotions', 0):>12}"
        )
    lines.append(f"  recommendation    {r.get('recommendation')}")
    if r.get("folder"):
        lines.append(f"  predictions       {r['folder']}/predictions (policy=<name>/period=<k>: id, prediction, label)")
    return "\n".join(lines)
