"""The `trainflow` command: each work command is a Prefect flow run (on a configured Prefect server, or Prefect's
temporary one); with no Prefect API configured, a small predict, a skipped retrain and validate run in this process."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import signal
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from trainflow.errors import TrainflowError
from trainflow.runtime import stop_ray, stop_requested
from trainflow.storage import replace_bytes


def write_text_atomic(path: str, text: str, replace: bool = True) -> None:
    """Write to a temp file beside path, then rename: readers never see half a file. replace=False: a hard link
    instead of the rename, which fails when path exists, so a file written meanwhile by someone else is kept."""
    target = Path(path).resolve()
    if replace:
        replace_bytes(str(target), text.encode())
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        try:
            os.link(tmp, target)
        except FileExistsError:
            raise TrainflowError(f"{path} exists; choose another file or add --force to replace it") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    Path(tmp).unlink(missing_ok=True)


def write_json_atomic(path: str, data: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, default=str))


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
    from trainflow.trainer.backtest import backtest_line

    if s.get("skipped"):
        lines = [
            "",
            "trainflow summary",
            f"  skipped           {s['skipped']['reason']}",
            f"  data              {s.get('data_path')} (fingerprint {s.get('data_fingerprint')})",
        ]
        return "\n".join(lines + _scoring_lines(s))
    best = s.get("best_checkpoint") or {}
    metrics = best.get("metrics") or {}
    shown = {k: v for k, v in metrics.items() if k.startswith("val_") or k == "train_loss"}
    lines = [
        "",
        "trainflow summary",
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
                f"{best.get('epoch')}: {best.get('path')}",
            ]
        ),
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
                + f" ({s.get('test_rows')} rows no choice touched)"
            ]
            if s.get("test_metrics")
            else []
        ),
        *([f"  roles             {s['split']}"] if s.get("split") and s.get("split").startswith("by time") else []),
        *([f"  note              {s['split_note']}"] if s.get("split_note") else []),
        *([f"  backtest          {backtest_line(s['backtest'])}"] if s.get("backtest") else []),
        f"  mlflow            run {s.get('mlflow_run_id')}, model {s.get('model_uri')}",
    ]
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
    budget = s.get("time_budget") or {}
    if budget.get("rule") or budget.get("cut_short"):
        cut = ", ".join(f"{run} after step {step}" for run, step in (budget.get("cut_short") or {}).items())
        lines.append(
            f"  time budget       training took {budget.get('training_s')} s; {budget.get('rule') or 'no limit'}"
            + (f"; stopped by it: {cut}" if cut else "")
        )
    for family, why in (s.get("families_failed") or {}).items():
        lines.append(f"    {family:<10} failed, left out (the other families went on): {why}")
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
        if p.get("judged_rows_note"):
            lines.append(f"  judged rows       {p['judged_rows_note']}")
    return "\n".join(lines + _scoring_lines(s))


def format_predict_summary(s: dict[str, Any]) -> str:
    """`trainflow predict`'s summary: the model that scored, where the predictions went, drift (the JSON behind it:
    --summary-json)."""
    lines = [
        "",
        "trainflow summary",
        f"  model             {s.get('model')}"
        + (f" ({s['model_version_uri']})" if s.get("model_version_uri") not in (None, s.get("model")) else ""),
    ]
    return "\n".join(lines + _scoring_lines({**s, "predictions_model_version": None}))


def format_monitor_summary(s: dict[str, Any]) -> str:
    """`trainflow monitor`'s summary: the verdict and the figures behind it (the JSON: --summary-json)."""
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


