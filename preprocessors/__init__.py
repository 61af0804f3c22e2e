"""Plain Ray Data preprocessing: fitted on the training split, stored as JSON."""

from trainflow.preprocessors.tabular import FEATURES, LABEL, SchemaDriftError, TabularPreprocessor

__all__ = ["FEATURES", "LABEL", "SchemaDriftError", "TabularPreprocessor"]
