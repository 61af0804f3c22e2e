"""The rows' roles: which rows train, choose (validation, folds) and judge (test), as one plan (folds: FoldPlan, the
plan's record and how a row finds its role; plan: the plan made from a table's rows)."""
