"""Baselines the paper compares Alg 1 against."""
