"""How a model trains: train (folds, time limit, the networks' schedule), scaling, tune, ray, checkpoint, failure."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (
    field_validator,
    model_validator,
)

from trainflow.config.base import _Section, key
from trainflow.roles.folds import AUTO_FOLD_ROWS, AUTO_FOLDS, MAX_FOLDS
from trainflow.limits import (
    AUTO_FLOOR_S,
    HANG_FACTOR,
    HANG_FIRST_S,
    HANG_MIN_S,
    MIN_PATIENCE,
    MIN_RUN_S,
    PATIENCE_SHARE,
    ray_folder_refusal,
)


class EarlyStoppingSection(_Section):
    """Stop when checkpoint.metric has not improved by min_delta for patience epochs."""

    patience: int | Literal["auto", "off"] = key(
        "auto",
        "epochs without an improvement of `checkpoint.metric` before stopping; `auto`: "
        f"max({MIN_PATIENCE}, epochs / {PATIENCE_SHARE}); "
        "`off`: never stop early",
    )
    min_delta: float = key(1e-4, "the smallest change that counts as an improvement", ge=0.0)

    @field_validator("patience")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be >= 1, 'auto' or 'off'")
        return v


class TrainSection(_Section):
    early_stopping: EarlyStoppingSection = key(
        doc="the networks stop when `checkpoint.metric` stops improving", default_factory=EarlyStoppingSection
    )
    class_weight: Literal["balanced"] | dict[str, float] | None = key(
        None,
        "classification: `balanced` (n / (classes x count), as scikit-learn) or `{class: weight}`; the loss of "
        "`mlp` and `torch` takes it (the boosters do not, and say so in the log); their probabilities are "
        "recalibrated (`calibration.method: auto`)",
    )
    folds: int | Literal["auto"] = key(
        "auto",
        f"cross-fitting: K (2-{MAX_FOLDS}) fold models per family on the non-test rows, each early-stopped on its own "
        "held-out fold; their out-of-fold predictions choose the family, weight the ensemble and fit "
        "calibration and the threshold, and the served model averages them; `1`: one validation split; `auto`: "
        f"{AUTO_FOLDS} folds up to {AUTO_FOLD_ROWS:,} non-test rows, else 1 "
        "([pipeline.md](pipeline.md#cross-fitting-every-non-test-row-trains-and-is-judged))",
    )
    time_limit: float | Literal["auto", "off"] = key(
        "auto",
        "seconds for all of the training, every family and fold; in the families' order each may use the time "
        "left, each of its runs the time left divided by the waves of its own runs still to start, and a run "
        "stops adding epochs or rounds when its share is spent, keeping its best so far; a family whose runs "
        f"would get under {MIN_RUN_S:.0f} s each is left out with the reason; `auto`: no limit until the first "
        "family's runs end, then the others share what keeps all of the training within max(twice that time, "
        f"{AUTO_FLOOR_S:.0f} s); `off`: "
        "no limit ([families.md](families.md#one-time-budget))",
    )
    refit: Literal["auto", "off"] = key(
        "auto",
        "`auto`: once the family, its rounds and the ensemble weights are chosen, the chosen boosters train once more "
        "on every row that may train (every non-test row when cross-fitted, training and validation rows on one "
        "split) for their chosen rounds scaled by the rows, and that model is scored on the test rows, registered "
        "and gated (the summary's `refit` has both models' test figures); not where there are no test rows, the "
        "time budget has too little left, or the chosen model has no booster; `off`: the chosen model serves "
        "([families.md](families.md#refit))",
    )
    warm_start: str = key(
        "none",
        "`champion`: the challenger continues from the serving model instead of starting from nothing (XGBoost's and "
        "LightGBM's boosters add rounds to the champion's on the new rows, the network starts from its weights at a "
        "tenth of the learning rate; with its preprocessing), judged by the same gate; or a `models:/name@alias` or "
        "`models:/name/version` to start from. Only from a one-split model of a family this config trains with the "
        "same columns, classes and model section; otherwise a fresh fit, with the reason in the summary "
        "([families.md](families.md#warm-start))",
    )

    @field_validator("warm_start")
    @classmethod
    def _warm_start(cls, v: str) -> str:
        if v not in ("none", "champion") and not v.startswith("models:/"):
            raise ValueError("must be 'none', 'champion', or a models:/name@alias or models:/name/version URI")
        return v

    @field_validator("time_limit")
    @classmethod
    def _time_limit(cls, v: float | str) -> float | str:
        if isinstance(v, (int, float)) and not (math.isfinite(v) and v > 0):
            raise ValueError("must be a positive number of seconds, 'auto' or 'off'")
        return v

    @field_validator("folds")
    @classmethod
    def _fold_count(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 20:
            raise ValueError("must be 1 (one validation split), 2 to 20 folds, or 'auto'")
        return v

    @field_validator("class_weight", mode="before")
    @classmethod
    def _class_names_as_text(cls, v: Any) -> Any:
        # YAML reads `{0: 1, 1: 5}` with integer keys; classes are matched by their text form
        return {str(k): w for k, w in v.items()} if isinstance(v, dict) else v

    @field_validator("class_weight")
    @classmethod
    def _weights_positive(cls, v: Any) -> Any:
        if isinstance(v, dict):
            for cls_name, w in v.items():
                if not (math.isfinite(w) and w > 0):
                    raise ValueError(f"weight of class {cls_name!r} must be a positive number, got {w}")
        return v


DEPRECATED_SCALING = {
    "trainer_resources": "Ray 2.60 (Train V2) runs the trainer's controller with 0 CPUs and rejects "
    "trainer_resources; remove it and put what each worker needs in scaling.resources_per_worker",
    "max_retries": "use failure.max_failures",
}


def workers_share_gpus(num_workers: int, use_gpu: bool, resources_per_worker: dict[str, float] | None) -> bool:
    """Several workers with a fraction of a GPU each: Ray packs them onto the same device."""
    gpu = (resources_per_worker or {}).get("GPU", 0)
    return bool(use_gpu) and num_workers > 1 and 0 < gpu < 1


def worker_range(num_workers: int | list[int] | tuple[int, ...]) -> tuple[int, int]:
    """(min, max) of scaling.num_workers: a fixed count is both."""
    if isinstance(num_workers, int):
        return num_workers, num_workers
    return int(num_workers[0]), int(num_workers[-1])


class ScalingSection(_Section):
    num_workers: int | list[int] = key(
        2,
        "Ray Train workers, each a process with a share of the data; `[min, max]`: elastic, the run starts with as "
        "many as the cluster holds (at least min), goes on with fewer when a node is lost and grows back when "
        "capacity returns (docs/scaling.md). Left unset, a small table trains each family in one worker (cross-"
        "fitted, at most 4,000 non-test rows; one split, at most 100,000 training rows), its families in one Ray "
        "Train run (docs/pipeline.md)",
    )
    elastic_resize_monitor_interval_s: float = key(
        60.0, "an elastic run checks this often whether the cluster holds more (or fewer) workers", ge=0
    )
    use_gpu: bool = key(False, "one GPU per worker unless `resources_per_worker.GPU` says otherwise")
    resources_per_worker: dict[str, float] | None = key(
        None, "e.g. `{CPU: 2, GPU: 0.5}`; GPU needs `use_gpu: true`", shown="Ray's default"
    )
    accelerator_type: str | None = key(None, "the GPU type the workers ask for, e.g. `A100`")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = key(
        "PACK", "how the workers are placed on the nodes: `PACK`, `SPREAD`, `STRICT_PACK`, `STRICT_SPREAD`"
    )
    backend: Literal["gloo", "nccl", "hccl"] | None = key(
        None,
        "the networks' collective backend: `gloo`, `nccl` (needs `use_gpu`, and a whole GPU per worker when there "
        "are several), `hccl`",
        shown="Ray's: `nccl` with GPUs, `gloo` without; `gloo` for workers that share a GPU (NCCL refuses two ranks on "
        'one device, "Duplicate GPU detected")',
    )
    env_vars: dict[str, str] = key(
        doc="environment of every Train worker, e.g. `{NCCL_SOCKET_IFNAME: eth0}`; shown "
        "and logged with secret-looking values masked",
        default_factory=dict,
    )
    wait_for_resources: bool = key(False, "skip the pre-start fit check and wait for an autoscaler")
    local_mode: Literal["auto"] | bool = key(
        "auto",
        "train a one-worker fit in Ray Train's local mode: in the train task's own process, with no worker group to "
        "start (about 10 s less per fit on 2 cores), its checkpoints written to the same folders; a failure is retried "
        "by the task's retry, which resumes from the latest one. `auto`: a fixed-size one-CPU-worker fit of a table "
        "in memory of at most 100,000 rows, on the local Ray trainflow starts (a retrain whose fits all train so, "
        "on rows this process holds, starts no Ray at all); `true`: every one-worker fit; `false`: "
        "always a Ray Train worker group (Ray Train restarts a dead worker, the hang watchdog, the worker's memory "
        "apart from the flow's). docs/performance.md#local-mode",
    )

    @model_validator(mode="before")
    @classmethod
    def _deprecated(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            for key, instead in DEPRECATED_SCALING.items():
                if key in raw:
                    raise ValueError(f"{key} is not supported: {instead}")
        return raw

    @field_validator("num_workers")
    @classmethod
    def _worker_count(cls, value: int | list[int]) -> int | list[int]:
        if isinstance(value, int):
            if value < 0:
                raise ValueError(f"must be >= 0, got {value}")
            return value
        if len(value) != 2 or not 1 <= value[0] <= value[1]:
            raise ValueError(
                f"an elastic worker count is [min, max] with 1 <= min <= max, got {list(value)}; a fixed count is one "
                "number"
            )
        return [int(v) for v in value] if value[0] < value[1] else int(value[0])

    @property
    def elastic(self) -> bool:
        return not isinstance(self.num_workers, int)

    @property
    def min_workers(self) -> int:
        return worker_range(self.num_workers)[0]

    @property
    def max_workers(self) -> int:
        return worker_range(self.num_workers)[1]

    @property
    def workers_label(self) -> str:
        """The worker count as the config writes it: `2`, or `[1, 4]` (elastic)."""
        return f"[{self.min_workers}, {self.max_workers}]" if self.elastic else str(self.num_workers)

    @model_validator(mode="after")
    def _gpu_needs_use_gpu(self) -> ScalingSection:
        res = self.resources_per_worker or {}
        for name, val in res.items():
            if val < 0:
                raise ValueError(f"resources_per_worker.{name}: must be >= 0, got {val}")
        if res.get("GPU", 0) > 0 and not self.use_gpu:
            raise ValueError("resources_per_worker.GPU is set but use_gpu is false; set scaling.use_gpu: true")
        if self.backend == "nccl" and not self.use_gpu:
            raise ValueError("backend: nccl needs GPUs; set scaling.use_gpu: true or use gloo")
        if self.backend == "nccl" and workers_share_gpus(self.max_workers, self.use_gpu, res):
            raise ValueError(
                f"backend: nccl cannot train {self.workers_label} workers at resources_per_worker.GPU "
                f"{res['GPU']:g}: Ray places such workers on the same GPU and NCCL refuses two ranks on one "
                "device ('Duplicate GPU detected'); leave backend unset (trainflow then uses gloo) or give "
                "each worker a whole GPU"
            )
        return self


SEARCH_KINDS = {"loguniform": 2, "uniform": 2, "randint": 2, "choice": None, "grid": None}


class TuneSection(_Section):
    num_samples: int = key(4, "trials, each a full Ray Train run", ge=1)
    max_concurrent_trials: int | None = key(None, "the most trials at once", shown="as many as the cluster holds", ge=1)
    metric: str | None = key(None, "what the sweep optimises", shown="`checkpoint.metric`")
    mode: Literal["min", "max"] | None = key(None, "`min` or `max`", shown="from the metric")
    scheduler: Literal["asha", "fifo"] = key("asha", "`asha` (early stopping over epochs) or `fifo`")
    grace_period: int = key(1, "ASHA's minimum epochs", ge=1)
    reduction_factor: float = key(2.0, "ASHA's halving rate", gt=1.0)
    search_space: dict[str, dict[str, list[Any]]] = key(
        doc="dotted config key → `{loguniform: [lo, hi]}`, `{uniform: [lo, hi]}`, `{randint: [lo, hi]}`, "
        "`{choice: [...]}` or `{grid: [...]}`; left out: each family's own default space (the network: "
        "`model.params.mlp.learning_rate`, `.weight_decay`, `.dropout`, `.hidden_sizes`; the boosters: "
        "`model.params.learning_rate`, `max_depth`, `subsample`, `reg_lambda`), the family searched too when there "
        "are several; a key one family does not read is ignored by it",
        shown="each family's default space",
        default_factory=dict,
    )

    @field_validator("search_space")
    @classmethod
    def _known_kinds(cls, space: dict[str, dict[str, list[Any]]]) -> dict[str, dict[str, list[Any]]]:
        for dotted, spec in space.items():
            if len(spec) != 1 or next(iter(spec)) not in SEARCH_KINDS:
                raise ValueError(
                    f"{dotted}: give exactly one of {sorted(SEARCH_KINDS)}, e.g. {{loguniform: [0.0001, 0.01]}}"
                )
            kind, args = next(iter(spec.items()))
            if not isinstance(args, list) or not args or (SEARCH_KINDS[kind] and len(args) != SEARCH_KINDS[kind]):
                raise ValueError(
                    f"{dotted}.{kind}: expected a list of {SEARCH_KINDS[kind] or 'one or more'} values, got {args!r}"
                )
            if kind in ("loguniform", "uniform", "randint") and not args[0] < args[1]:
                raise ValueError(f"{dotted}.{kind}: the lower bound must be below the upper bound, got {args!r}")
            if kind == "loguniform" and args[0] <= 0:
                raise ValueError(f"{dotted}.loguniform: bounds must be positive, got {args!r}")
        return space


class RaySection(_Section):
    address: str | None = key(
        None,
        "join an existing cluster (`auto`, `host:6379`, `ray://host:10001`)",
        shown="`$RAY_ADDRESS`, else start a local Ray (a cluster `ray start` left on the machine is joined only when "
        "named, e.g. `auto`)",
    )
    runtime_env: dict[str, Any] | None = key(
        None,
        "passed to `ray.init`, e.g. `{working_dir: .}` for a cluster "
        "without trainflow installed; on the local Ray trainflow starts, "
        "its `env_vars` reach Ray's processes through their environment "
        "(never Ray's logs)",
    )
    temp_dir: str | None = key(
        None,
        "the local Ray's session folder (logs, sockets, spilled objects), kept after the "
        "run; must be private to its owner (mode 700, created so)",
        shown="a new private folder under the system's temporary folder (`/tmp` where that one's path is too long "
        "for Ray's socket paths), removed when the run's Ray stops",
    )

    @field_validator("temp_dir")
    @classmethod
    def _sockets_fit(cls, value: str | None) -> str | None:
        import os

        if value is not None and (refused := ray_folder_refusal(os.path.abspath(os.path.expanduser(value)))):
            raise ValueError(refused)
        return value


class CheckpointSection(_Section):
    num_to_keep: int | None = key(3, "best checkpoints kept (the latest is always kept too)", ge=1)
    upload: Literal["auto", "sync", "async"] = key(
        "auto",
        "how a report's checkpoint reaches `storage_path`: `async` uploads it while training goes on (the local "
        "copy removed after; Ray registers it, so a resume, the selection and the gate can read it, only once it "
        "is whole), `sync` before the next step; `auto`: async where storage_path is remote (`s3://`, ...), sync "
        "on a local or shared folder",
    )
    metric: str = key("val_loss", "the metric that ranks checkpoints; must be reported for the task")
    mode: Literal["min", "max"] | None = key(
        None, "`min` or `max`", shown="`min` for losses and errors, `max` otherwise"
    )
    # each Ray Train report waits for the controller's poll (0.5 s here)
    min_interval_s: float = key(
        2.0,
        "epochs shorter than this are grouped into one Ray Train report; the best epoch "
        "of each group is always reported with its checkpoint",
        ge=0.0,
    )


class FailureSection(_Section):
    max_failures: int = key(2, "Ray Train worker-group restarts (`-1`: unlimited)", ge=-1)
    hang_timeout_s: float | Literal["auto"] | None = key(
        "auto",
        f"a worker with no progress this long is killed and the group restarted (`null`: never); `auto`: "
        f"{HANG_FACTOR:.0f}x the longest gap between progress marks (mini-batches, blocks, reports, boosting "
        f"rounds) measured in that attempt, at least {HANG_MIN_S:.0f} s; start-up, until the first step, is "
        f"allowed at least {HANG_FIRST_S:.0f} s whatever the value; a run whose attempts all stall ends with "
        "an error naming what to change (not retried)",
    )
    max_preemption_failures: int = key(
        -1,
        "Ray Train restarts after a node is drained (a spot or preemptible node reclaimed with a warning), counted "
        "apart from `max_failures` (`-1`: unlimited, as Ray's); on a cluster trainflow joins, Ray Train's "
        "preemption watcher is on, on a local Ray trainflow starts it is off (nothing drains it)",
        ge=-1,
    )
    preemption_grace_s: float = key(
        0.0,
        "seconds the surviving workers may run past a drained node's deadline (e.g. to finish a checkpoint's "
        "upload) before Ray Train restarts the group",
        ge=0,
    )
    task_retries: int = key(2, "Prefect retries of the `train` task once Ray Train gives up", ge=0)
    retry_delay_s: float = key(5.0, "seconds between those retries", ge=0)
    worker_start_timeout_s: float = key(
        180.0,
        "seconds Ray Train waits for a worker group to start before that attempt fails (Ray's own default, "
        "60 s, expired on a loaded two-core machine after a worker died); a group that cannot be placed at all "
        "is caught before training",
        gt=0,
    )

    @field_validator("hang_timeout_s")
    @classmethod
    def _positive_timeout(cls, v: float | str | None) -> float | str | None:
        if isinstance(v, (int, float)) and v <= 0:
            raise ValueError("must be a positive number of seconds, 'auto', or null to disable the watchdog")
        return v
