"""trainflow replay: the retraining policy judged on the table's own history.

At each cutoff (one per period, from --from to the last full period) every policy acts on the rows older than the
cutoff alone: it retrains (a real retrain flow run, as a subflow, with the config's own fold plan, families, budget
and gate), gates the challenger against its own serving model with the real gate (tasks/promote.py, its bootstrap,
floors and row checks, on the newest rows older than the cutoff: the retrain's test role, by time), and whichever
model it then serves predicts the period's rows, scored on their labels with promotion.metric.

Policies: `gate` (retrain every period, promote through the gate: the config's own policy), `always` (retrain every
period, always promote), `every-N` (retrain every N periods, through the gate), `never` (the first model serves
throughout), `warm` (retrain every period, the challenger warm-started from the model the policy serves:
train.warm_start, tasks/warm.py; through the gate). A fit shared by policies (same cutoff, same rows, same start) is
trained once: one fresh retrain per cutoff, and one warm one for `warm`.

Isolation: everything a replay writes is under `<storage_path>/replay/<name>/`, its MLflow experiment
`<experiment>-replay`, and versions of `<registered_model>-replay`, each policy serving through an alias of its own
(`<name>-<policy>`); the user's registered model, its @champion and inference.output are never touched. A replay
rerun under its name resumes after its last finished period (each cutoff's retrain resumes by its own run name).
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from trainflow.config import Config, config_from_dict, infer_format
from trainflow.data import has_label
from trainflow.errors import ConfigError, DataError
from trainflow.flows.handover import flow_config, forget, hand_over
from trainflow.tasks.common import retry_unless_user_error, task_logger

PERIODS = {"day": "D", "week": "W-MON", "month": "MS", "quarter": "QS"}  # pandas offsets: each period's first instant
POLICIES = ("gate", "always", "every-2", "every-4", "never", "warm")
SUFFIX = "-replay"
STATE = "replay.json"  # under the replay's folder: every finished period, written after each one
BOOTSTRAP = 100  # resamples of each period's rows for the recommendation's noise
# the data keys a cutoff's table keeps: it is a Parquet file of the source's rows, so no source key applies to it
DATA_KEYS = ("label", "features", "id_column", "materialize")


def parse_policies(text: str | list[str] | None) -> list[str]:
    """The policies asked for (comma-separated or a list; default all), each one known; ConfigError naming one that is
    not."""
    if text is None:
        return list(POLICIES)
    asked = [p.strip() for p in (text.split(",") if isinstance(text, str) else text) if p.strip()]
    for p in asked:
        if p not in ("gate", "always", "never", "warm") and not re.fullmatch(r"every-[1-9][0-9]*", p):
            raise ConfigError(f"--policies {p!r}: not a policy; policies: {', '.join(POLICIES)} (every-N for any N)")
    if not asked:
        raise ConfigError(f"--policies is empty; policies: {', '.join(POLICIES)}")
    return list(dict.fromkeys(asked))


def check_request(
    config: Config, every: str, policies: str | list[str] | None, start: str | None = None, end: str | None = None
) -> list[str]:
    """What a replay can refuse before anything starts: no split.time_column, a PERIOD or a policy it does not know,
    --from or --to outside the table's times (read from the time column alone); the policies."""
    if config.split.time_column is None:
        raise ConfigError("replay needs split.time_column: the table's time, which the periods and cutoffs follow")
    asked = parse_policies(policies)
    column = config.split.time_column
    cutoffs(timeline(read_history(config, [column]), column, config.data.where), every, start, end)
    return asked


def retrains(policy: str, k: int) -> bool:
    """Whether policy retrains at cutoff k (every policy trains the first model)."""
    if k == 0 or policy in ("gate", "always", "warm"):
        return True
    if policy.startswith("every-"):
        return k % int(policy.removeprefix("every-")) == 0
    return False  # never


def alias_for(name: str, policy: str) -> str:
    """The registry alias through which policy serves in the replay name (MLflow aliases: letters, digits, _ and -)."""
    return re.sub(r"[^\w-]", "_", f"{name}-{policy}")


@dataclass
class Timeline:
    """The table's times as numbers (nanoseconds since the epoch for dates and datetimes) and how to show them."""

    values: np.ndarray  # float64, one per row (NaN: a missing time)
    dated: bool

    def show(self, v: float) -> str:
        if not self.dated:
            return f"{v:g}"
        import pandas as pd

        stamp = pd.Timestamp(int(v))
        return stamp.date().isoformat() if stamp == stamp.normalize() else stamp.isoformat()

    def parse(self, text: str, what: str) -> float:
        if not self.dated:
            try:
                return float(text)
            except ValueError:
                raise ConfigError(f"{what} {text!r}: the time column is numeric; give a number") from None
        import pandas as pd

        try:
            stamp = pd.Timestamp(text)
        except ValueError:
            raise ConfigError(f"{what} {text!r}: expected a date or time, e.g. 2026-01-01") from None
        if stamp.tzinfo is not None:
            stamp = stamp.tz_convert("UTC").tz_localize(None)
        return float(stamp.value)


