"""Alg 3 (`certified_lissa`): the Newton step with the stochastic inverse-Hessian estimator of Thm.
`asymptotically_unbiased_estimator` (Hessian-vector products only, memory O(#params); lambda_min and ||H|| by
Lanczos), then Gaussian noise calibrated to eq. `hessian_estimator_bound`."""

from torch import nn

from ttp_lightning.certify.certificate import ESTIMATOR
from ttp_lightning.data.datamodule import TTPDataModule
from ttp_lightning.methods.certified.common import run_certified
from ttp_lightning.methods.output import MethodOutput
from ttp_lightning.training import RunContext


def run_certified_lissa(ctx: RunContext, pretrained: nn.Module, datamodule: TTPDataModule, make_net) -> MethodOutput:
    return run_certified(ctx, pretrained, datamodule, ESTIMATOR)
