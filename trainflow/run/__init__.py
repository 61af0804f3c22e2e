"""What a run stands on: starting and joining Ray and Prefect (runtime), waiting out the services a run needs
(services), locks one run name and one champion at a time (locks), storage at any URI through pyarrow.fs (storage),
no secret in what is written or shown (redact), MLflow tracking (tracking)."""
