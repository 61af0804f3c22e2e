"""Plain Ray Data preprocessing: fitted on the training split, stored as JSON."""

from preprocessors.tabular import FEATURES, LABEL, SchemaDriftError, TabularPreprocessor

__all__ = ["FEATURES", "LABEL", "SchemaDriftError", "TabularPreprocessor"]
