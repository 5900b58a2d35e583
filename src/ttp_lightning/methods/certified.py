"""Alg 2 (`certified_exact`): optional Alg 1 warm-up, one Newton step to the regularised Pareto optimum
with the exact Hessian, then Gaussian noise calibrated to the step's sensitivity Delta."""

import copy
import time

import torch
from torch import nn

from ttp_lightning.certify.bounds import exact_newton_sensitivity
from ttp_lightning.certify.hessian import exact_hessian
from ttp_lightning.certify.hvp import ParetoCurvature, flatten, unflatten
from ttp_lightning.certify.mechanism import implied_epsilon, noise_sigma
from ttp_lightning.data.datamodule import TTPDataModule
from ttp_lightning.errors import TTPUserError
from ttp_lightning.methods.output import MethodOutput
from ttp_lightning.methods.pareto import finetune
from ttp_lightning.modules.optim import project_to_norm_ball
from ttp_lightning.objectives import UNIFORMITY_LOSSES
from ttp_lightning.training import RunContext


def _noise(cfg, sensitivity: float) -> dict:
    """sigma from the (epsilon, delta) budget, or the epsilon that a configured sigma implies."""
    if cfg.sigma is None:
        sigma, mechanism = noise_sigma(sensitivity, cfg.epsilon, cfg.delta)
        return {"sigma": sigma, "epsilon": float(cfg.epsilon), "mechanism": mechanism, "sigma_source": "budget"}
    epsilon, mechanism = implied_epsilon(sensitivity, cfg.sigma, cfg.delta)
    return {"sigma": float(cfg.sigma), "epsilon": epsilon, "mechanism": mechanism, "sigma_source": "config"}


def run_certified_exact(ctx: RunContext, pretrained: nn.Module, datamodule: TTPDataModule, make_net) -> MethodOutput:
    cfg, norm_bound = ctx.cfg.method, ctx.cfg.pretrain.norm_bound
    net = copy.deepcopy(pretrained)
    history, warmup_wall = [], 0.0
    if cfg.warmup_epochs:
        warm = finetune(ctx, net, datamodule, cfg, cfg.warmup_epochs, stopping=None)
        net, history, warmup_wall = warm.net, warm.history, warm.metrics["wall_s"]
        project_to_norm_ball(net, norm_bound, ctx.cfg.pretrain.projection)  # the bound assumes ||w*|| <= C

    start = time.perf_counter()
    curv = ParetoCurvature(net, datamodule.dataset("retain"), datamodule.dataset("forget"), cfg.theta,
                           UNIFORMITY_LOSSES[cfg.uniformity], lam=cfg.lam, forget_temperature=cfg.forget_temperature,
                           dtype=torch.float64)  # the exact solve in double precision; released as fp32
    hessian = exact_hessian(curv, cfg.max_exact_params)
    gradient = curv.gradient()
    factor, info = torch.linalg.cholesky_ex(hessian)
    if info.item() != 0:
        raise TTPUserError(f"H + lambda I is not positive definite at method.lam={cfg.lam} (the objective is not "
                           f"convex here); raise method.lam above -lambda_min(H)")
    step = torch.cholesky_solve(gradient[:, None], factor)[:, 0]
    residual = ((hessian @ step - gradient).norm() / gradient.norm().clamp(min=1e-30)).item()
    weights = flatten(p.detach() for p in curv.params)
    newton = weights - step

    sensitivity = exact_newton_sensitivity(norm_bound, cfg.theta, cfg.hessian_lipschitz_forget,
                                           cfg.hessian_lipschitz_retain, cfg.lam, cfg.lam_min)
    noise = _noise(cfg, sensitivity)
    generator = torch.Generator().manual_seed(int(cfg.noise_seed))
    released = newton + noise["sigma"] * torch.randn(len(newton), generator=generator).to(newton)
    with torch.no_grad():
        for param, value in zip(curv.params, unflatten(released, curv.params)):
            param.copy_(value)
    net = curv.net.float()

    certificate = {
        "algorithm": "alg2_exact_newton",
        "theta": float(cfg.theta), "lam": float(cfg.lam), "lam_min": float(cfg.lam_min),
        "norm_bound": float(norm_bound), "uniformity": cfg.uniformity,
        "forget_temperature": float(cfg.forget_temperature),
        "hessian_lipschitz_forget": float(cfg.hessian_lipschitz_forget),
        "hessian_lipschitz_retain": float(cfg.hessian_lipschitz_retain),
        "delta": float(cfg.delta), "sensitivity": sensitivity, **noise, "noise_seed": int(cfg.noise_seed),
        "warmup_epochs": int(cfg.warmup_epochs),
    }
    metrics = {
        "wall_s": round(warmup_wall + time.perf_counter() - start, 3),
        "warmup_wall_s": warmup_wall,
        "newton_residual": residual,
        "newton_step_norm": step.norm().item(),
        "gradient_norm": gradient.norm().item(),
        "weight_norm_before_step": weights.norm().item(),
        "sensitivity": sensitivity, "sigma": noise["sigma"], "epsilon": noise["epsilon"],
        "mechanism": noise["mechanism"],
    }
    return MethodOutput(net, metrics, history, certificate)
