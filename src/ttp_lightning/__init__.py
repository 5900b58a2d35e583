"""ttp_lightning: test-time privacy for open-weight image classifiers (Lightning + Hydra)."""

__version__ = "0.1.0"