def timeline(table: pa.Table, column: str, where: str) -> Timeline:
    """The time column's values as a Timeline; DataError naming the column when it is neither dates nor numbers."""
    import pandas as pd
    import pyarrow.types as pat

    col = table[column]
    if pat.is_integer(col.type) or pat.is_floating(col.type):
        return Timeline(col.to_numpy(zero_copy_only=False).astype(np.float64), dated=False)
    series = col.to_pandas()
    if not (pat.is_date(col.type) or pat.is_timestamp(col.type)):
        try:
            series = pd.to_datetime(series, utc=True)
        except (ValueError, TypeError):
            raise DataError(f"{where}: split.time_column {column!r} holds neither dates nor numbers") from None
    stamps = pd.to_datetime(series, utc=True).dt.tz_localize(None)
    values = stamps.to_numpy("datetime64[ns]").astype(np.int64).astype(np.float64)
    values[stamps.isna().to_numpy()] = np.nan
    return Timeline(values, dated=True)


def cutoffs(line: Timeline, every: str, start: str | None, end: str | None) -> list[float]:
    """The period boundaries: cutoff k starts period k, which ends at boundary k + 1. From start (default: the first
    boundary with at least a third of the rows before it) to the last full period (one the table holds a row at or
    after the end of), or the last one ending by end. ConfigError for a bad PERIOD, DataError naming the table's time
    range for a start outside it."""
    import pandas as pd

    times = np.sort(line.values[~np.isnan(line.values)])
    if len(times) == 0:
        raise DataError("the time column holds no times")
    first, last = times[0], times[-1]
    span = f"the table's times run from {line.show(first)} to {line.show(last)}"
    days = None
    if every not in PERIODS:
        try:
            days = float(every)
        except ValueError:
            raise ConfigError(
                f"--every {every!r}: expected day, week, month, quarter or a number of days"
                + ("" if line.dated else " (the time column is numeric: a number in its units)")
            ) from None
        if not days > 0 or not math.isfinite(days):
            raise ConfigError(f"--every {every!r}: a number of days must be positive")
    elif not line.dated:
        raise ConfigError(f"--every {every}: the time column is numeric; give the period as a number in its units")
    if start is not None:
        begin = line.parse(start, "--from")
        if not first < begin <= last:
            raise DataError(f"--from {start}: outside the table's history; {span} (--from must leave rows before it)")
    else:
        begin = times[min(len(times) - 1, math.ceil(len(times) / 3))]  # at least a third of the rows lie before it
    stop = last if end is None else min(last, line.parse(end, "--to"))
    if days is not None:
        step = days * (86_400e9 if line.dated else 1.0)
        bounds = list(np.arange(begin, stop + step / 2, step))
    else:  # each period's first instant at or after begin (date_range's anchored offsets)
        stamps = pd.date_range(pd.Timestamp(int(begin)), pd.Timestamp(int(last)), freq=PERIODS[every])
        bounds = [float(b.value) for b in stamps]
    bounds = [b for b in bounds if b <= stop]  # a boundary is the end of the period before it: full when reached
    if len(bounds) < 2:
        raise DataError(f"--every {every} from {line.show(begin)}: no full period before the table's last time; {span}")
    return [float(b) for b in bounds]


@dataclass
class Fit:
    """One cutoff's retrain: the version it registered in the replay's model (None: no model), its checkpoint."""

    cutoff: int
    version: str | None
    path: str | None
    training_s: float
    rows: int
    note: str | None = None
    table: str | None = None  # the cutoff's rows, as a Parquet snapshot under the replay's folder


@dataclass
class Replay:
    """A replay's state: its policies' serving versions and every finished period (what replay.json holds)."""

    name: str
    policies: list[str]
    bounds: list[float]
    periods: list[dict[str, Any]] = field(default_factory=list)
    fits: dict[str, dict[str, Any]] = field(default_factory=dict)  # fit_key(cutoff, warm): its Fit

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "policies": self.policies,
            "bounds": self.bounds,
            "periods": self.periods,
            "fits": self.fits,
        }


