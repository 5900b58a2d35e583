"""Alg 1, plain (method=pareto) and robust (method=pareto_robust), in one place: its Method (method.py), its
LightningModule (module.py), the callbacks of its constrained early stopping (callbacks.py), its self-checking
settings (schema.py) and the attacks robust Alg 1 trains and stops against (adversary.py)."""