def format_validate_summary(s: dict[str, Any]) -> str:
    """`trainflow validate`'s summary: what a retrain would train on (the JSON: --summary-json)."""
    feats = s.get("features") or {}
    lines = [
        "",
        "trainflow summary",
        "  valid             yes: every check a retrain makes before training passed",
        f"  data              {s.get('data_path')} ({s.get('rows')} rows, task {s.get('task')})",
        f"  split             {s.get('train_rows')} training, {s.get('validation_rows')} validation, "
        f"{s.get('test_rows')} test rows" + (f", {s['folds']} folds" if (s.get("folds") or 1) > 1 else ""),
        *([f"  roles             {s['split']}"] if s.get("split") else []),
        *([f"  note              {s['split_note']}"] if s.get("split_note") else []),
        f"  features          {len(feats.get('numeric') or [])} numeric, {len(feats.get('text') or [])} text, "
        f"{len(feats.get('dates') or [])} date -> {s.get('packed_features')} packed",
        f"  families          {', '.join(s.get('families') or {}) or '-'}",
    ]
    for family, why in (s.get("families_left_out") or {}).items():
        lines.append(f"    {family:<10} left out: {why}")
    if s.get("inference_input"):
        lines.append(f"  scoring           {s['inference_input']} -> {s.get('inference_output')}")
    return "\n".join(lines)


def _scoring_lines(s: dict[str, Any]) -> list[str]:
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


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trainflow")
    except PackageNotFoundError:  # a checkout run without installing it
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainflow", description=__doc__)
    p.add_argument("--debug", action="store_true", help="show full tracebacks")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}", help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("retrain", help="train, select, register and predict from a config")
    r.add_argument("--config", required=True, help="the YAML config file (trainflow init writes one)")
    r.add_argument("--run-name", help="Ray Train run name; an existing name resumes that run")
    r.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (YAML value), e.g. train.epochs=5; repeatable",
    )
    r.add_argument("--summary-json", help="also write the summary as JSON to this file")
    r.add_argument(
        "--force",
        action="store_true",
        help="retrain even when the data and training config are those of the current champion",
    )
    r.add_argument(
        "--no-wait",
        dest="wait",
        action="store_false",
        help="fail at once, naming the holder, when another start of this --run-name is running (default: wait for it)",
    )

    t = sub.add_parser("tune", help="Ray Tune sweep over the config's tune.search_space, then register the best")
    t.add_argument("--config", required=True, help="the YAML config file (trainflow init writes one)")
    t.add_argument("--run-name", help="sweep name")
    t.add_argument(
        "--resume",
        action="store_true",
        help="restore the sweep --run-name names from its folder (unpickles Ray Tune's state: only your own)",
    )
    t.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (YAML value), e.g. train.epochs=5; repeatable",
    )
    t.add_argument("--summary-json", help="also write the summary as JSON to this file")
    t.add_argument(
        "--no-wait",
        dest="wait",
        action="store_false",
        help="fail at once, naming the holder, when another start of this --run-name is running",
    )

    pr = sub.add_parser("predict", help="batch inference with a registered model or a checkpoint")
    pr.add_argument("--config", required=True, help="the YAML config file (trainflow init writes one)")
    pr.add_argument("--model", help="models:/name@alias, models:/name/version, runs:/... or a checkpoint folder")
    pr.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (YAML value), e.g. train.epochs=5; repeatable",
    )
    pr.add_argument("--summary-json", help="also write the summary as JSON to this file")

    mo = sub.add_parser(
        "monitor",
        help="live performance: join later-arriving labels with the written predictions "
        "(without labels: a classifier's estimated from its probabilities)",
    )
    mo.add_argument("--config", required=True, help="the YAML config file (trainflow init writes one)")
    mo.add_argument(
        "--labels",
        help="a table (file, folder or URI) of id column + label; without it a classifier's "
        "performance is estimated from its probabilities (CBPE)",
    )
    mo.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (YAML value), e.g. train.epochs=5; repeatable",
    )
    mo.add_argument("--summary-json", help="also write the summary as JSON to this file")

    sv = sub.add_parser("serve", help="serve deployments/prefect.yaml's deployments in this process (flow.serve)")
    sv.add_argument("--config", help="config_path for every served deployment (default: each one's own)")
    sv.add_argument("--prefect-file", help="deployment file (default: the checkout's deployments/prefect.yaml)")
    sv.add_argument("--limit", type=int, help="at most this many flow runs at once")

    v = sub.add_parser(
        "validate",
        help="every check a retrain makes before training (table, scoring table, output, "
        "memory, champion baseline); exit 0 or 2",
    )
    v.add_argument("--config", required=True, help="the YAML config file (trainflow init writes one)")
    v.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (YAML value), e.g. train.epochs=5; repeatable",
    )
    v.add_argument("--summary-json", help="also write the summary as JSON to this file")

    i = sub.add_parser("init", help="write a commented config for a table and its label")
    i.add_argument("--data", required=True, help="the table: file, folder, glob or URI")
    i.add_argument("--label", required=True, help="the column to predict")
    i.add_argument("--out", default="trainflow.yaml", help="the config file to write (default: trainflow.yaml)")
    i.add_argument("--force", action="store_true", help="replace an existing --out")

    c = sub.add_parser("config", help="the config's JSON schema, or a config file resolved")
    csub = c.add_subparsers(dest="config_command", required=True)
    csub.add_parser("schema", help="print the JSON schema of the config, with a description for every key")
    cs = csub.add_parser("show", help="print the config as trainflow resolves it (defaults, paths, inferred task)")
    cs.add_argument("--config", required=True, help="the YAML config file (trainflow init writes one)")
    cs.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (YAML value), e.g. train.epochs=5; repeatable",
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
    ch.add_argument("--summary-json", help="also write the answer as JSON to this file")
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
        cp.add_argument("--summary-json", help="also write the answer as JSON to this file")

    s = sub.add_parser("sample", help="write the bundled synthetic sample tables")
    s.add_argument("--out", default="data/sample", help="the folder to write train.parquet and score.parquet to")
    s.add_argument("--rows", type=int, default=100_000, help="training table rows")
    s.add_argument("--score-rows", type=int, default=20_000, help="scoring table rows")
    s.add_argument("--seed", type=int, default=7, help="the generator's seed")
    s.add_argument("--force", action="store_true", help="rewrite even if the files exist")
    return p


