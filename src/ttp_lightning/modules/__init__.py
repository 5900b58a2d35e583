"""LightningModules: ERM pretraining (also used by retraining) and Pareto finetuning (Alg 1)."""

from ttp_lightning.modules.erm import ERMModule
from ttp_lightning.modules.pareto import ParetoFinetuneModule

__all__ = ["ERMModule", "ParetoFinetuneModule"]
