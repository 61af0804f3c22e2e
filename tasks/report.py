"""Task: what a person looks at after a retrain: Prefect artifacts and a loss curve in MLflow."""

from __future__ import annotations

import json
import math
import re
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, Param
from prefect import get_run_logger, task
from prefect.artifacts import create_image_artifact, create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from trainflow.config import ENSEMBLE, Config
from trainflow.run.storage import is_uri, join, write_bytes
from trainflow.run.redact import redact_config, redact_text
from trainflow.tasks.common import artifact_key, chart_figure, md, md_code, png_data_uri
from trainflow.trainer.backtest import backtest_line
from trainflow.tasks.mlflow_run import parent_run
from trainflow.run.tracking import mlflow_key, tracking
from trainflow.trainer.families import REGISTRY
from trainflow.tables.sources import SOURCES

LOSS_CURVE = "loss_curve.png"
MODEL_CARD_FILE = "model_card.md"
MODEL_CARD_HTML = "model_card.html"  # MLflow's run page renders an HTML artifact (a .md one shows as its source)
CARD_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:1em auto;padding:0 1em;line-height:1.45}"
    "table{border-collapse:collapse;margin:.6em 0}th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left}"
    "code{background:#f3f3f3;padding:0 .2em}pre{background:#f6f6f6;padding:.6em;overflow:auto}img{max-width:100%}"
)


# what the card's HTML may hold (nh3's allow-list): Markdown's own tags, images as data: URIs only, no attributes that
# run code; anything else a string from the data or config could carry is dropped or shown as text
CARD_TAGS = {"h1", "h2", "h3", "h4", "p", "ul", "ol", "li", "strong", "em", "code", "pre", "table", "thead"}
CARD_TAGS |= {"tbody", "tr", "th", "td", "img", "br", "hr", "blockquote"}  # no links: the card has none of its own
CARD_ATTRIBUTES = {"img": {"src", "alt"}, "th": {"align", "style"}, "td": {"align", "style"}}


