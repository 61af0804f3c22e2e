"""Benchmarks: each prints `NAME: trainflow X, baseline Y, ratio Z`, the baseline measured in the same run."""
