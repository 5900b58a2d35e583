"""Differential privacy of the certified release: the paper's closed-form sensitivities (sensitivity.py), the
Gaussian mechanism that turns a sensitivity into noise for an (epsilon, delta) budget (mechanism.py), and the
noise itself, drawn from a cryptographic stream (noise.py)."""