def _replay_config(config: Config, table_path: str, folder: str) -> Config:
    """The config of a cutoff's retrain: the user's, reading the cutoff's Parquet file, writing only under the replay's
    folder, its MLflow experiment and registered model, and predicting nothing."""
    from trainflow.run.storage import join

    raw = config.as_given()
    raw["data"] = {k: v for k, v in raw["data"].items() if k in DATA_KEYS} | {
        "path": table_path,
        "format": infer_format(table_path),
    }
    raw["storage_path"] = join(folder, "runs")
    raw["mlflow"] = {
        **raw.get("mlflow", {}),
        "experiment": config.mlflow.experiment + SUFFIX,
        "registered_model": config.mlflow.registered_model + SUFFIX,
    }
    raw["inference"] = {k: v for k, v in raw.get("inference", {}).items() if k not in ("input", "output")}
    raw["split"] = {**raw.get("split", {}), "backtest_fit": False}  # the backtest's extra fit judges no policy
    raw.pop("retention", None)  # the replay's cutoffs keep every fit it judges
    # a cutoff's gate moves only the replay's own model, whose policies replay judges: nobody is asked to approve it
    raw["promotion"] = {**raw.get("promotion", {}), "approval": "none"}
    return config_from_dict(raw, source="<replay>")


def read_history(config: Config, columns: list[str] | None = None) -> pa.Table:
    """The whole training table (or those columns of it) in this process (replay judges a table of the size one
    process holds: a sample of a larger one); DataError naming a column the table lacks."""
    from trainflow.tables.files import table_dataset

    data = config.data
    ds = table_dataset(data)
    missing = [c for c in columns or [] if c not in ds.schema.names]
    if missing:
        raise DataError(
            f"{data.where}: split.time_column {missing[0]!r} is not a column; columns are {ds.schema.names}"
        )
    return ds.to_table(columns=columns) if columns else ds.to_table()


@flow(name="replay", log_prints=True)
def replay(
    config_path: str,
    overrides: dict[str, Any] | None = None,
    every: str = "month",
    start: str | None = None,
    end: str | None = None,
    policies: str | list[str] | None = None,
    run_name: str | None = None,
) -> dict[str, Any]:
    """Replay the retraining policies over the table's history (module docstring); the summary's `replay` section holds
    every period's figures per policy, each policy's totals and a recommendation."""
    from trainflow.run.locks import run_lock
    from trainflow.run.storage import join
    from trainflow.tasks.run_name import resolve_run_name

    config = flow_config(config_path, overrides)
    asked = parse_policies(policies)
    column = config.split.time_column
    if column is None:
        raise ConfigError("replay needs split.time_column: the table's time, which the periods and cutoffs follow")
    name = resolve_run_name(run_name, prefix="replay")
    table = read_history(config)
    if column not in table.column_names:
        raise DataError(f"{config.data.where}: split.time_column {column!r} is not a column")
    line = timeline(table, column, config.data.where)
    bounds = cutoffs(line, every, start, end)
    folder = join(config.storage_path, "replay", name)
    with run_lock(
        config.storage_path, f"{name}{SUFFIX}"
    ):  # one start of a replay name at a time: its folder is its own
        return _replay(config, name, asked, table, line, bounds, folder, every)


