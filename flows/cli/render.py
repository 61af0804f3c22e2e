"""The summary parts several commands share: a training run's (retrain, tune), its scoring lines (predict too) and
retention's (gc too), as a person reads them (the JSON itself: --summary-json)."""

from __future__ import annotations

from typing import Any


def _progress_line(s: dict[str, Any]) -> str:
    budget = s.get("training_budget") or {}
    unit = budget.get("unit", "epoch")
    line = f"  {unit + 's run':<18}{s.get('epochs_run')}" + (
        f" of at most {budget['limit']}" if "limit" in budget else ""
    )
    if budget.get("batch_size"):
        line += f", batch {budget['batch_size']} per worker"
    if s.get("resumed_from_epoch") is not None:
        line += f" (resumed from epoch {s['resumed_from_epoch']})"
    return line


def _weights(s: dict[str, Any]) -> str:
    return ", ".join(f"{m['family']} {m['weight']:.2f}" for m in (s.get("ensemble") or {}).get("members", []))


def format_summary(s: dict[str, Any]) -> str:
    """A retrain's or a sweep's summary for a person (the JSON: --summary-json)."""
    head = ["", "trainflow summary"]
    if s.get("skipped"):
        lines = [
            f"  skipped           {s['skipped']['reason']}",
            f"  data              {s.get('data_path')} (fingerprint {s.get('data_fingerprint')})",
        ]
        return "\n".join(head + lines + scoring_lines(s))
    retention = [format_gc_summary(s["retention"])] if s.get("retention") else []
    parts = (_run_lines, _scores_lines, _sweep_lines, _candidate_lines, _training_lines, _gate_lines, scoring_lines)
    return "\n".join(head + [line for part in parts for line in part(s)] + retention)


def _run_lines(s: dict[str, Any]) -> list[str]:
    """What trained: the run, its data, the family and its best checkpoint."""
    best = s.get("best_checkpoint") or {}
    return [
        *(
            [
                f"  already finished  run {s.get('run_name')} finished at {s['already_finished']} on the same data and "
                "config (this start waited for it): nothing was done again; its summary follows"
            ]
            if s.get("already_finished")
            else []
        ),
        f"  run name          {s.get('run_name')}",
        f"  data              {s.get('data_path')} ({s.get('training_rows')} rows, fingerprint {s.get('data_fingerprint')})",
        f"  model family      {s.get('model_family')}",
        *(
            [
                f"  ensemble          {_weights(s)} (greedy ensemble selection"
                + ("; its scores cross-fitted)" if s.get("oof_metrics") else " on the validation split)"),
                f"  checkpoint        {best.get('path')}",
            ]
            if s.get("ensemble") and s.get("model_family") == "ensemble"
            else [
                _progress_line(s),
                f"  best checkpoint   {(s.get('training_budget') or {}).get('unit', 'epoch')} "
                f"{best.get('epoch')}{' of its refit' if (s.get('refit') or {}).get('refitted') else ''}: "
                f"{best.get('path')}",
            ]
        ),
    ]


def _scores_lines(s: dict[str, Any]) -> list[str]:
    """The scores that chose the model and the test rows' beside them, the roles, the backtest, the MLflow run."""
    from trainflow.trainer.backtest import backtest_line

    metrics = (s.get("best_checkpoint") or {}).get("metrics") or {}
    shown = {k: v for k, v in metrics.items() if k.startswith("val_") or k == "train_loss"}
    return [
        *(
            [
                "  validation        "
                + ", ".join(f"{k}={v:.4f}" for k, v in shown.items())
                + f" ({s.get('validation_rows')} rows; chose the model)"
            ]
            if not s.get("oof_metrics")
            else [
                "  out-of-fold       "
                + ", ".join(f"{k}={v:.4f}" for k, v in s["oof_metrics"].items() if k != "train_loss")
                + f" ({s.get('oof_rows')} rows, each predicted by the one of {s.get('folds')} fold models that never saw it;"
                " chose the model)"
            ]
        ),
        *(
            [
                "  test              "
                + ", ".join(f"{k}={v:.4f}" for k, v in (s.get("test_metrics") or {}).items())
                + f" ({s.get('test_rows')} rows no choice touched"
                + (f"; {s['test_rows_note']}" if s.get("test_rows_note") else "")
                + ")"
            ]
            if s.get("test_metrics")
            else []
        ),
        *_refit_lines(s.get("refit")),
        *([f"  roles             {s['split']}"] if s.get("split") and s.get("split").startswith("by time") else []),
        *([f"  note              {s['split_note']}"] if s.get("split_note") else []),
        *([f"  backtest          {backtest_line(s['backtest'])}"] if s.get("backtest") else []),
        f"  mlflow            run {s.get('mlflow_run_id')}, model {s.get('model_uri')}",
    ]