def card_html(card: str, title: str) -> str:
    """The Markdown card as one self-contained HTML page (its images are data: URIs). Raw HTML in the Markdown is
    shown as text (Python-Markdown's HTML block and inline patterns removed), and the page's body goes through an
    allow-list sanitizer (nh3): no string of the data or config becomes a tag, an event handler or a script."""
    import html

    import markdown
    import nh3

    renderer = markdown.Markdown(extensions=["tables", "fenced_code"])
    renderer.preprocessors.deregister("html_block")
    renderer.inlinePatterns.deregister("html")
    # the images' data: URIs (hundreds of KB of base64) stand aside while Markdown's patterns scan the text (a card's
    # conversion 0.12-0.22 s with them in it), then go back into the img tags they belong to
    images: list[str] = []
    token = f"trainflow-image-{uuid.uuid4().hex}-"  # no text of the card's can name one

    def aside(found: re.Match) -> str:
        images.append(found.group(0))
        return f"{token}{len(images) - 1}"

    converted = re.sub(
        rf"{token}(\d+)",
        lambda found: images[int(found.group(1))],
        renderer.convert(re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", aside, card)),
    )
    body = nh3.clean(
        converted,
        tags=CARD_TAGS,
        attributes=CARD_ATTRIBUTES,
        url_schemes={"data"},  # the card's images are data: URIs
        link_rel=None,
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{CARD_STYLE}</style></head><body>{body}</body></html>"
    )


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def training_curves(curves: list[dict[str, Any]], title: str):
    """The validation loss (and the training loss where a model reports it) per epoch or round of every model the
    served one is made of, one panel per family: a family's own run, each fold model of a bag, each member of an
    ensemble labelled with its weight. curves: [{"family", "label", "history", "unit"}]. None when no model reported
    a finite loss (nothing to draw)."""
    from matplotlib.ticker import MaxNLocator

    drawn = [c for c in curves if any(_finite(h.get("val_loss")) for h in c["history"])]
    if not drawn:
        return None
    families = list(dict.fromkeys(c["family"] for c in drawn))
    fig = chart_figure(figsize=(max(6.0, 4.2 * len(families)), 3.6), dpi=100)
    axes = fig.subplots(1, len(families), squeeze=False)[0]
    for ax, family in zip(axes, families):
        mine = [c for c in drawn if c["family"] == family]
        for c in mine:
            steps = [int(h["epoch"]) for h in c["history"]]
            line = ax.plot(steps, [h.get("val_loss", math.nan) for h in c["history"]], label=f"{c['label']} validation")
            if len(mine) == 1 and any(_finite(h.get("train_loss")) for h in c["history"]):
                train = [h.get("train_loss", math.nan) for h in c["history"]]
                ax.plot(steps, train, linestyle="--", color=line[0].get_color(), label=f"{c['label']} training")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs and rounds are whole
        ax.set_xlabel(mine[0].get("unit") or "epoch")
        ax.set_ylabel("loss")
        ax.set_title(mine[0].get("panel") or family, fontsize="small")
        ax.legend(fontsize="x-small")
    fig.suptitle(title, fontsize="small")
    fig.tight_layout()
    return fig


def outcome_chart(scored, judged_on: str, title: str, sample: int = 5_000):
    """On the rows the model is judged on: a regression's predictions against the actual values (the diagonal is
    exact); a classifier's ROC and precision-recall curves (each class against the rest for more than two). None
    when there are no rows, or a classifier's rows hold one class."""
    import numpy as np
    from sklearn import metrics as skm

    if scored is None or len(scored.labels) == 0:
        return None
    prep = scored.prep
    if prep.task != "classification":
        pick = np.random.default_rng(0).permutation(len(scored.labels))[:sample]
        pred = scored.outputs.reshape(-1)[pick] * prep.label_std + prep.label_mean
        truth = scored.labels[pick] * prep.label_std + prep.label_mean
        fig = chart_figure(figsize=(5, 4.5), dpi=100)
        ax = fig.subplots()
        ax.scatter(truth, pred, s=6, alpha=0.4)
        lo, hi = float(min(truth.min(), pred.min())), float(max(truth.max(), pred.max()))
        ax.plot([lo, hi], [lo, hi], linestyle="--", color="grey", label="exact")
        ax.set_xlabel(f"actual {prep.label}")
        ax.set_ylabel("predicted")
        shown = f"{len(pick):,} of {len(scored.labels):,}" if len(pick) < len(scored.labels) else f"{len(pick):,}"
        ax.set_title(f"{title}: {shown} {judged_on} rows, R2 {skm.r2_score(truth, pred):.3f}", fontsize="small")
        ax.legend(fontsize="small")
        fig.tight_layout()
        return fig
    y = scored.labels.astype(np.int64)
    present = np.unique(y)
    if len(present) < 2:
        return None
    from scipy.special import softmax

    probs = softmax(scored.outputs.astype(np.float64), axis=1)  # the outputs are log-probabilities
    classes = [int(present.max())] if prep.num_outputs == 2 else [int(c) for c in present[:10]]
    names = [str(c) for c in (prep.classes or range(prep.num_outputs))]
    fig = chart_figure(figsize=(10, 4.2), dpi=100)
    roc, pr = fig.subplots(1, 2)
    for c in classes:
        truth = y == c
        label = names[c] if c < len(names) else str(c)
        fpr, tpr, _ = skm.roc_curve(truth, probs[:, c])
        roc.plot(fpr, tpr, label=f"{label}: AUC {skm.auc(fpr, tpr):.3f}")
        precision, recall, _ = skm.precision_recall_curve(truth, probs[:, c])
        ap = skm.average_precision_score(truth, probs[:, c])
        pr.plot(recall, precision, label=f"{label}: AP {ap:.3f} (share {truth.mean():.2f})")
    roc.plot([0, 1], [0, 1], linestyle="--", color="grey")
    roc.set_xlabel("false positive rate")
    roc.set_ylabel("true positive rate")
    roc.set_title(f"ROC on {len(y):,} {judged_on} rows", fontsize="small")
    pr.set_xlabel("recall")
    pr.set_ylabel("precision")
    pr.set_title("precision-recall" + ("" if len(classes) == 1 else ", each class against the rest"), fontsize="small")
    for ax in (roc, pr):
        ax.legend(fontsize="x-small")
    fig.suptitle(title, fontsize="small")
    fig.tight_layout()
    return fig


def reliability_diagram(calibration: dict[str, Any], title: str):
    """Accuracy against mean confidence per confidence bin (the diagonal is perfect calibration), bars of rows."""

    fig = chart_figure(figsize=(5, 4), dpi=100)
    ax = fig.subplots()
    bins = calibration["bins"]
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", label="perfectly calibrated")
    ax.plot([b["confidence"] for b in bins], [b["accuracy"] for b in bins], marker="o", label="this model")
    rows = ax.twinx()
    rows.bar(
        [(b["low"] + b["high"]) / 2 for b in bins],
        [b["rows"] for b in bins],
        width=[b["high"] - b["low"] for b in bins],
        alpha=0.15,
        color="tab:blue",
    )
    rows.set_ylabel("validation rows")
    ax.set_xlabel("confidence (top-label probability)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"{title}: ECE {calibration['ece']:.4f}, Brier {calibration['brier']:.4f}")
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig


def backtest_chart(b: dict[str, Any], title: str):
    """The chosen model's metric per slice of its test rows against their age, with the fitted line; the earlier
    model and the one it is compared with, on every test row, at the age of the median test row for each."""
    import numpy as np

    by_time = [(kind, s) for kind in ("out-of-fold", "test") for s in (b.get("by_time") or {}).get(kind, [])]
    fig = chart_figure(figsize=(11 if by_time else 6, 4 if by_time else 3.5), dpi=100)
    ax, when = fig.subplots(1, 2, width_ratios=[1, 1]) if by_time else (fig.subplots(), None)
    if when is not None:  # the metric on every slice of time, out-of-fold rows (oldest) then test rows (newest)
        colors = {"out-of-fold": "tab:green", "test": "tab:blue"}
        for kind in colors:
            at = [i for i, (k, _) in enumerate(by_time) if k == kind]
            if at:
                when.plot(
                    at, [by_time[i][1]["value"] for i in at], marker="o", color=colors[kind], label=f"{kind} rows"
                )
        when.set_xticks(
            range(len(by_time)),
            [f"{s['start']}\nto {s['end']}" for _, s in by_time],
            rotation=60,
            fontsize="x-small",
            ha="right",
        )
        when.set_ylabel(b["metric"])
        when.set_title("by time, on rows the scoring model never trained on", fontsize="small")
        when.legend(fontsize="small")
    if b.get("slices"):
        ages = [s["age"] for s in b["slices"]]
        values = [s["value"] for s in b["slices"]]
        ax.plot(ages, values, marker="o", label=f"{b['metric']} per slice of the test rows")
        fit = np.polyfit(ages, values, 1)
        ax.plot(ages, np.polyval(fit, ages), linestyle="--", color="grey", label="least-squares line")
    e = b.get("earlier")
    if e and e.get("age") is not None:
        per = "month" if b["unit"] == "month" else "unit"
        ax.plot(
            [e["age"], e["age"] + e["shift"]],
            [e["recent"], e["earlier"]],
            linestyle=":",
            marker="s",
            color="tab:red",
            label=f"{b.get('earlier_family', '')} cut off {e['recent_cutoff']} and {e['cutoff']}: "
            f"{e['loss_per_unit']:+.4f} per {per} (noise {e['noise']:.4f})",
        )
    ax.set_xlabel("age: days after the last training row" if b["unit"] == "month" else "age (time column's unit)")
    ax.set_ylabel(b["metric"])
    ax.set_title(title, fontsize="small" if by_time else None)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="x-small", loc="best")
    fig.tight_layout()
    return fig


def importance_chart(rows: list[dict[str, Any]], metric: str, title: str, top: int = 20):
    """Horizontal bars: how much metric worsens when each column is shuffled (error bars: its spread), best on top."""

    shown = rows[:top][::-1]
    fig = chart_figure(figsize=(6, 0.35 * len(shown) + 1.2), dpi=100)
    ax = fig.subplots()
    ax.barh(
        [r["column"] for r in shown],
        [r["importance"] for r in shown],
        xerr=[r.get("importance_std", 0.0) for r in shown],
        color="tab:blue",
    )
    ax.axvline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel(f"{metric} lost when the column is shuffled")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def _importance_lines(summary: dict[str, Any], metric: str) -> str:
    rows = summary.get("feature_importance") or []
    if not rows:
        return "- not computed"
    lines, compared, gains = [], any("change" in r for r in rows), any("gain_share" in r for r in rows)
    for r in rows[:10]:
        change = f"{r['change']:+.4g}" if "change" in r else "not in the champion" if compared else "— (no champion)"
        gain = (f" {r['gain_share']:.1%} |" if "gain_share" in r else " — |") if gains else ""
        lines.append(f"| {md(r['column'])} | {r['importance']:.4g} ± {r['importance_std']:.2g} | {change} |{gain}")
    return (
        f"Permutation importance on {metric} (how much it worsens when the column is shuffled; artifact "
        f"`-importance`), top {len(lines)} of {len(rows)}:\n\n| column | importance | change vs champion |"
        + (" tree gain share |\n|---|---|---|---|\n" if gains else "\n|---|---|---|\n")
        + "\n".join(lines)
    )


def _calibration_lines(summary: dict[str, Any]) -> str:
    c, fit = summary.get("calibration"), summary.get("calibration_fit") or {}
    if not c:
        return "- regression: no class probabilities to calibrate"
    line = (
        f"- expected calibration error (top label, {len(c['bins'])} filled bins) {c['ece']:.4f}, "
        f"Brier score {c['brier']:.4f}, on the {(summary.get('promotion') or {}).get('judged_on', 'validation')} rows "
        "(artifact `-reliability`)"
    )
    if fit.get("method"):
        params = ", ".join(f"{k} {fit[k]:.4g}" for k in ("temperature", "slope", "intercept") if k in fit)
        line += (
            f"\n- calibrated with {fit['method']} ({params}) because {md(fit['why'])}: ECE {fit['ece_before']:.4f} -> "
            f"{fit['ece_after']:.4f}, Brier {fit['brier_before']:.4f} -> {fit['brier_after']:.4f} (fitted on the same split)"
        )
    elif fit.get("why"):
        line += f"\n- not recalibrated: {md(fit['why'])}"
    if fit.get("threshold") is not None:
        line += f"\n- decision threshold {fit['threshold']:.4f} on the positive class's probability ({md(fit['threshold_why'])})"
    return line


def _slices_lines(summary: dict[str, Any], metric: str) -> str:
    slices = summary.get("slices")
    if not slices:
        return "- none asked for (promotion.slices)"
    rows = []
    for column, values in slices.items():
        for value, e in values.items():
            rows.append(
                f"| {md(column)} | {md(value)} | {e['rows']} | {_fmt(e.get(metric, ''))} | "
                f"{_fmt(e.get('champion_' + metric, ''))} | {'yes' if e.get('judged') else 'no'} |"
            )
    return f"| column | value | rows | {metric} | champion's | judged |\n|---|---|---|---|---|---|\n" + "\n".join(rows)


def _confidence_line(promo: dict[str, Any]) -> str:
    c = promo.get("confidence") or {}
    if not c.get("resamples"):
        return ""
    return (
        f"\nGain {c['gain']:+.6g} (5th-95th percentile {c['gain_p05']:+.6g} to {c['gain_p95']:+.6g} over "
        f"{c['resamples']} paired bootstrap resamples of {c['rows']} validation rows; not better by more than the margin "
        f"in {c['share_not_better']:.0%} of them)."
    )


def _fmt(v: Any, missing: str = "—") -> str:
    """A figure as the card shows it; None or NaN (not applicable, not measured) as a dash (with a word: missing)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return missing
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _budget_line(budget: dict[str, Any]) -> str:
    return f"- {md(budget['description'])}" if budget.get("description") else "- not recorded"


def _family_line(config: Config, summary: dict[str, Any]) -> str:
    family = summary.get("model_family") or config.model.families[0]
    if family == ENSEMBLE and summary.get("ensemble"):
        ens = summary["ensemble"]
        weights = ", ".join(f"{md_code(m['family'])} {m['weight']:.2f}" for m in ens["members"] if m["weight"] > 0)
        return (
            f"- family `{family}`: the weighted mean of {weights} (greedy ensemble selection, {ens['rounds']} rounds "
            f"on {ens['rows']} {'out-of-fold' if ens.get('weighted_on') == 'out-of-fold' else 'validation'} rows; "
            "scores cross-fitted over two halves of them)"
        )
    return f"- family {md_code(family)}: {md(REGISTRY[family].describe(config.model.for_family(family)))}"


def _chosen_on(summary: dict[str, Any]) -> str:
    if summary.get("oof_metrics"):
        return (
            f"Out-of-fold predictions chose it: each of {summary.get('oof_rows')} rows predicted by the one of "
            f"{summary['folds']} fold models that never trained on it (early stopping on each model's own held-out "
            "fold; the family, ensemble weights, calibration); the served model averages the fold models. The test "
            "rows touched no choice."
        )
    return "Validation rows chose it (early stopping, the family, calibration); the test rows touched no choice."


def _candidates_lines(summary: dict[str, Any], metric: str) -> str:
    """The leaderboard as leaderboard_table gives it (the summary's candidates, the parent MLflow run's
    leaderboard.json, trainflow.leaderboard): the same rows under the same names."""
    from trainflow.tasks.mlflow_run import leaderboard_table

    table = leaderboard_table(summary)
    if not table:
        return ""
    oof = bool(summary.get("oof_metrics"))
    shown = metric.replace("val_", "oof_", 1) if oof else metric
    columns = list(table)
    words = {"epoch": "— (no epochs of its own)", "epochs_run": "—", "unit": "—", "train_s": "— (not measured)"}
    lines = "\n".join(
        "| " + " | ".join(_cell(table[c][i], words.get(c, "—")) for c in columns) + " |"
        for i in range(len(table[columns[0]]))
    )
    return (
        f"\n\nEvery model trained in this run, best first by {shown} on "
        f"{'the out-of-fold predictions' if oof else 'the validation split'} (the test rows scored each once every "
        "choice was made; `epoch`: the epoch or round kept, `epochs_run`: those run, `train_s`: training seconds, "
        "an ensemble's its own; also the parent MLflow run's leaderboard.json and `trainflow.leaderboard(summary)`):"
        f"\n\n| {' | '.join(columns)} |\n|{'---|' * len(columns)}\n{lines}"
    )


def _cell(value: Any, missing: str) -> str:
    """A leaderboard cell: a value from the run escaped (a family's or a user model's name), or trainflow's word for
    a missing one."""
    shown = _fmt(value, "")
    return md(shown) if shown else missing


def _predictions_line(summary: dict[str, Any]) -> str:
    if not summary.get("predictions_path"):
        return "- no batch inference in this run"
    return _predictions_rows(summary) + _drift_line(summary)


def _predictions_rows(summary: dict[str, Any]) -> str:
    line = f"- {summary['output_rows']} predictions for {summary['input_rows']} input rows: {md_code(summary['predictions_path'])}"
    unseen = summary.get("unseen_categories") or {}
    if unseen:
        line += "\n- values never seen in training (predicted with the unknown code): " + ", ".join(
            f"{md_code(c)} {n} row(s)" for c, n in sorted(unseen.items())
        )
    return line


def _validation_lines(v: dict[str, Any]) -> str:
    if not v.get("checks"):
        return f"- not checked: {v.get('note', 'no champion to compare with')}"
    lines = [
        f"- against version {v['champion_version']}'s training data: {len(v['checks'])} check(s), "
        f"{len(v['anomalies'])} anomal(ies) (on_anomaly: {v.get('on_anomaly')})"
    ]
    lines += [f"- anomaly: {md(a)}" for a in v["anomalies"]]
    rows = "\n".join(
        f"| {c['check']} | {md(c['column'] or '')} | {c['score']} | {c['threshold']} | {'yes' if c['anomaly'] else ''} |"
        for c in v["checks"]
    )
    return "\n".join(lines) + f"\n\n| check | column | score | threshold | anomaly |\n|---|---|---|---|---|\n{rows}"


def _drift_line(summary: dict[str, Any]) -> str:
    d = summary.get("drift") or {}
    if not d.get("columns"):
        return ""
    return (
        f"\n- drift from the serving model's training data: {', '.join(map(md, d['drifted_columns'])) or 'none'} "
        f"of {len(d['columns'])} feature(s) over {d['rows']} rows (artifact `-drift`)"
    )


def _serving_line(promo: dict[str, Any]) -> str:
    floor = (
        ""
        if promo.get("min_score") is None
        else (f" Floor promotion.min_score {promo['min_score']:g}: {'missed' if promo.get('below_floor') else 'met'}.")
    )
    serving = (
        f"`@champion` is now version {promo['serving_version']}."
        if promo.get("serving_version")
        else "No version is `@champion`: none has met the floor yet, so nothing was predicted."
    )
    return serving + floor


def _metric_rows(validation: dict[str, Any], test: dict[str, Any]) -> str:
    """One row per metric, named by what it is (accuracy, roc_auc, ...): the validation or out-of-fold figure and the
    test figure (a dash where the rows did not measure it)."""
    names = dict.fromkeys(
        [k.split("_", 1)[1] for k in validation if k.startswith(("val_", "oof_"))]
        + [k.removeprefix("test_") for k in test if k.startswith("test_")]
    )
    rows = []
    for name in sorted(names):
        chose = validation.get(f"val_{name}", validation.get(f"oof_{name}"))
        rows.append(f"| {name} | {_fmt(chose)} | {_fmt(test.get(f'test_{name}'))} |")
    return "\n".join(rows)


def _model_lines(config: Config, summary: dict[str, Any]) -> str:
    """What serves, and where its epochs or rounds stop: a family's run, a bag of fold models, an ensemble."""
    best, family = summary["best_checkpoint"], summary.get("model_family")
    unit = (summary.get("training_budget") or {}).get("unit", "epoch")
    if family == ENSEMBLE:
        kept = "- no epochs or rounds of its own: each member as its own run kept it (the candidates below)"
        if (summary.get("folds") or 1) > 1:
            kept += f"; each member is the mean of its {summary['folds']} fold models"
    elif (summary.get("folds") or 1) > 1:
        kept = (
            f"- the mean of {summary['folds']} fold models, each kept at the {unit} its own held-out fold scored best "
            f"(the latest kept: {unit} {best['epoch']}; the longest ran {summary['epochs_run']})"
        )
    else:
        kept = f"- kept: {unit} {best['epoch']} of the {summary['epochs_run']} run this time (the best on validation)"
    return f"{_family_line(config, summary)}\n{kept}"


def _rows_line(summary: dict[str, Any]) -> str:
    if (summary.get("folds") or 1) > 1:
        return (
            f"{summary['training_rows']} ({summary.get('oof_rows')} in {summary['folds']} cross-fitting folds, "
            f"{summary.get('test_rows') or 0} test)"
        )
    return (
        f"{summary['training_rows']} ({summary['train_rows']} training, {summary['validation_rows']} validation, "
        f"{summary.get('test_rows') or 0} test)"
    )


def _champion(promo: dict[str, Any]) -> str:
    if promo.get("champion_version") is None:
        return "no champion before it"
    return f"champion v{promo['champion_version']} {_fmt(promo['champion_score'])}"


def _chose_rows(summary: dict[str, Any]) -> str:
    if summary.get("oof_metrics"):
        return f"out-of-fold ({summary.get('oof_rows') or 0:,} rows)"
    return f"validation ({summary.get('validation_rows') or 0:,} rows)"


def _curve_lines(curve_uri: str | None, curve_png: str) -> str:
    if not curve_png:
        return "No training curve: no model this one is made of reported a loss per epoch or round."
    return (
        f"Loss during training of every model this one is made of (also {md_code(curve_uri)} and the MLflow run's "
        f"`{LOSS_CURVE}`):\n\n![training curves]({curve_png})"
    )


def _outcome_lines(outcome_png: str, judged_on: str) -> str:
    if not outcome_png:
        return f"No plot of the {judged_on} rows: none were scored, or they hold one class."
    return f"On the {judged_on} rows (the MLflow run's `{judged_on}_rows.png`):\n\n![{judged_on} rows]({outcome_png})"


def _snapshot_line(summary: dict[str, Any]) -> str:
    """The card's line naming the Delta or Iceberg snapshot the run read, or a PostgreSQL source's copy."""
    snap = summary.get("data_snapshot")
    if not snap:
        return ""
    src = SOURCES.get(snap["format"])
    if src is not None and src.kind == "query":
        read = f"table {md_code(snap['table'])}" if snap.get("table") else f"query {md_code(snap['query'][:200])}"
        return (
            f"\n- read: PostgreSQL {read} on {md_code(snap['server'])}, {snap['rows']:,} rows copied in one "
            f"transaction at {md(snap['copied_at'])} to {md_code(snap['location'])}"
        )
    what = getattr(src, "version_word", "snapshot")
    return (
        f"\n- read: {snap['format']} table {md_code(snap['table'])} at {what} {md(snap['snapshot'])} (table id "
        f"{md_code(snap['table_id'])})"
    )


def _backtest_item(summary: dict[str, Any]) -> str:
    """The card's data list's backtest item (on a line of its own), or nothing."""
    return "\n- backtest: " + md(backtest_line(summary["backtest"])) if summary.get("backtest") else ""


def _test_rows_lines(summary: dict[str, Any]) -> str:
    """What the test figures leave out (test_rows_note, a warm start's source rows), between blank lines, or nothing."""
    return "\nTest rows: " + md(summary["test_rows_note"]) + "\n" if summary.get("test_rows_note") else ""


def model_card(
    config: Config,
    summary: dict[str, Any],
    curve_uri: str | None,
    curve_png: str = "",
    outcome_png: str = "",
    judged_on: str = "validation",
) -> str:
    """Markdown: data, metrics, promotion decision, lineage and the resolved config."""
    best = summary["best_checkpoint"]
    promo = summary["promotion"]
    config_json = json.dumps(redact_config(config.to_dict()), indent=2)
    fence = "`" * max(3, 1 + max((len(r) for r in re.findall("`+", config_json)), default=0))  # never closed inside
    return f"""# {md(summary["registered_model"])} version {summary["model_version"]}

**Promotion: {promo["decision"]}** on {promo["metric"]} ({promo["mode"]}, margin {promo["margin"]:g}), judged on {promo.get("rows")} {promo.get("judged_on", "validation")} rows:
challenger v{promo["challenger_version"]} {_fmt(promo["challenger_score"])}, {_champion(promo)}.
{md(promo["reason"])}.{(" Judged on " + md(promo["judged_rows_note"]) + ".") if promo.get("judged_rows_note") else ""} {_serving_line(promo)}{_confidence_line(promo)}

## Data
- table: {md_code(summary["data_path"])}
- fingerprint: {md_code(summary["data_fingerprint"])}{_snapshot_line(summary)}
- rows: {_rows_line(summary)}
- split: {md(summary.get("split") or "train/validation")}{f"; assignment {md_code(summary['split_path'])}" if summary.get("split_path") else ""}{_backtest_item(summary)}

## The model
{_model_lines(config, summary)}

{_chosen_on(summary)}

| metric | {_chose_rows(summary)} | test ({summary.get("test_rows") or 0:,} rows) |
|---|---|---|
{_metric_rows(best["metrics"], summary.get("test_metrics") or {})}
{_test_rows_lines(summary)}
{_curve_lines(curve_uri, curve_png)}

{_outcome_lines(outcome_png, judged_on)}

## What the model relies on
{_importance_lines(summary, promo["metric"])}

## Calibration
{_calibration_lines(summary)}

## Slices of the {promo.get("judged_on", "validation")} rows
{_slices_lines(summary, promo["metric"])}

{"## Candidates" + _candidates_lines(summary, promo["metric"]) if summary.get("candidates") else ""}

## Training budget
{_budget_line(summary.get("training_budget") or {})}

## Data validation
{_validation_lines(summary.get("validation") or {})}

## Predictions
{_predictions_line(summary)}

## Lineage
data {md_code(summary["data_fingerprint"])} → Ray Train run {md_code(summary["ray_run_path"])} →
MLflow run {md_code(summary["mlflow_run_id"])}, model {md_code(summary["model_uri"])} →
{f"predictions {md_code(summary['predictions_path'])} (by version {summary.get('predictions_model_version')})" if summary.get("predictions_path") else "no predictions in this run"}

## Config
{fence}json
{config_json}
{fence}
"""


def new_params(client: mlflow.MlflowClient, run_id: str, values: dict[str, Any], prefix: str) -> list[Param]:
    """values as the run's params under prefix, but for the ones it already has: a version an earlier retrain
    registered (its checkpoint chosen again by a resumed retrain with more epochs) keeps the budget it was trained
    under (MLflow refuses to change a param; the run records that training)."""
    logged = client.get_run(run_id).data.params
    params = {mlflow_key(f"{prefix}{k}"): str(v)[:6000] for k, v in values.items()}
    return [Param(k, v) for k, v in params.items() if k not in logged]


@task(name="report", retries=1, retry_delay_seconds=2, cache_policy=NO_CACHE)
def report(
    config: Config,
    history: list[dict[str, float]],
    summary: dict[str, Any],
    curves: list[dict[str, Any]] | None = None,
    scored=None,
    judged_on: str = "validation",
) -> dict[str, str]:
    """The model card, the served model's training curves (curves: training_curves'), its ROC and precision-recall
    curves or predictions against the actual values on the rows it is judged on (scored), the per-epoch metrics
    (history) and the other plots, as Prefect artifacts and in the MLflow run. A plot with nothing to draw is not
    made; the card says why."""
    name = summary["registered_model"]
    title = f"{name} v{summary['model_version']}"
    curves = curves if curves is not None else [{"family": summary["model_family"], "label": "", "history": history}]
    fig = training_curves(curves, f"{title}: loss during training")
    # each figure drawn to PNG once: the same bytes go to storage, MLflow and Prefect's artifact
    curve_drawn, curve_uri = _png(fig), None
    if curve_drawn is not None:
        curve = join(config.storage_path, summary["run_name"], LOSS_CURVE)  # the summary's paths are redacted
        write_bytes(curve, curve_drawn[0])
        curve_uri = redact_text(curve if is_uri(curve) else f"file://{curve}")
    outcome_drawn = _png(outcome_chart(scored, judged_on, title))
    with tracking(config.mlflow.tracking_uri):
        diagram, aging = _log_plots(mlflow.MlflowClient(), summary, curve_drawn, outcome_drawn, judged_on)
    png, outcome_png = (drawn[1] if drawn is not None else "" for drawn in (curve_drawn, outcome_drawn))  # data: URIs
    card = model_card(config, summary, curve_uri, png, outcome_png, judged_on)
    with tracking(config.mlflow.tracking_uri):
        client = mlflow.MlflowClient()
        for run_id in [r for r in dict.fromkeys([summary["mlflow_run_id"], parent_run(config)]) if r]:
            client.log_text(run_id, card, MODEL_CARD_FILE)  # the version's run, and the retrain's parent run
            client.log_text(run_id, card_html(card, f"{name} version {summary['model_version']}"), MODEL_CARD_HTML)
    ids = _artifacts(summary, card, history, (png, curve_uri), outcome_png, judged_on, diagram, aging)
    get_run_logger().info("artifacts: %s (training curves: %s)", ", ".join(ids), curve_uri or "none to draw")
    return {k: str(v) for k, v in ids.items()}


def _png(fig) -> tuple[bytes, str] | None:
    """A figure as (PNG bytes, data: URI) (tasks/common.py png_data_uri), or None for no figure."""
    return png_data_uri(fig) if fig is not None else None


def _log_png(client, run_id: str, png: tuple[bytes, str] | None, artifact_file: str) -> None:
    """A drawn figure's PNG bytes as the run's artifact_file (as MlflowClient.log_figure logs one: a file it uploads)."""
    if png is None:
        return
    with tempfile.TemporaryDirectory(prefix="trainflow-plot-") as folder:
        path = Path(folder, artifact_file)
        path.write_bytes(png[0])
        client.log_artifact(run_id, str(path))


def _log_plots(client, summary: dict[str, Any], curve_drawn, outcome_drawn, judged_on: str) -> tuple:
    """The plots (the training curves' and the outcome's PNGs as drawn: (bytes, data URI) or None), the slices, the
    backtest and the validation checks in the version's MLflow run, with what `auto` resolved to and the scoring rows
    whose text values the model never saw; (the reliability diagram, the backtest chart) as PNGs, each None when not
    drawn."""
    run_id, name, version = summary["mlflow_run_id"], summary["registered_model"], summary["model_version"]
    _log_png(client, run_id, curve_drawn, LOSS_CURVE)
    _log_png(client, run_id, outcome_drawn, f"{judged_on}_rows.png")
    diagram = None
    if summary.get("calibration"):
        diagram = _png(reliability_diagram(summary["calibration"], f"v{version}"))
        _log_png(client, run_id, diagram, "reliability.png")
    if summary.get("slices"):
        client.log_dict(run_id, summary["slices"], "slices.json")
    aged, aging = summary.get("backtest"), None
    if aged:
        client.log_dict(run_id, aged, "backtest.json")
    if aged and (aged.get("slices") or aged.get("earlier") or any((aged.get("by_time") or {}).values())):
        aging = _png(backtest_chart(aged, f"{name} v{version}: {aged['metric']} by age"))
        _log_png(client, run_id, aging, "backtest.png")
    validation = summary.get("validation") or {}
    if validation.get("checks"):
        client.log_dict(run_id, validation, "validation.json")
    budget = new_params(client, run_id, summary.get("training_budget") or {}, "budget.")
    client.log_batch(run_id, params=budget, metrics=_report_metrics(summary))
    return diagram, aging


def _report_metrics(summary: dict[str, Any]) -> list[Metric]:
    """The test rows' metrics, unseen values per text column, the validation's anomalies and the backtest's slopes."""
    now, aged, validation = int(time.time() * 1000), summary.get("backtest"), summary.get("validation") or {}
    earlier = (aged or {}).get("earlier")
    return (
        [Metric(k, float(v), now, 0) for k, v in (summary.get("test_metrics") or {}).items() if math.isfinite(v)]
        + [
            Metric(mlflow_key(f"unseen_rows.{c}"), float(n), now, 0)
            for c, n in (summary.get("unseen_categories") or {}).items()
        ]
        + (
            [Metric("validation.anomalies", float(len(validation["anomalies"])), now, 0)]
            if validation.get("checks")
            else []
        )
        + [
            Metric(f"backtest.{k}", float(aged[k]), now, 0)
            for k in ("loss_per_unit", "noise")
            if aged and isinstance(aged.get(k), (int, float)) and math.isfinite(aged[k])
        ]
        + [
            Metric(f"backtest.earlier_{k}", float(earlier[k]), now, 0)
            for k in ("loss_per_unit", "noise", "recent", "earlier")
            if earlier and math.isfinite(earlier[k])
        ]
    )


def _artifacts(summary, card, history, curve, outcome_png, judged_on, diagram, aging) -> dict[str, Any]:
    """The Prefect artifacts of the report (curve: the training curves' data URI and where the PNG lies); their
    ids by name."""
    name, (png, curve_uri), aged = summary["registered_model"], curve, summary.get("backtest")
    ids = {
        "model_card": create_markdown_artifact(
            markdown=card,
            key=artifact_key(name, "model-card"),
            description=f"Model card of {name} version {summary['model_version']}",
        ),
    }
    if history:  # an ensemble has no epochs of its own: its members' are in their runs
        ids["metrics"] = create_table_artifact(
            table=[{k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()} for row in history],
            key=artifact_key(name, "epoch-metrics"),
            description=f"Per-epoch metrics of Ray Train run {summary['run_name']}",
        )
    if png:
        ids["loss_curve"] = create_image_artifact(
            image_url=png,
            key=artifact_key(name, "loss-curve"),
            description=f"Training curves of the models {name} version {summary['model_version']} is made of "
            f"({curve_uri})",
        )
    if outcome_png:
        ids["outcome"] = create_image_artifact(
            image_url=outcome_png,
            key=artifact_key(name, "test-rows" if judged_on == "test" else "validation-rows"),
            description=f"{name} version {summary['model_version']} on its {judged_on} rows ({judged_on}_rows.png)",
        )
    importance = summary.get("feature_importance") or []
    if importance:
        chart = importance_chart(importance, summary["promotion"]["metric"], f"{name} v{summary['model_version']}")
        ids["importance"] = create_image_artifact(
            image_url=png_data_uri(chart)[1],
            key=artifact_key(name, "importance"),
            description=f"Permutation importance of {name} version {summary['model_version']}",
        )
    if aging is not None:
        ids["backtest"] = create_image_artifact(
            image_url=aging[1],
            key=artifact_key(name, "backtest"),
            description=f"{name} version {summary['model_version']}: {backtest_line(aged)}",
        )
    if diagram is not None:
        ids["reliability"] = create_image_artifact(
            image_url=diagram[1],
            key=artifact_key(name, "reliability"),
            description=f"Reliability diagram of {name} version {summary['model_version']} on the "
            f"{(summary.get('promotion') or {}).get('judged_on', 'validation')} rows",
        )
    return ids