def _replay(
    config: Config,
    name: str,
    asked: list[str],
    table: pa.Table,
    line: Timeline,
    bounds: list[float],
    folder: str,
    every: str,
) -> dict[str, Any]:
    """The replay's periods after the last one its folder's replay.json records, then its summary and records."""
    from trainflow.run.storage import join, read_text, replace_bytes

    log = task_logger("replay")
    state = Replay(name, asked, bounds)
    try:
        before = json.loads(read_text(join(folder, STATE)))
    except (OSError, ValueError):
        before = None
    if before is not None:
        if before.get("bounds") != bounds or before.get("policies") != asked:
            raise ConfigError(
                f"replay {name}: its folder {folder} holds a replay of other periods or policies; give another "
                "--run-name (or the same --every, --from, --to and --policies to resume it)"
            )
        state.periods = before["periods"]
        state.fits = _trusted_fits(config, folder, before["fits"])
        log.info("replay %s: resuming after period %d of %d", name, len(state.periods), len(bounds) - 1)
    log.info(
        "replay %s: %d periods of %s from %s to %s, policies %s",
        name,
        len(bounds) - 1,
        every,
        line.show(bounds[0]),
        line.show(bounds[-1]),
        ", ".join(asked),
    )
    resumed = len(state.periods)  # the periods a killed start of this name had finished
    label = config.data.label
    labelled = has_label(table, label)  # a row whose label never arrived trains no cutoff's model (and is counted)
    scored_cache: dict[tuple[int, str], Any] = {}
    for k in range(len(state.periods), len(bounds) - 1):
        older = (line.values < bounds[k]) & labelled
        inside = (line.values >= bounds[k]) & (line.values < bounds[k + 1])
        if any(retrains(p, k) for p in asked if p != "warm" or k == 0) and fit_key(k) not in state.fits:
            state.fits[fit_key(k)] = _fit(config, table.filter(pa.array(older)), folder, name, k, state).__dict__
        if "warm" in asked and k > 0 and fit_key(k, warm=True) not in state.fits:
            refused = warm_refused(state)
            if refused is None:
                warm = _fit(config, table.filter(pa.array(older)), folder, name, k, state, warm=True)
                state.fits[fit_key(k, warm=True)] = warm.__dict__
            else:  # the reason holds at every cutoff (folds, family, schema): the warm policy takes the fresh fit
                if fit_key(k) not in state.fits:
                    state.fits[fit_key(k)] = _fit(
                        config, table.filter(pa.array(older)), folder, name, k, state
                    ).__dict__
                state.fits[fit_key(k, warm=True)] = {**state.fits[fit_key(k)], "note": refused}
        rows = table.filter(pa.array(inside))
        state.periods.append(
            judge_period.with_options(task_run_name=f"period-{k}")(
                config, state, k, rows, label, line.show(bounds[k]), line.show(bounds[k + 1]), scored_cache
            )
        )
        replace_bytes(join(folder, STATE), json.dumps(state.record(), indent=1, default=str).encode())
    summary = summarize_replay(config, state, table, line, scored_cache)
    summary["replay"]["folder"] = folder
    summary["replay"]["every"] = every
    summary["replay"]["resumed_periods"] = resumed
    summary["replay"]["artifacts"] = report_replay(config, summary)
    return summary


def _trusted_fits(config: Config, folder: str, recorded: dict[str, dict]) -> dict[str, dict]:
    """replay.json's fits with nothing taken from the file that the registry can say: each version's checkpoint is
    resolved again from <registered_model>-replay (with the allow-list of user classes), and each cutoff's rows are its
    own snapshot under the replay's folder; a path the file names elsewhere is refused."""
    from trainflow.trainer.resolve import allowed_class_paths, resolve_checkpoint

    cfg = _replay_config(config, "unused.parquet", folder)
    model, uri = cfg.mlflow.registered_model, cfg.mlflow.tracking_uri
    resolved: dict[str, str] = {}
    fits = {}
    for key, fit in recorded.items():
        table = str(fit.get("table") or "")
        if not table.startswith(folder.rstrip("/") + "/"):
            raise DataError(f"{folder}/{STATE}: fit {key} names rows outside the replay's folder ({table!r}); refused")
        version = fit.get("version")
        if version is not None and str(version) not in resolved:
            resolved[str(version)] = resolve_checkpoint(f"models:/{model}/{version}", allowed_class_paths(cfg), uri)
        fits[key] = {**fit, "path": resolved.get(str(version)) if version is not None else None}
    return fits


def fit_key(k: int, warm: bool = False) -> str:
    """A fit's key in the replay's state: cutoff k's fresh fit, or its warm-started one."""
    return f"{k}-warm" if warm else str(k)


def _fit(config: Config, older: pa.Table, folder: str, name: str, k: int, state: Replay, warm: bool = False) -> Fit:
    """Cutoff k's retrain on the rows older than it (a retrain flow run named <name>-cutoff<k>, resumed by that name;
    warm: <name>-cutoff<k>-warm, train.warm_start from the model the warm policy serves): its registered version and
    checkpoint. The same rows as a fresh fit before it: that fit again, not retrained."""
    from trainflow.tables.snapshots import snapshot
    from trainflow.flows.retrain import retrain
    from trainflow.trainer.resolve import allowed_class_paths, resolve_checkpoint

    log = task_logger("replay")
    path = snapshot(older, folder)
    earlier = [f for key, f in state.fits.items() if f.get("table") == path and not key.endswith("-warm")]
    if earlier and not warm:
        log.info(
            "cutoff %d: the same rows as cutoff %d's (its period had none): its model again", k, earlier[0]["cutoff"]
        )
        return Fit(k, earlier[0]["version"], earlier[0]["path"], 0.0, older.num_rows, "no new rows", path)
    cfg = _replay_config(config, path, folder)
    if warm:
        raw = cfg.as_given()
        raw.setdefault("train", {})["warm_start"] = f"models:/{cfg.mlflow.registered_model}@{alias_for(name, 'warm')}"
        cfg = config_from_dict(raw, source="<replay>")
    key = hand_over(cfg)
    started = time.perf_counter()
    try:
        # no feature importance or report artifacts: only the replay judges these models
        summary = retrain(config_path=key, run_name=f"{name}-cutoff{k}" + ("-warm" if warm else ""), explained=False)
    finally:
        forget(key)
    seconds = time.perf_counter() - started
    version = summary.get("model_version")
    checkpoint = None
    if version is not None:
        uri = cfg.mlflow.tracking_uri
        checkpoint = resolve_checkpoint(
            f"models:/{cfg.mlflow.registered_model}/{version}", allowed_class_paths(cfg), uri
        )
    fit = Fit(k, version, checkpoint, round(seconds, 1), older.num_rows, table=path)
    if warm:
        fit.note = _warm_note(summary.get("warm_start"))
    log.info(
        "cutoff %d: trained on %d rows in %.1f s: %s v%s",
        k,
        older.num_rows,
        seconds,
        cfg.mlflow.registered_model,
        version,
    )
    return fit