def _refit_lines(refit: dict[str, Any] | None) -> list[str]:
    """train.refit: what was trained again and both models' test figures, or why nothing was."""
    if not refit:
        return []
    if not refit.get("refitted"):
        return [f"  refit             none: {refit.get('why')}"]
    members = ", ".join(f"{m['family']} {m['rounds']} rounds" for m in refit["members"])
    figures = refit.get("test_metrics") or {}
    chosen, refitted = figures.get("chosen") or {}, figures.get("refitted") or {}
    compared = ", ".join(f"{k} {chosen[k]:.4f} -> {v:.4f}" for k, v in refitted.items() if k in chosen)
    return [
        f"  refit             {members} on all {refit.get('rows')} rows that may train; serves"
        + (f"; test rows, chosen -> refitted: {compared}" if compared else "")
    ]


def _sweep_lines(s: dict[str, Any]) -> list[str]:
    """A sweep's trials, best first."""
    lines: list[str] = []
    if s.get("trials"):
        b, metric = s.get("best_trial") or {}, s.get("tune_metric")
        lines.append(
            f"  sweep             {len(s['trials'])} trials, {s.get('max_concurrent_trials')} at a time; "
            f"best {b.get('trial_id')} by {metric} ({s.get('tune_mode')})"
        )
        for t in s["trials"]:
            score = t.get(metric)
            params = ", ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in (t.get("params") or {}).items()
            )
            lines.append(
                f"    {t.get('trial_id')}  {params}  {metric}={'-' if score is None else f'{score:.4f}'}"
                f" after {t.get('epochs_run')} epoch(s), {t.get('status')}"
            )
    return lines


def _candidate_lines(s: dict[str, Any]) -> list[str]:
    """The candidates by the score that chose among them, the families left out and why."""
    lines: list[str] = []
    if s.get("candidates"):
        metric = (s.get("promotion") or {}).get("metric")
        tested = metric.replace("val_", "test_", 1) if metric else None
        where = "the validation split" if not s.get("oof_metrics") else "the out-of-fold predictions"
        chose = metric.replace("val_", "oof_", 1) if metric and s.get("oof_metrics") else metric
        lines.append(
            f"  candidates        by {chose} on {where}, best first"
            + (f" ({tested} on the test rows beside it):" if s.get("test_metrics") else ":")
        )
        for c in s["candidates"]:
            score, test = c.get(chose), c.get(tested)
            how = (
                f"weights {_weights(s)}"
                if c["family"] == "ensemble"
                else f"{c.get('unit', 'epoch')} {c['epoch']} of {c['epochs_run']}"
            )
            lines.append(
                f"    {c['family']:<10} {chose}={'-' if score is None else f'{score:.4f}'}"
                + (f"  {tested}={test:.4f}" if test is not None else "")
                + f" ({how}, run {c['run_name']})"
            )
    for family, why in (s.get("families_left_out") or {}).items():
        lines.append(f"    {family:<10} left out: {why}")
    for member in (s.get("ensemble") or {}).get("members", []):
        if member.get("left_out"):
            lines.append(f"    {member['family']:<10} not in the ensemble: {member['left_out']}")
    return lines


