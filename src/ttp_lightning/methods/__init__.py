"""Registry of methods applied to the pretrained model: `method.name` -> runner."""

from ttp_lightning.baselines.retrain import run_retrain
from ttp_lightning.methods.pareto import run_pareto

METHODS = {"pareto": run_pareto, "retrain": run_retrain}

__all__ = ["METHODS"]