def _overrides(items: list[str]) -> dict[str, Any]:
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


def _run(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.command == "sample":
        from trainflow.sample import write_sample

        paths = write_sample(args.out, rows=args.rows, score_rows=args.score_rows, seed=args.seed, force=args.force)
        for p in paths:
            print(p)
        return None
    if args.command == "init":
        return _init(args)
    if args.command == "config":
        return _config_command(args)
    if args.command == "champion":
        return _champion_command(args)
    from trainflow.config import load_config

    if args.command == "serve":
        from trainflow.flows.serve import PREFECT_FILE, serve_all

        if args.config:
            load_config(args.config)
        serve_all(args.prefect_file or PREFECT_FILE, args.config, args.limit)
        return None
    overrides = _overrides(args.set)
    config = load_config(args.config, overrides)  # fail fast on a bad config, before Prefect and Ray start
    if config.task_inferred:
        print(f"trainflow: {config.task_inferred}", file=sys.stderr)
    if args.command == "tune":
        config.require_tune()
        if args.resume and not args.run_name:
            raise TrainflowError("tune --resume needs the --run-name of the sweep to restore")
    if args.command in ("retrain", "tune", "validate"):
        from trainflow.flows.local import preflight

        preflight(config)  # the columns the config names, from the files' metadata: seconds, before anything starts
    from trainflow.flows.local import run_here
    from trainflow.runtime import local_flow_settings
    from trainflow.services import prefect_client_retries, wait_for_prefect

    wait_for_prefect()  # a configured Prefect API that does not answer yet is waited for (services.prefect_wait_s)
    summary = run_here(args.command, config, args)  # small work with no Prefect API: answered here, in seconds
    if summary is not None:
        return summary
    from trainflow.flows.local import scored_in_process
    from trainflow.runtime import start_prefect_server_in_background, start_ray_in_background

    # Ray and Prefect's temporary server come up while this process imports the flow (Ray not for a predict that
    # scores its table in this process: no step of it needs Ray)
    if not (args.command == "predict" and scored_in_process(config)):
        start_ray_in_background(**config.ray_start)
    server = start_prefect_server_in_background()
    flow = _flow(args.command)
    if server is not None:
        server.join()
    if stop_requested():  # a SIGTERM during start-up: no flow run starts (main() reports the stop)
        raise InterruptedError("stopped by SIGTERM before the flow started")
    params = {"config_path": str(Path(args.config).resolve()), "overrides": overrides or None}
    named = {
        "retrain": ("run_name", "force", "wait"),
        "tune": ("run_name", "resume", "wait"),
        "monitor": ("labels",),
        "validate": (),
        "predict": ("model",),
    }[args.command]
    extra = {name: getattr(args, name) for name in named}
    # the API gone mid-run is waited out as long (services.prefect_wait_s)
    with prefect_client_retries(), local_flow_settings():
        return flow(**params, **extra)


def _init(args: argparse.Namespace) -> None:
    from trainflow.scaffold import scaffold

    if Path(args.out).exists() and not args.force:
        raise TrainflowError(f"--out {args.out} exists; choose another file or add --force to replace it")
    text = scaffold(args.data, args.label, args.out)
    write_text_atomic(args.out, text, replace=args.force)  # a file that appeared meanwhile is not replaced
    print(f"wrote {args.out}; next: trainflow validate --config {args.out}, then trainflow retrain --config {args.out}")


def _config_command(args: argparse.Namespace) -> None:
    if args.config_command == "schema":
        from trainflow.config.schema import config_schema

        print(json.dumps(config_schema(), indent=2))
        return
    import yaml

    from trainflow.config import load_config
    from trainflow.redact import redact_config

    config = load_config(args.config, _overrides(args.set))
    if config.task_inferred:
        print(f"# {config.task_inferred}")
    print(yaml.safe_dump(redact_config(config.to_dict()), sort_keys=False, allow_unicode=True), end="")


def _champion_command(args: argparse.Namespace) -> dict[str, Any]:
    import datetime as dt

    import mlflow

    from trainflow.champion import history, rollback, serving_at
    from trainflow.config import load_config

    config = load_config(args.config)
    uri, name = config.mlflow.tracking_uri, config.mlflow.registered_model
    if args.champion_command == "rollback":
        from trainflow.champion import previous_champion
        from trainflow.services import wait_for_prefect

        wait_for_prefect()  # the champion lock is the Prefect server's when one is configured
        if args.to is None:
            args.to = previous_champion(mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri), name)
        return rollback(uri, name, args.to, args.reason, config.promotion.min_score, config.promotion.mode, args.force)
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    if args.at:
        try:
            when = dt.datetime.fromisoformat(args.at)
        except ValueError:
            raise TrainflowError(f"--at {args.at!r}: expected an ISO 8601 time, e.g. 2026-11-24T03:00") from None
        when = when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)
        return {"model": name, "at": when.isoformat(), "period": serving_at(client, name, when)}
    return {"model": name, "history": history(client, name)}


