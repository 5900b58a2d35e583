"""Alg 2 (`certified_exact`): one Newton step to the regularised Pareto optimum with the explicit Hessian
(Cholesky, float64; its exact spectrum gives lambda_min and ||H||), then Gaussian noise calibrated to the
step's sensitivity Delta (eq. `algo_exact_hessian_eq`)."""

from torch import nn

from ttp_lightning.certify.certificate import EXACT
from ttp_lightning.data.datamodule import TTPDataModule
from ttp_lightning.methods.certified.common import run_certified
from ttp_lightning.methods.output import MethodOutput
from ttp_lightning.training import RunContext


def run_certified_exact(ctx: RunContext, pretrained: nn.Module, datamodule: TTPDataModule, make_net) -> MethodOutput:
    return run_certified(ctx, pretrained, datamodule, EXACT)