def warm_refused(state: Replay) -> str | None:
    """Why an earlier warm retrain of this replay fit fresh (a warm start its config cannot make), or None."""
    for key in sorted(state.fits, key=lambda x: state.fits[x]["cutoff"]):
        note = state.fits[key].get("note") or ""
        # (no model to start from, as when the first model missed promotion.min_score, may pass: tried again)
        if (
            key.endswith("-warm")
            and note.startswith("warm start: a fresh fit")
            and "no model to start from" not in note
        ):
            return f"{note} at cutoff {state.fits[key]['cutoff']}: the warm policy takes each cutoff's fresh fit"
    return None


def _warm_note(record: dict | None) -> str:
    """What a warm fit started from, or why it started fresh (tasks/warm.py's record)."""
    if not record:
        return "warm start: no record"
    if record.get("fresh"):
        return f"warm start: a fresh fit ({record['fresh']})"
    what = f"{record['offset']} rounds" if record.get("offset") else "its weights"
    return f"warm start: continued version {record['version']} ({what})"


@task(
    name="judge-period",
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=retry_unless_user_error,
    cache_policy=NO_CACHE,
)
def judge_period(
    config: Config,
    state: Replay,
    k: int,
    rows: pa.Table,
    label: str,
    start: str,
    end: str,
    scored_cache: dict,
) -> dict[str, Any]:
    """Period k: each policy's decision at its cutoff (retrain, gate, promote) and the score of the model it then
    serves on the period's labelled rows; the predictions written under the replay's folder."""
    import mlflow

    from trainflow.roles.folds import TEST
    from trainflow.tasks.promote import stored_plan
    from trainflow.run.tracking import current_champion

    folder = _folder(config, state.name)
    cfg = _replay_config(config, "unused.parquet", folder)
    model, uri = cfg.mlflow.registered_model, cfg.mlflow.tracking_uri
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    labelled = rows.filter(pa.array(has_label(rows, label))) if rows.num_rows else rows
    period: dict[str, Any] = {
        "period": k,
        "start": start,
        "end": end,
        "rows": labelled.num_rows,
        "unlabelled_rows": rows.num_rows - labelled.num_rows,
        "policies": {},
    }
    if rows.num_rows == 0:
        period["note"] = "no rows in this period: skipped"
    elif labelled.num_rows < config.monitor.min_rows:
        period["note"] = (
            f"{labelled.num_rows} labelled rows, fewer than monitor.min_rows {config.monitor.min_rows}: noise-bound"
        )
        period["noise_bound"] = True
    holdouts: dict[str, pa.Table] = {}
    for policy in state.policies:
        alias = alias_for(state.name, policy)
        mine: dict[str, Any] = {"trained": False, "promoted": False, "training_s": 0.0}
        fit = state.fits.get(fit_key(k, warm=policy == "warm" and k > 0))
        if retrains(policy, k) and fit and fit["version"] is not None and fit.get("note") != "no new rows":
            if fit["table"] not in holdouts:  # the newest rows older than the cutoff: the fit's test role
                cut = _table(fit["table"])
                plan = stored_plan(fit["path"])
                holdouts[fit["table"]] = cut.filter(pa.array(plan.roles(cut) == TEST)) if plan else cut.slice(0, 0)
            holdout = holdouts[fit["table"]]
            mine["trained"], mine["training_s"] = True, fit["training_s"]
            if fit.get("note"):
                mine["note"] = fit["note"]
            mine["promoted"], mine["reason"] = _promoted(cfg, client, policy, alias, fit, holdout)
        serving = current_champion(client, model, alias)
        mine["serving"] = _cutoff_of(state, serving)
        mine["serving_version"] = serving
        mine["score"] = None
        if serving is not None and labelled.num_rows:
            scored = _scored(cfg, state, k, serving, labelled, scored_cache)
            if scored is not None:
                mine["score"] = _metric(scored, config.promotion.metric)
                _write_predictions(cfg, folder, policy, k, labelled, scored)
        period["policies"][policy] = mine
    said = "; ".join(
        f"{p} {_fmt(v['score'])} (serving cutoff {v['serving']}{', retrained' if v['trained'] else ''}"
        f"{', promoted' if v['trained'] and v['promoted'] else ''})"
        for p, v in period["policies"].items()
    )
    task_logger("replay").info("period %d (%s to %s, %d rows): %s", k, start, end, labelled.num_rows, said)
    return period


