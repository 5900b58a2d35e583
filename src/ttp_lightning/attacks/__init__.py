"""Open-weight test-time-privacy attacks on the forget set (App. "Defining Test-Time Privacy Attacks") and
the checks that say whether their numbers can be trusted. `attacks=adaptive` (default): APGD with a ReLU
surrogate, restarts and three objectives, worst case per image; `attacks=paper`: the paper's Gaussian,
FGSM and PGD with exact gradients."""

from ttp_lightning.attacks.apgd import Probe, adaptive_attack, apgd, apgd_checkpoints
from ttp_lightning.attacks.objectives import OBJECTIVES
from ttp_lightning.attacks.paper import fgsm_attack, gaussian_attack, pgd_attack
from ttp_lightning.attacks.suite import ATTACKS, WORST, evaluate_attacks, zero_gradient_mask
from ttp_lightning.attacks.surrogate import smooth_relu_gradients

__all__ = ["ATTACKS", "OBJECTIVES", "WORST", "Probe", "adaptive_attack", "apgd", "apgd_checkpoints", "evaluate_attacks",
           "fgsm_attack", "gaussian_attack", "pgd_attack", "smooth_relu_gradients", "zero_gradient_mask"]
