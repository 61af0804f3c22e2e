"""What a registered model serves with: the checkpoint's layout (checkpoint), a checkpoint of any family behind one
call (servable), predictions and their calibration (predict, calibration) and MLflow's model-from-code file
(pyfunc_model). A registered model ships this folder, every family's file and what they import at their top level
(tasks/model_package.py serving_modules derives the list), so it serves where trainflow is not installed: nothing
here imports Ray or Prefect (tests/test_layout.py)."""
