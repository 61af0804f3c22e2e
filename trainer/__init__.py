"""Plain Ray Train + PyTorch code: the model, the per-worker loop, checkpoints. No Prefect, no MLflow."""
