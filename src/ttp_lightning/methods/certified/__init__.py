"""The certified Pareto learners (Algs 2-4): Newton steps with released (epsilon, delta) certificates."""

from ttp_lightning.methods.certified.exact import run_certified_exact
from ttp_lightning.methods.certified.lissa import run_certified_lissa
from ttp_lightning.methods.certified.online import run_certified_online

__all__ = ["run_certified_exact", "run_certified_lissa", "run_certified_online"]