def _promoted(cfg: Config, client, policy: str, alias: str, fit: dict[str, Any], holdout: pa.Table) -> tuple:
    """(promoted, why): `always` moves the policy's alias to its fit; the other policies ask the gate, on the fit's
    test rows, for that alias alone."""
    from trainflow.tasks.promote import gate
    from trainflow.tasks.values import Registered

    model = cfg.mlflow.registered_model
    if policy == "always":
        client.set_registered_model_alias(model, alias, fit["version"])
        return True, "always promotes"
    registered = Registered(
        run_id=client.get_model_version(model, fit["version"]).run_id,
        model_name=model,
        model_version=fit["version"],
        model_uri=f"models:/{model}/{fit['version']}",
    )
    result = gate(cfg, holdout, fit["path"], registered, judged_on="test", alias=alias)
    return result.decision == "promoted", result.reason


def _folder(config: Config, name: str) -> str:
    from trainflow.run.storage import join

    return join(config.storage_path, "replay", name)


def _table(path: str) -> pa.Table:
    import pyarrow.dataset as pads

    from trainflow.run.storage import filesystem_for

    fs, inner = filesystem_for(path)
    return pads.dataset(inner, filesystem=fs, format="parquet").to_table()


def _cutoff_of(state: Replay, version: str | None) -> int | None:
    """The first cutoff whose fit registered version (the model's age in periods)."""
    for fit in sorted(state.fits.values(), key=lambda f: f["cutoff"]):
        if version is not None and fit.get("version") == version:
            return fit["cutoff"]
    return None


def _scored(cfg: Config, state: Replay, k: int, version: str, rows: pa.Table, cache: dict):
    """Version's outputs on period k's labelled rows (once per version and period); None when it cannot read them."""
    from trainflow.preprocessors.tabular import SchemaDriftError
    from trainflow.trainer.evaluate import score_checkpoint

    if (k, version) not in cache:
        path = next(f["path"] for f in state.fits.values() if f.get("version") == version)
        try:
            cache[(k, version)] = score_checkpoint(path, rows)
        except SchemaDriftError as exc:
            task_logger("replay").warning("period %d: v%s cannot score its rows: %s", k, version, exc)
            cache[(k, version)] = None
    return cache[(k, version)]


def _metric(scored, metric: str) -> float | None:
    value = scored.metrics().get(metric)
    return float(value) if value is not None and math.isfinite(value) else None


def _write_predictions(cfg: Config, folder: str, policy: str, k: int, rows: pa.Table, scored) -> None:
    """policy's predictions for period k's rows: the id (or the row's place in the period), the prediction (and each
    class's probability) and the label, as Parquet under the replay's folder."""
    import io

    import pyarrow.parquet as pq

    from trainflow.run.storage import join, replace_bytes

    id_column = cfg.data.id_column
    ids = rows[id_column] if id_column else pa.array(np.arange(rows.num_rows))
    columns = {id_column or "row": ids, **scored.prep.decode_predictions(scored.outputs), "label": rows[cfg.data.label]}
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns), buffer)
    where = join(folder, "predictions", f"policy={policy}", f"period={k}", "part-0.parquet")
    replace_bytes(where, buffer.getvalue())


def _fmt(v: float | None) -> str:
    return "none" if v is None else f"{v:.4g}"


