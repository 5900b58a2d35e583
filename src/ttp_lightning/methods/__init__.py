"""Methods applied to the pretrained model A(D). A method is one YAML in conf/method/ whose `_target_` names a
Method subclass (base.py) plus that class; Hydra builds it, so no registry lists them and nothing imports a
method that is not run: Alg 1 (pareto.py), the certified learners (certified/), the baselines (baselines/)."""

from ttp_lightning.methods.base import Method
from ttp_lightning.methods.output import MethodOutput

__all__ = ["Method", "MethodOutput"]
