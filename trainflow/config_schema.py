"""The config's JSON schema (`trainflow config schema`): pydantic's, with a description for every key."""

from __future__ import annotations

from typing import Any

from trainflow.config import BOOSTER_KEYS, Config

SECTIONS = {
    "data": "the training table: where it is, its label, features and id column",
    "data.csv": "how CSV files are parsed (pyarrow.csv)",
    "split": "the seeded test/validation/train split of the rows",
    "preprocess": "how text and date columns become features",
    "model": "the model family or families, and their settings",
    "model.params": "gradient-boosted trees' parameters (model.type xgboost / lightgbm / catboost)",
    "train": "the training loop: epochs, batch size, optimizer, schedule, early stopping (sized to the table by default)",
    "train.early_stopping": "stop training when the monitored metric stops improving",
    "scaling": "Ray Train's workers: how many, CPU or GPU, resources per worker",
    "checkpoint": "which checkpoints are kept and which one is best",
    "failure": "retries of failed workers and tasks, and the hang watchdog",
    "promotion": "the champion gate: when a new version becomes @champion",
    "calibration": "classification: probabilities recalibrated on the validation split when training distorted them",
    "validation": "checks of the training data against the champion's training baseline, before any training",
    "validation.min_row_ratio": "training rows below this share of the champion's are a collapse",
    "validation.max_null_increase": "a column's null rate rising by more than this is an anomaly",
    "validation.max_label_shift": "class shares moving by more than this (L-infinity; a number label: Jensen-Shannon)",
    "validation.max_numeric_drift": "Jensen-Shannon divergence (base 2) of a number column's distribution above which "
                                    "it is an anomaly",
    "validation.max_category_drift": "L-infinity distance of a text column's category shares above which it is an anomaly",
    "validation.min_rows": "distributions of fewer training rows are not judged (the row count and columns are)",
    "monitor": "live performance once labels arrive (trainflow monitor)",
    "mlflow": "MLflow tracking and the model registry",
    "ray": "the Ray cluster to use",
    "tune": "a Ray Tune sweep (trainflow tune)",
    "inference": "batch inference after a retrain (and trainflow predict)",
    "inference.drift": "drift of the scoring table from the model's training baseline, per feature",
    "inference.drift.enabled": "measure drift in the prediction pass",
}