def summarize_replay(config: Config, state: Replay, table: pa.Table, line: Timeline, cache: dict) -> dict[str, Any]:
    """The summary: every period, each policy's totals (mean score, regret, training seconds, retrains, promotions)
    and the recommendation with its noise from resampling the periods' rows."""
    metric, mode = config.promotion.metric, config.promotion.mode
    scored_periods = [p for p in state.periods if all(p["policies"][q]["score"] is not None for q in state.policies)]
    totals: dict[str, dict[str, Any]] = {}
    for q in state.policies:
        scores = [p["policies"][q]["score"] for p in scored_periods]
        best = [
            max(p["policies"][r]["score"] for r in state.policies)
            if mode == "max"
            else min(p["policies"][r]["score"] for r in state.policies)
            for p in scored_periods
        ]
        regret = [abs(b - s) for b, s in zip(best, scores)]
        totals[q] = {
            "mean_score": float(np.mean(scores)) if scores else None,
            "regret": float(np.mean(regret)) if regret else None,
            "training_s": round(sum(p["policies"][q]["training_s"] for p in state.periods), 1),
            "retrains": sum(p["policies"][q]["trained"] for p in state.periods),
            "promotions": sum(p["policies"][q]["trained"] and p["policies"][q]["promoted"] for p in state.periods),
        }
    recommendation = _recommend(config, state, totals, scored_periods, table, line, cache)
    return {
        "run_name": state.name,
        "replay": {
            "metric": metric,
            "mode": mode,
            "periods": state.periods,
            "policies": totals,
            "scored_periods": len(scored_periods),
            "recommendation": recommendation,
        },
    }


def _recommend(config, state, totals, scored_periods, table, line, cache) -> str:
    """One line: the policy to run, against the cheaper one nearest to it in score, with the noise of the difference
    from paired resamples of every period's rows; and what the gate's refusals cost against always promoting."""
    metric, mode = config.promotion.metric, config.promotion.mode
    shown = metric.removeprefix("val_")
    ranked = [q for q in state.policies if totals[q]["mean_score"] is not None]
    if not ranked:
        return "no period was scored by every policy: nothing to recommend"
    sign = 1.0 if mode == "max" else -1.0
    ranked.sort(key=lambda q: -sign * totals[q]["mean_score"])
    noise = _noise(config, state, scored_periods, table, line, cache)
    best = ranked[0]
    cheaper = [q for q in ranked[1:] if totals[q]["training_s"] < totals[best]["training_s"]]
    line_out = ""
    if cheaper:
        other = cheaper[0]
        gain = sign * (totals[best]["mean_score"] - totals[other]["mean_score"])
        spread = noise.get((best, other), 0.0)
        ratio = totals[best]["training_s"] / max(totals[other]["training_s"], 1e-9)
        if gain <= 2 * spread:  # within the noise: the cheaper policy does as well
            line_out = (
                f"{_describe(other)}: {shown} {totals[other]['mean_score']:.4g} a period, within the noise of "
                f"{_describe(best)} ({gain:.3g} worse, noise {spread:.2g}) at {1 / ratio:.2g}x its training time"
            )
        else:
            line_out = (
                f"{_describe(best)}: {shown} {totals[best]['mean_score']:.4g} a period, {gain:.3g} (noise {spread:.2g}) "
                f"better than {_describe(other)} at {ratio:.2g}x the training time"
            )
    else:
        line_out = f"{_describe(best)}: {shown} {totals[best]['mean_score']:.4g} a period, the best and the cheapest"
    if "gate" in state.policies:
        later = [p for p in state.periods if p["period"] > 0 and p["policies"]["gate"]["trained"]]
        kept = sum(not p["policies"]["gate"]["promoted"] for p in later)
        line_out += f"; the gate kept the champion {kept} of {len(later)} times"
        if "always" in state.policies and totals["always"]["mean_score"] is not None:
            cost = sign * (totals["always"]["mean_score"] - totals["gate"]["mean_score"])
            line_out += f", which cost {cost:.3g}" if cost >= 0 else f", which gained {-cost:.3g}"
    return line_out


def _describe(policy: str) -> str:
    return {
        "gate": "retraining every period with the gate",
        "always": "retraining every period, always promoting",
        "never": "never retraining",
        "warm": "retraining every period from the serving model (warm start) with the gate",
    }.get(policy, f"retraining every {policy.removeprefix('every-')} periods with the gate")


