"""MLflow "models from code" definition: the registered model is this file plus the checkpoint artifact.

Nothing is pickled: MLflow copies this file and trainflow's serving modules (code_paths, tasks/model_package.py),
and the checkpoint holds weights (torch or the booster's own format) and the preprocessor (JSON). Load with
mlflow.pyfunc.load_model("models:/<name>@champion"), with or without trainflow installed.
"""

from __future__ import annotations

import mlflow
import pandas as pd
import pyarrow as pa
from mlflow.pyfunc import PythonModel


class TrainflowModel(PythonModel):
    def load_context(self, context) -> None:
        from trainflow.trainer.serving.servable import load_servable

        self.servable = load_servable(context.artifacts["checkpoint"])

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        from trainflow.trainer.serving.predict import predict_table

        table = pa.Table.from_pandas(pd.DataFrame(model_input), preserve_index=False)
        return predict_table(self.servable, table).to_pandas()


mlflow.models.set_model(TrainflowModel())
