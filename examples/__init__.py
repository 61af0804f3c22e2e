"""Example user models for `model.type: torch` (see README, "Your own PyTorch module")."""