def format_champion_summary(s: dict[str, Any]) -> str:
    """`trainflow champion`'s answer for a person (the JSON: --summary-json)."""
    if "moved" in s:
        return (
            f"{s['model']}@champion -> version {s['champion']} ({s['why']}; was {s.get('previous')}, {s.get('by')})"
            if s["moved"]
            else f"{s['model']}: {s['why']}; nothing moved"
        )
    rows = s["history"] if "history" in s else [s["period"]] if s.get("period") else []
    if not rows:
        return f"{s['model']}: no recorded @champion period" + (f" covers {s['at']}" if "at" in s else "")
    lines = [f"{'version':>7}  {'since':25}  {'until':25}  why"]
    for r in rows:
        replaced = f"; replaced by v{r['replaced_by']}: {r.get('replaced_why')}" if r.get("replaced_by") else ""
        lines.append(
            f"{r['version']:>7}  {r.get('since') or '?':25}  {r.get('until') or 'serving':25}  "
            f"{r.get('why')} ({r.get('by')}){replaced}"
        )
    return "\n".join(lines)


def _flow(command: str):
    if command == "retrain":
        from trainflow.flows.retrain import retrain

        return retrain
    if command == "tune":
        from trainflow.flows.tune import tune

        return tune
    if command == "monitor":
        from trainflow.flows.monitor import monitor

        return monitor
    if command == "validate":
        from trainflow.flows.validate import validate

        return validate
    from trainflow.flows.predict import batch_inference

    return batch_inference


