"""Alg 3 (`certified_lissa`): the Newton step with the stochastic inverse-Hessian estimator of Thm.
`asymptotically_unbiased_estimator` (Hessian-vector products only, memory O(#params); lambda_min and ||H|| by
Lanczos), then Gaussian noise calibrated to eq. `hessian_estimator_bound`."""

from ttp_lightning.certify.certificate import ESTIMATOR
from ttp_lightning.methods.certified.base import Certified


class CertifiedLissa(Certified):
    """Alg 3: the Newton step by the stochastic inverse-Hessian estimator (method=certified_lissa)."""

    algorithm = ESTIMATOR