# key -> meaning, as docs/configuration.md's table says it
KEYS = {
    'data.path': 'file, folder, glob or URI (s3://...) of the training table',
    'data.format': 'parquet or csv (default: from the extension (.csv → csv, else parquet))',
    'data.label': 'label column (any name, spaces and punctuation allowed)',
    'data.features': 'feature columns: numbers, text, dates/timestamps (default: every column but label and id)',
    'data.id_column': "carried into the predictions; also the split's key when given (not prediction or proba_*) (default: none)",
    'data.csv.delimiter': 'how CSV files are parsed (pyarrow.csv); files are picked by their extension (.csv, .tsv, .parquet, .parq, .pq, optionally compressed) (default: , / " / utf8)',
    'data.csv.quote_char': 'how CSV files are parsed (pyarrow.csv); files are picked by their extension (.csv, .tsv, .parquet, .parq, .pq, optionally compressed) (default: , / " / utf8)',
    'data.csv.encoding': 'how CSV files are parsed (pyarrow.csv); files are picked by their extension (.csv, .tsv, .parquet, .parq, .pq, optionally compressed) (default: , / " / utf8)',
    'data.materialize': "keep the table in Ray's object store (always) or stream it from its files every epoch (never); auto: materialize when its in-memory size (from the files' metadata) is under a quarter of the store (default: auto)",
    'task': 'classification or regression',
    'split.test_fraction': "fraction of rows in the test role, read once by the final scoring and the gate, 0 <= f < 1, at most 50,000 rows (a seeded hash of each row's id, or of its values; a table that grows keeps its test rows; 0: no test role) (default: 0.2)",
    'split.validation_fraction': "fraction of the non-test rows held out for early stopping, the family choice, ensemble weights and calibration, 0 < f < 1 (a class with too few rows for a role keeps them in training) (default: 0.2)",
    'split.seed': 'seeds the split and training (default: 42)',
    'preprocess.max_onehot': 'text columns with at most this many values are one-hot; wider ones are embedded (default: 16)',
    'preprocess.min_frequency': 'embedded columns: values seen fewer times share the unknown code (default: 5)',
    'preprocess.max_categories': 'embedded columns keep at most this many (most frequent) values (default: 100000)',
    'preprocess.parse_dates': 'text columns whose values parse as ISO-8601 become date parts (default: true)',
    'model.type': "mlp (trainflow's network), xgboost, lightgbm, catboost or torch (your own nn.Module), a list of them (each trained, with their weighted ensemble (model.ensemble); the best on the validation split kept), or auto: [mlp, xgboost, lightgbm, catboost] (default: auto; a sweep (tune) trains one per trial and searches the family)",
    'model.params': "xgboost/lightgbm/catboost: num_boost_round, early_stopping_rounds, learning_rate, max_depth, ... (default: the libraries' defaults, learning rate 0.1, 1,000 rounds, early stopping after 50, external memory auto)",
    'model.class_path': 'torch: package.module:ClassName of your module (default: none)',
    'validation.on_anomaly': "fail or warn when the training data departs from the champion's (docs/monitoring.md lists the checks and their keys) (default: fail)",
    'inference.drift.numeric_threshold': 'drift verdicts per feature (JS divergence / L-infinity); inference.drift.enabled: false turns drift off (default: 0.1 / 0.1 / 100)',
    'inference.drift.categorical_threshold': 'drift verdicts per feature (JS divergence / L-infinity); inference.drift.enabled: false turns drift off (default: 0.1 / 0.1 / 100)',
    'inference.drift.min_rows': 'drift verdicts per feature (JS divergence / L-infinity); inference.drift.enabled: false turns drift off (default: 0.1 / 0.1 / 100)',
    'monitor.max_drop': 'trainflow monitor: degraded when the live promotion.metric is worse than the validation score by more (default: 0.05)',
    'monitor.min_rows': 'trainflow monitor: the fewest labelled predictions a verdict (ok or degraded) rests on; fewer are reported without one (default: 100)',
    'model.ensemble': "with two or more families: also a weighted ensemble of their best checkpoints (greedy ensemble selection on the validation split, scored cross-fitted), a candidate beside them (default: true)",
    'model.allowed_class_paths': "module classes a model read from the registry or storage may import besides model.class_path (the gate's champion, predict --model); any other is refused, never imported (default: [])",
    'model.init_args': "torch: keyword arguments of your module's constructor (default: {})",
    'model.hidden_sizes': 'MLP hidden layer widths (default: [256, 128])',
    'model.dropout': 'dropout after each hidden layer (default: 0.3)',
    'model.numeric_embedding': "mlp: periodic passes each continuous value (numbers, date parts) through a periodic embedding (rtdl_num_embeddings' PLR: learned frequencies, sin and cos, a linear layer) before the layers; none: the standardized value as it is; auto: periodic up to 1,000,000 training rows (default: auto)",
    'train.epochs': 'the most epochs (early stopping may end sooner); auto: about 4,000 optimizer steps per worker, 10-300 epochs (default: auto)',
    'train.batch_size': 'rows per optimizer step per worker; auto: rows per worker / 32 as a power of two, 16-512 (default: auto)',
    'train.learning_rate': 'AdamW peak learning rate (default: 0.001)',
    'train.weight_decay': 'AdamW decoupled weight decay (default: 0.01)',
    'train.schedule': 'per-step learning rate after the warm-up: cosine (to 0 at the last epoch) or constant (default: cosine)',
    'train.warmup_fraction': 'linear warm-up, as a fraction of all steps (default: 0.05)',
    'train.early_stopping.patience': 'epochs without an improvement of checkpoint.metric before stopping; auto: max(10, epochs / 10); off (default: auto)',
    'train.early_stopping.min_delta': 'the smallest change that counts as an improvement (default: 0.0001)',
    'failure.worker_start_timeout_s': 'seconds Ray Train waits for a worker group to start before the attempt fails (default: 180)',
    'train.folds': "cross-fitting: each family trains this many fold models on the non-test rows, each early-stopped on its own held-out fold; their out-of-fold predictions choose the family, weight the ensemble and fit calibration and the threshold, and the served model averages the fold models; 1: one validation split; auto: 5 folds up to 4,000 non-test rows, else 1 (default: auto)",
    'train.time_limit': "seconds for all of the training, every family and fold: in the families' order each may use the time left, each of its runs the time left over its runs still to start, each stopping with its best so far when its share is spent; a family that cannot start in time is left out with the reason; auto: no limit until the first family's runs end, then the others share what keeps all of the training within max(twice that time, 300 s); off: no limit (default: auto)",
    'train.class_weight': 'classification: balanced (n / (classes x count), as scikit-learn) or {class: weight} (default: none)',
    'train.label_smoothing': 'classification, the networks: train on cross-entropy against labels smoothed by this much; validation metrics and early stopping read the plain loss (default: 0)',
    'scaling.num_workers': 'Ray Train workers (default: 2)',
    'scaling.use_gpu': 'one GPU per worker unless resources_per_worker.GPU says otherwise (default: false)',
    'scaling.resources_per_worker': "e.g. {CPU: 2, GPU: 0.5}; GPU needs use_gpu: true (default: Ray's default)",
    'scaling.accelerator_type': 'e.g. A100 (default: none)',
    'scaling.placement_strategy': 'PACK, SPREAD, STRICT_PACK, STRICT_SPREAD (default: PACK)',
    'scaling.backend': 'gloo, nccl (needs use_gpu, and a whole GPU per worker when there are several), hccl (default: Ray\'s: nccl with GPUs, gloo without; gloo for workers that share a GPU (several workers at resources_per_worker.GPU < 1: NCCL refuses two ranks on one device, "Duplicate GPU detected"))',
    'scaling.env_vars': 'environment of every Train worker, e.g. {NCCL_SOCKET_IFNAME: eth0} (default: {})',
    'scaling.wait_for_resources': 'skip the pre-start fit check and wait for an autoscaler (default: false)',
    'ray.address': 'join an existing cluster (auto, host:6379, ray://host:10001) (default: $RAY_ADDRESS, else start a local Ray)',
    'ray.runtime_env': 'passed to ray.init (e.g. {working_dir: .} for a cluster without trainflow installed) (default: none)',
    'checkpoint.num_to_keep': 'best checkpoints kept (the latest is always kept too) (default: 3)',
    'checkpoint.metric': 'metric that ranks checkpoints; must be reported for the task (default: val_loss)',
    'checkpoint.mode': ' (default: min for losses/errors, max otherwise)',
    'checkpoint.min_interval_s': 'epochs shorter than this are grouped into one Ray Train report; the best epoch of each group is always reported with its checkpoint (default: 2)',
    'failure.max_failures': 'Ray Train worker-group restarts (-1 unlimited) (default: 2)',
    'failure.hang_timeout_s': 'a worker with no progress this long is killed and restarted (null: never); auto: 20x the longest gap between progress marks (mini-batches, blocks, reports, boosting rounds) measured in that attempt, at least 60 s, and 120 s until the first mark. A run whose attempts all stall ends with an error naming what to change (not retried) (default: auto)',
    'failure.task_retries': 'Prefect retries of the train task once Ray Train gives up (default: 2)',
    'failure.retry_delay_s': 'seconds between those retries (default: 5)',
    'promotion.metric': 'validation metric of the champion/challenger gate (default: checkpoint.metric (val_loss if that is train_loss))',
    'promotion.mode': 'min or max (default: from the metric)',
    'promotion.margin': 'the challenger must beat the champion by more than this (default: 0.0)',
    'promotion.min_score': 'the floor: a model worse than this on promotion.metric is registered and tagged, never made @champion, the first one included (default: none)',
    'promotion.confidence': 'the challenger must beat the champion (by more than margin) in at least this share of paired bootstrap resamples of the judged test rows; null: the whole split decides once (default: 0.95; at 0.95 a challenger no better than the champion is promoted in about 5% of runs, python -m bench gate-honesty)',
    'promotion.slices': 'columns whose values slice the validation split: every metric per value, with row counts (default: none)',
    'promotion.min_test_rows': 'the fewest test rows held out from both the challenger and the champion that a promotion may rest on; fewer: not promoted (default: 30)',
    'promotion.max_slice_drop': 'reject a challenger whose promotion.metric is more than this worse than the champion on any slice with min_slice_rows rows (default: none)',
    'promotion.min_slice_rows': 'slices with fewer rows are reported, not judged (default: 30)',
    'calibration.method': 'classification: auto (fit when train.class_weight is set or the validation ECE is above max_ece: a temperature for networks, Platt scaling for boosters; kept only when it lowers the ECE), temperature, platt or none (default: auto)',
    'calibration.max_ece': 'auto recalibrates above this validation expected calibration error (default: 0.03)',
    'calibration.decision_threshold': 'two classes: the prediction column is the positive class when its probability reaches this; f1: the threshold that maximises validation F1; none: the most probable class (default: none)',
    'storage_path': 'where Ray Train writes runs and checkpoints (local or URI) (default: runs)',
    'mlflow.tracking_uri': ' (default: $MLFLOW_TRACKING_URI, else sqlite:///<storage_path>/../mlflow.db)',
    'mlflow.experiment': ' (default: trainflow)',
    'mlflow.registered_model': 'registry name (default: trainflow-model)',
    'inference.input': 'table to score (give both input and output, or neither) (default: none)',
    'inference.output': 'Parquet output folder (local or URI) (default: none)',
    'inference.on_unseen': 'a text value never seen in training: predict with the unknown code and count it (unknown), or fail the run (error) (default: unknown)',
    'inference.batch_size': 'rows per inference batch (default: 4096)',
    'inference.num_actors': 'inference actors (default: 1)',
    'inference.use_gpu': 'each inference actor asks for a GPU and predicts on it (default: false)',
    'tune.num_samples': 'trials (each a full Ray Train run) (default: 4)',
    'tune.max_concurrent_trials': 'cap on trials at once (default: as many as the cluster holds)',
    'tune.metric': 'what the sweep optimises (default: checkpoint.metric, from the metric)',
    'tune.mode': 'what the sweep optimises (default: checkpoint.metric, from the metric)',
    'tune.scheduler': 'asha (early stopping over epochs) or fifo (default: asha)',
    'tune.grace_period': "ASHA's minimum epochs and halving rate (default: 1, 2)",
    'tune.reduction_factor': "ASHA's minimum epochs and halving rate (default: 1, 2)",
    'tune.search_space': 'dotted config key → {loguniform: [lo, hi]}, {uniform: [lo, hi]}, {randint: [lo, hi]}, {choice: [...]} or {grid: [...]} (default: each family\'s own default space, the family searched too)',
}


