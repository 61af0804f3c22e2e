"""Run every benchmark: python -m bench [name ...]."""

import sys

from bench import (
    async_upload,
    beyond_memory,
    cost_curve,
    demo_e2e,
    drift_overhead,
    fit_floor,
    front_door,
    gate_honesty,
    gbdt_parity,
    inference_throughput,
    ingest_lakehouse,
    ingest_postgres,
    model_quality,
    monitor_estimate,
    node_loss,
    outage_soak,
    portable,
    preprocess_throughput,
    replay_cost,
    split_honesty,
    training_parity,
    tune_parallelism,
)

BENCHES = {
    "model-quality": model_quality.main,
    "gate-honesty": gate_honesty.main,
    "time-honesty": split_honesty.time_honesty,  # the reported figure against later rows: by time vs by hash
    "group-honesty": split_honesty.group_honesty,  # ... against unseen people: by group vs by hash
    "training-parity": training_parity.main,
    "fit-floor": fit_floor.main,  # one Ray Train fit's fixed cost at trainflow's poll vs Ray's default
    "gbdt-parity": gbdt_parity.main,
    "preprocess-throughput": preprocess_throughput.main,
    "inference-throughput": inference_throughput.main,
    "ingest-iceberg": ingest_lakehouse.main,  # also prints ingest-delta
    "ingest-postgres": ingest_postgres.main,  # also prints ingest-postgres-read-sql
    "async-upload": async_upload.main,
    "node-loss": node_loss.main,  # an elastic run losing one of two worker nodes halfway vs uninterrupted
    "tune-parallelism": tune_parallelism.main,
    "demo-e2e": demo_e2e.main,
    "cost-curve": cost_curve.main,
    "replay-cost": replay_cost.main,  # a 6-period replay vs the same retrains as CLI processes one by one  # the default retrain at 150 to 150,000 rows vs HistGradientBoosting, AutoGluon
    "beyond-memory": beyond_memory.main,  # also prints scale-linearity
    "drift-overhead": drift_overhead.main,  # also prints skip-unchanged
    "front-door": front_door.main,
    "monitor-estimate": monitor_estimate.main,  # CBPE's estimate vs the labels, under covariate shift and concept drift
    "outage-soak": outage_soak.main,  # a retrain through 3-minute MLflow and Prefect outages: about 10 minutes
    "portable": portable.main,  # portable-model and portable-package: fresh venvs, minutes
}


def main(names: list[str]) -> int:
    for name in names or list(BENCHES):
        if name not in BENCHES:
            print(f"unknown benchmark {name!r}; choose from {sorted(BENCHES)}", file=sys.stderr)
            return 2
        BENCHES[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
