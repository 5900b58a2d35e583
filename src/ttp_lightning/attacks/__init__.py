"""Open-weight test-time-privacy attacks on the forget set (App. "Defining Test-Time Privacy Attacks") and
the checks that say whether their numbers can be trusted. `attacks=adaptive` (default): Gaussian noise and APGD
with ReLU surrogates, restarts and three objectives, worst case per image; `attacks=paper`: the paper's
Gaussian, FGSM and PGD with exact gradients (the APGD function itself: attacks.apgd.apgd; the name `apgd` here is the
module, as conf/attacks/suite/apgd.yaml's `_target_` needs). Each attack is one class (an Attack subclass, base.py) plus one
YAML in conf/attacks/suite/."""

from ttp_lightning.attacks.apgd import APGD, Probe, adaptive_attack, apgd_checkpoints
from ttp_lightning.attacks.base import Attack
from ttp_lightning.attacks.objectives import OBJECTIVES
from ttp_lightning.attacks.paper import FGSM, PGD, GaussianNoise, fgsm_attack, gaussian_attack, pgd_attack
from ttp_lightning.attacks.suite import WORST, build_suite, evaluate_attacks, zero_gradient_mask
from ttp_lightning.attacks.surrogate import smooth_relu_gradients

__all__ = ["APGD", "FGSM", "OBJECTIVES", "PGD", "WORST", "Attack", "GaussianNoise", "Probe", "adaptive_attack",
           "apgd_checkpoints", "build_suite", "evaluate_attacks", "fgsm_attack", "gaussian_attack", "pgd_attack",
           "smooth_relu_gradients", "zero_gradient_mask"]
