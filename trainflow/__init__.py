"""trainflow: a retraining pipeline of Prefect flows over Ray Data, Ray Train and MLflow.

The Python API (trainflow.retrain, replay, predict, tune, load_model, evaluate, leaderboard, snapshot) is imported on first use, so `import trainflow`
stays light; its home is trainflow.flows.api.
"""

_API = ("retrain", "replay", "predict", "tune", "load_model", "evaluate", "leaderboard", "snapshot", "Model")
__all__ = list(_API)


def __getattr__(name: str):
    if name in _API:
        from trainflow.flows import api

        return getattr(api, name)
    raise AttributeError(f"module 'trainflow' has no attribute {name!r}")