@contextlib.contextmanager
def _short_failure_logs(enabled: bool):
    """Prefect and Ray log each failure with its traceback; without --debug keep just the message."""
    if not enabled:
        yield
        return
    previous = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        if record.exc_info and record.levelno >= logging.WARNING:
            record.exc_info, record.exc_text = None, None
        return record

    logging.setLogRecordFactory(factory)
    try:
        yield
    finally:
        logging.setLogRecordFactory(previous)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command in ("history", "rollback"):  # `trainflow rollback` is `trainflow champion rollback`
        args.command, args.champion_command = "champion", args.command
    if args.command == "champion" and args.champion_command is None:  # `trainflow champion --at T --config F`
        if not args.config:
            parser.error(
                "trainflow champion: give --config (with --at TIME: the version that served then), or a "
                "command: history, rollback"
            )
        args.champion_command = "history"
    # Prefect's temporary server would try to send usage telemetry (an ERROR line offline); a user's setting wins
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # MLflow's transfer bars in a terminal only (trainflow.runtime.plain_progress, which imports Ray: not here)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "true" if sys.stderr.isatty() else "false")
    try:
        with _short_failure_logs(not args.debug):
            summary = _run(args)
    except KeyboardInterrupt:
        print("trainflow: interrupted", file=sys.stderr)
        return 130
    except BaseException as exc:  # noqa: BLE001 - the CLI's last line of defence
        if stop_requested(exc):
            # what the stop made fail (a Ray call interrupted by the signal) is no error of the run's to report
            print(
                "trainflow: stopped by SIGTERM; rerun with the same --run-name to resume from the latest checkpoint",
                file=sys.stderr,
            )
            stop_ray()
            return 128 + signal.SIGTERM
        from trainflow.errors import disk_full
        from trainflow.redact import redact_text

        if disk_full(exc):
            print(
                f"trainflow: error: no space left on device ({redact_text(str(exc).splitlines()[0])}); free space "
                "where the run writes (storage_path, inference.output, TMPDIR, Ray's spill folder) and rerun with "
                "the same --run-name to resume",
                file=sys.stderr,
            )
            return 2
        if isinstance(exc, TrainflowError):
            print(f"trainflow: error: {redact_text(str(exc))}", file=sys.stderr)
            return 2
        from trainflow.services import explain

        absent = explain(exc)  # a service that stayed away longer than the run waits for it: named, exit 1
        if absent is not None:
            print(f"trainflow: failed: {redact_text(str(absent))}", file=sys.stderr)
            return 1
        if args.debug:
            traceback.print_exc()
        print(
            f"trainflow: failed: {type(exc).__name__}: {redact_text(str(exc).splitlines()[0]) if str(exc) else ''}",
            file=sys.stderr,
        )
        print("trainflow: rerun with --debug for the traceback", file=sys.stderr)
        return 1
    if summary is not None:
        if args.command in ("retrain", "tune"):
            print(format_summary(summary))
        elif args.command == "predict":
            print(format_predict_summary(summary))
        elif args.command == "monitor":
            print(format_monitor_summary(summary))
        elif args.command == "validate":
            print(format_validate_summary(summary))
        elif args.command == "champion":
            print(format_champion_summary(summary))
        else:
            print(json.dumps(summary, indent=2, default=str))
        if args.summary_json:
            write_json_atomic(args.summary_json, summary)
    return 0


def entry() -> None:
    """The `trainflow` command: main(), then Ray stopped and an exit without the interpreter's final garbage
    collection over every object torch, Ray, Prefect and MLflow created (the objects are frozen with gc.freeze; the
    process's memory goes back to the system as a whole). Tests call main()."""
    code = main()
    stop_ray()  # now rather than at exit, where Ray first sleeps 0.5 s for late log lines
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
