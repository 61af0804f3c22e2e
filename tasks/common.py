"""What every task shares: the retry policy, its logger, and figures as images Prefect's UI renders."""

from __future__ import annotations

import base64
import io
import logging
import re
from typing import Any, Callable

from prefect import get_run_logger
from prefect.exceptions import MissingContextError

from trainflow.config import Config, infer_format
from trainflow.errors import TrainflowError, disk_full
from trainflow.run.runtime import stop_requested
from trainflow.run.services import explain
from trainflow.tables.files import INFERENCE_INPUT, in_memory_bytes, list_files, scoring_in_process_bytes


def chart_figure(**kwargs):
    """A new matplotlib Figure whose text is text: a `$` in a column name, class or value is a dollar sign, not
    mathtext (which would fail to parse `cost $_$ total` when the chart is drawn). Matplotlib reads the setting when
    a text is made, tick labels included, which it makes as the figure draws: set for this process, where charts are
    trainflow's own."""
    import matplotlib
    from matplotlib.figure import Figure  # no pyplot: no global state, so it may draw on a helper thread

    matplotlib.rcParams["text.parse_math"] = False
    return Figure(**kwargs)


def png_data_uri(fig) -> tuple[bytes, str]:
    """A matplotlib figure as PNG bytes and as a data: URI: Prefect's UI renders an embedded image, never a
    file:// or s3:// one a browser cannot open."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    png = buf.getvalue()
    return png, "data:image/png;base64," + base64.b64encode(png).decode()


def retry_unless_user_error(task, task_run, state) -> bool:
    """Retry infrastructure failures (Ray, a dead actor, a lost node, the registry); never a user's bad config
    or data, a full disk, or anything once the process was asked to stop (SIGTERM, e.g. a cancelled flow run)."""
    try:
        state.result()
    except TrainflowError:
        return False
    except Exception as exc:  # noqa: BLE001 - anything else is infrastructure until proven otherwise
        # a service that stayed away for its whole wait (services.*_wait_s) is not waited for again
        return not (stop_requested(exc) or disk_full(exc) or explain(exc) is not None)
    return False


def task_logger(name: str):
    """The task run's logger; a plain one named trainflow.<name> outside a Prefect task (tests, the Python API)."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(f"trainflow.{name}")


def step(task: Any, in_flow: bool) -> Callable:
    """A task as a flow calls it, or its plain function when the work runs without Prefect (flows/local.py)."""
    return task if in_flow else task.fn


def in_prefect_run() -> bool:
    """Whether this code runs inside a Prefect flow or task run: artifacts and events have a server to go to.
    Small work run without Prefect (trainflow/flows/local.py) records in MLflow and the run folders only."""
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def md(text: object) -> str:
    """Text from data (a column name, a value, a path) safe inside a Markdown table cell or line: HTML and
    Markdown's link, emphasis, code and table characters escaped, line breaks as spaces."""
    import html

    out = html.escape(" ".join(str(text).split()), quote=False)
    for ch in "\\`*_[]()|#!":
        out = out.replace(ch, "\\" + ch)
    return out


def md_code(text: object) -> str:
    """Text from data as an inline code span (shown as typed, never as a link or HTML): backticks and line breaks
    cannot end it, and a table's cell divider is escaped."""
    return "`" + " ".join(str(text).split()).replace("`", "'").replace("|", "\\|") + "`"


def lineage_for(config: Config, fingerprint: str, family: str) -> dict[str, str]:
    """What a checkpoint records of its training: the data fingerprint and the training-relevant config's hash."""
    return {"data_fingerprint": fingerprint, "config_hash": config.training_hash(family)}


def artifact_key(model_name: str, what: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{model_name}-{what}".lower()).strip("-")


def scored_here(config: Config, table_bytes: int) -> bool:
    """Whether a scoring table of table_bytes (decoded) is read, predicted and written by the calling process, with
    no Ray: a CPU scoring of a table under scoring_in_process_bytes() (512 MiB on a machine of 4 GiB or more),
    unless data.materialize is never."""
    return (
        not config.inference.use_gpu
        and table_bytes <= scoring_in_process_bytes()
        and config.data.materialize != "never"
    )


def scoring_table_bytes(config: Config) -> int:
    """inference.input's decoded size from its files' metadata (no read)."""
    fmt = infer_format(config.inference.input)
    return in_memory_bytes(*list_files(config.inference.input, fmt, INFERENCE_INPUT), fmt)