def _training_lines(s: dict[str, Any]) -> list[str]:
    """How the training went: the time budget, a warm start, recoveries, families that failed."""
    lines: list[str] = []
    budget = s.get("time_budget") or {}
    if budget.get("rule") or budget.get("cut_short"):
        cut = ", ".join(f"{run} after step {step}" for run, step in (budget.get("cut_short") or {}).items())
        lines.append(
            f"  time budget       training took {budget.get('training_s')} s; {budget.get('rule') or 'no limit'}"
            + (f"; stopped by it: {cut}" if cut else "")
        )
    warm = s.get("warm_start")
    if warm:
        lines.append(
            f"  warm start        a fresh fit: {warm['fresh']} ({warm['from']})"
            if warm.get("fresh")
            else f"  warm start        {warm['family']} continued {warm['from']} (version {warm['version']}, "
            + (f"{warm['offset']} rounds" if warm.get("offset") else "its weights")
            + ") on the new rows"
        )
    if s.get("recovered"):
        from trainflow.tasks.values import describe_recovered

        lines.append(f"  recovered         {describe_recovered(s['recovered'])}")
    for family, why in (s.get("families_failed") or {}).items():
        lines.append(f"    {family:<10} failed, left out (the other families went on): {why}")
    return lines


def _gate_lines(s: dict[str, Any]) -> list[str]:
    """What the model relies on, its calibration, and the gate's decision with its rules' lines."""
    lines: list[str] = []
    if s.get("feature_importance"):
        lines.append(
            "  relies on         "
            + ", ".join(f"{r['column']} {r['importance']:.3g}" for r in s["feature_importance"][:5])
            + f" ({(s.get('promotion') or {}).get('metric')} lost when shuffled)"
        )
    if s.get("calibration"):
        where = (s.get("promotion") or {}).get("judged_on", "validation")
        lines.append(
            f"  calibration       ECE {s['calibration']['ece']:.4f}, Brier {s['calibration']['brier']:.4f} ({where} rows)"
        )
    if s.get("promotion"):
        p = s["promotion"]
        lines.append(
            f"  promotion         {p.get('decision')} on {p.get('rows')} {p.get('judged_on', 'validation')} rows: "
            f"{p.get('reason')}"
        )
        lines += [f"{'':<20}{check['line']}" for check in p.get("checks") or []]  # tasks/gate_rules.py RULES
        if p.get("judged_rows_note"):
            lines.append(f"  judged rows       {p['judged_rows_note']}")
    return lines


def scoring_lines(s: dict[str, Any]) -> list[str]:
    lines = []
    if s.get("predictions_path"):
        version = s.get("predictions_model_version")
        lines.append(
            f"  predictions       {s['predictions_path']} ({s.get('output_rows')} rows for {s.get('input_rows')} "
            f"inputs" + (f", model version {version})" if version else ")")
        )
    if s.get("drift") and s["drift"].get("columns"):
        d = s["drift"]
        lines.append(
            f"  drift             {', '.join(d['drifted_columns']) or 'none'} drifted of {len(d['columns'])} "
            f"feature(s) over {d['rows']} scoring rows"
            + (" (too few rows to judge)" if d["rows"] < d["min_rows"] else "")
        )
    if s.get("estimated_metrics"):
        lines.append(
            "  estimated         "
            + ", ".join(f"{k.removeprefix('val_')} {v:.4f}" for k, v in s["estimated_metrics"].items())
            + " (CBPE: from the calibrated probabilities, no labels; trainflow monitor --labels measures)"
        )
    if s.get("unseen_categories"):
        lines.append(
            "  unseen values     "
            + ", ".join(f"{c}: {n} row(s)" for c, n in s["unseen_categories"].items())
            + " (predicted with the unknown code)"
        )
    return lines


def format_gc_summary(s: dict[str, Any]) -> str:
    """`trainflow gc`'s answer (and the retrain summary's retention lines): what went, what stayed, why."""
    if "error" in s:
        return f"  retention         not applied: {s['error']}"
    verb = "would remove" if s["dry_run"] else "removed"
    lines = [
        f"  retention         {verb} {len(s['removed'])} run(s), {s['bytes_freed'] / 2**20:.1f} MiB of "
        f"{s['storage_path']}; kept {len(s['kept'])}"
    ]
    for r in s["removed"]:
        versions = f"; versions {', '.join(r['versions'])}" if r.get("versions") else ""
        deleted = f" (deleted: {', '.join(r['versions_deleted'])})" if r.get("versions_deleted") else ""
        lines.append(f"    - {r['run']}: {r['why']}{versions}{deleted}")
    lines += [f"    = {k['run']}: {k['why']}" for k in s["kept"]]
    if not s["removed"] and not s["kept"]:
        lines.append("    (no retrain of this model is recorded there: runs from before retention are never removed)")
    return "\n".join(lines)
