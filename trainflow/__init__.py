"""trainflow: config, CLI and shared helpers of the retraining pipeline."""
