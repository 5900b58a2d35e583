"""Alg 2 (`certified_exact`): one Newton step to the regularised Pareto optimum with the explicit Hessian
(Cholesky, float64; its exact spectrum gives lambda_min and ||H||), then Gaussian noise calibrated to the
step's sensitivity Delta (eq. `algo_exact_hessian_eq`)."""

from ttp_lightning.certify.certificate import EXACT
from ttp_lightning.methods.certified.base import Certified


class CertifiedExact(Certified):
    """Alg 2: the exact Newton step (method=certified_exact)."""

    algorithm = EXACT