def _booster(key: str) -> str:
    libs = " and ".join(BOOSTER_KEYS[key])
    if key == "num_boost_round":
        return "most boosting rounds; early stopping ends most runs well before"
    if key == "early_stopping_rounds":
        return "rounds without a better validation loss before stopping, or off"
    if key == "external_memory":
        return "xgboost: read the shard into an external-memory matrix (pages on disk); auto: when in-memory would not fit"
    return f"{libs}'s own {key} (the library's default when unset)"


def description(key: str) -> str | None:
    if key in KEYS:
        return KEYS[key]
    if key in SECTIONS:
        return SECTIONS[key]
    if key.startswith("model.params."):
        return _booster(key.removeprefix("model.params."))
    return None


def config_schema() -> dict[str, Any]:
    """Config's JSON schema, every property with a description; `task` optional (inferred from the label)."""
    schema = Config.model_json_schema()
    defs = schema.get("$defs", {})
    done: set[str] = set()

    def walk(node: dict[str, Any], prefix: str) -> None:
        for name, prop in node.get("properties", {}).items():
            key = prefix + name
            text = description(key)
            if text:
                prop["description"] = text
            refs = [prop.get("$ref")] + [a.get("$ref") for a in prop.get("anyOf", [])]
            ref = next((r for r in refs if r), None)
            if ref and ref not in done:  # a section type used once per config
                done.add(ref)
                walk(defs[ref.rsplit("/", 1)[-1]], key + ".")

    walk(schema, "")
    schema["required"] = [k for k in schema.get("required", []) if k != "task"]
    schema["title"] = "trainflow config"
    return schema
