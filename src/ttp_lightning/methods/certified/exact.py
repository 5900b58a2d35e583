"""Alg 2 (`certified_exact`): one Newton step to the regularised Pareto optimum with the explicit Hessian
(Cholesky, float64), then Gaussian noise calibrated to the step's sensitivity Delta."""

import time

import torch
from torch import nn

from ttp_lightning.certify.certificate import EXACT
from ttp_lightning.certify.hessian import exact_hessian
from ttp_lightning.certify.hvp import ParetoCurvature, flatten
from ttp_lightning.data.datamodule import TTPDataModule
from ttp_lightning.errors import TTPUserError
from ttp_lightning.methods.certified.common import (
    calibrate_noise,
    curvature,
    noise_metrics,
    release_noisy,
    stated_constants,
    warm_start,
)
from ttp_lightning.methods.output import MethodOutput
from ttp_lightning.training import RunContext


def exact_newton_step(curv: ParetoCurvature, max_params: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(H + lambda I)^{-1} grad by Cholesky; returns (step, gradient, relative residual)."""
    hessian = exact_hessian(curv, max_params)
    gradient = curv.gradient()
    factor, info = torch.linalg.cholesky_ex(hessian)
    if info.item() != 0:
        raise TTPUserError(f"H + lambda I is not positive definite at method.lam={curv.lam} (the objective is not "
                           f"convex here); raise method.lam above -lambda_min(H)")
    step = torch.cholesky_solve(gradient[:, None], factor)[:, 0]
    residual = ((hessian @ step - gradient).norm() / gradient.norm().clamp(min=1e-30)).item()
    return step, gradient, residual


def run_certified_exact(ctx: RunContext, pretrained: nn.Module, datamodule: TTPDataModule, make_net) -> MethodOutput:
    cfg = ctx.cfg.method
    prepared = warm_start(ctx, pretrained, datamodule)
    start = time.perf_counter()
    curv = curvature(prepared.net, cfg, datamodule.dataset("retain"), datamodule.dataset("forget"),
                     dtype=torch.float64)  # the exact solve in double precision; released as fp32
    step, gradient, residual = exact_newton_step(curv, cfg.max_exact_params)
    weights = flatten(p.detach() for p in curv.params)
    certificate = calibrate_noise(cfg, stated_constants(ctx, EXACT))
    net = release_noisy(curv, weights - step, certificate["sigma"], certificate["noise_seed"])
    metrics = {
        "wall_s": round(prepared.warmup_wall_s + time.perf_counter() - start, 3),
        "warmup_wall_s": prepared.warmup_wall_s,
        "newton_residual": residual,
        "newton_step_norm": step.norm().item(),
        "gradient_norm": gradient.norm().item(),
        "weight_norm_before_step": weights.norm().item(),
        "batchnorm_refreshed": prepared.batchnorm_refreshed,
        **noise_metrics(certificate),
    }
    return MethodOutput(net, metrics, prepared.history, certificate)
