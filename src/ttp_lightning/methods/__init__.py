"""Registry of methods applied to the pretrained model: `method.name` -> runner.

A runner takes (ctx, pretrained model, datamodule, make_net) and returns a MethodOutput.
"""

from ttp_lightning.methods.baselines.gaussian_uniform import run_gaussian_uniform
from ttp_lightning.methods.baselines.labeldp import run_labeldp
from ttp_lightning.methods.baselines.retrain import run_retrain
from ttp_lightning.methods.baselines.synthetic import run_synthetic
from ttp_lightning.methods.certified import run_certified_exact, run_certified_lissa, run_certified_online
from ttp_lightning.methods.output import MethodOutput
from ttp_lightning.methods.pareto import run_pareto

METHODS = {"pareto": run_pareto, "pareto_robust": run_pareto, "retrain": run_retrain, "certified_exact": run_certified_exact,
           "certified_lissa": run_certified_lissa, "certified_online": run_certified_online,
           "synthetic": run_synthetic, "gaussian_uniform": run_gaussian_uniform, "labeldp": run_labeldp}
CERTIFIED_METHODS = ("certified_exact", "certified_lissa", "certified_online")

__all__ = ["CERTIFIED_METHODS", "METHODS", "MethodOutput"]