def _noise(config, state, scored_periods, table, line, cache) -> dict[tuple[str, str], float]:
    """The standard deviation, over paired resamples of each scored period's rows, of the difference of two
    policies' mean scores."""

    rng = np.random.default_rng(config.split.seed)
    metric, label = config.promotion.metric, config.data.label
    per_rep = {q: np.zeros(BOOTSTRAP) for q in state.policies}
    cfg = _replay_config(config, "unused.parquet", _folder(config, state.name))
    for p in scored_periods:
        k = p["period"]
        inside = (line.values >= state.bounds[k]) & (line.values < state.bounds[k + 1])
        rows = table.filter(pa.array(inside))
        rows = rows.filter(pa.array(has_label(rows, label)))
        picks = [rng.integers(0, rows.num_rows, rows.num_rows) for _ in range(BOOTSTRAP)]
        for q in state.policies:
            scored = _scored(cfg, state, k, p["policies"][q]["serving_version"], rows, cache)
            for r, idx in enumerate(picks):
                value = scored.subset(idx).metrics().get(metric)
                per_rep[q][r] += (value if value is not None else np.nan) / len(scored_periods)
    return {(a, b): float(np.nanstd(per_rep[a] - per_rep[b])) for a in state.policies for b in state.policies if a != b}


def score_chart(summary: dict[str, Any]):
    """Each policy's score per period (a line per policy; a period no policy could score is left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = summary["replay"]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for policy in r["policies"]:
        xs = [p["period"] for p in r["periods"] if p["policies"][policy]["score"] is not None]
        ys = [p["policies"][policy]["score"] for p in r["periods"] if p["policies"][policy]["score"] is not None]
        ax.plot(xs, ys, marker="o", label=policy)
    ax.set_xticks([p["period"] for p in r["periods"]], [p["start"] for p in r["periods"]], rotation=30, ha="right")
    ax.set_ylabel(f"{r['metric'].removeprefix('val_')} on the period's rows")
    ax.set_title(f"replay {summary['run_name']}: the model each policy served, period by period", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


@task(name="report-replay", cache_policy=NO_CACHE)
def report_replay(config: Config, summary: dict[str, Any]) -> dict[str, str]:
    """The replay's records: an MLflow run in <experiment>-replay (each policy's totals as metrics, the score plot, the
    summary as JSON) and Prefect artifacts (the plot, the totals as a table, the recommendation)."""
    import mlflow
    from prefect.artifacts import create_image_artifact, create_markdown_artifact, create_table_artifact

    from trainflow.run.redact import redact_value
    from trainflow.tasks.common import artifact_key, png_data_uri
    from trainflow.run.tracking import ensure_experiment, tracking

    r = summary["replay"]
    fig = score_chart(summary)
    _, png = png_data_uri(fig)
    uri = config.mlflow.tracking_uri
    with tracking(uri):
        exp_id = ensure_experiment(uri, config.mlflow.experiment + SUFFIX)
        client = mlflow.MlflowClient()
        run = client.create_run(exp_id, run_name=summary["run_name"], tags={"trainflow.replay": summary["run_name"]})
        status = "FAILED"
        try:
            _log_replay(client, run.info.run_id, redact_value(summary), fig)  # paths may hold a URI's credentials
            status = "FINISHED"
        finally:  # the run ends as its records did
            client.set_terminated(run.info.run_id, status)
    import matplotlib.pyplot as plt

    plt.close(fig)
    name = config.mlflow.registered_model + SUFFIX
    ids = {
        "plot": create_image_artifact(
            image_url=png,
            key=artifact_key(name, "replay"),
            description=f"replay {summary['run_name']}: score per period",
        ),
        "policies": create_table_artifact(
            table=[{"policy": p, **t} for p, t in r["policies"].items()],
            key=artifact_key(name, "replay-policies"),
            description=f"replay {summary['run_name']}: each policy's totals",
        ),
        "recommendation": create_markdown_artifact(
            markdown=f"**replay {summary['run_name']}**: {r['recommendation']}",
            key=artifact_key(name, "replay-recommendation"),
            description="what the replay recommends",
        ),
    }
    return {"mlflow_run_id": run.info.run_id, **{k: str(v) for k, v in ids.items()}}


def _log_replay(client, run_id: str, summary: dict[str, Any], fig) -> None:
    """The replay's MLflow records: each policy's totals as metrics, the plot, the summary, the recommendation."""
    from mlflow.entities import Metric

    from trainflow.run.tracking import mlflow_key

    r = summary["replay"]
    now = int(time.time() * 1000)
    metrics = [
        Metric(mlflow_key(f"{policy}.{key}"), float(value), now, 0)
        for policy, totals in r["policies"].items()
        for key, value in totals.items()
        if isinstance(value, (int, float)) and math.isfinite(value)
    ]
    client.log_batch(run_id, metrics=metrics)
    client.log_figure(run_id, fig, artifact_file="replay.png")
    client.log_dict(run_id, summary, "replay.json")
    client.set_tag(run_id, "trainflow.replay.recommendation", r["recommendation"][:5000])
