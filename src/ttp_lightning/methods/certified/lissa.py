"""Alg 3 (`certified_lissa`): the Newton step with the stochastic inverse-Hessian estimator of Thm.
`asymptotically_unbiased_estimator` (Hessian-vector products only, memory O(#params)), then Gaussian noise
calibrated to eq. `hessian_estimator_bound`."""

import copy
import time

import torch
from omegaconf import DictConfig
from torch import nn

from ttp_lightning.certify.bounds import estimator_depth, estimator_scale_b
from ttp_lightning.certify.certificate import ESTIMATOR
from ttp_lightning.certify.estimator import power_iteration, stochastic_inverse_hvp
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
from ttp_lightning.methods.certified.exact import exact_newton_step
from ttp_lightning.methods.output import MethodOutput
from ttp_lightning.training import RunContext


def estimated_newton_direction(curv: ParetoCurvature, cfg: DictConfig, generator: torch.Generator) -> dict:
    """P_n / J for the current weights, with what it took: J (given, or `scale_margin` times (a power-iteration
    estimate of ||H|| + lambda), an estimate of the bound ||H + lambda I|| <= ||H|| + lambda), n (given, or `auto`: the least the bound allows), the gradient and the
    direction's relative residual ||(H + lambda I) p - grad|| / ||grad|| under full-data HVPs. A residual
    above `max_residual` stops the run: such a step is no Newton step (the chain ran on an indefinite
    H + lambda I, or too few samples), and releasing it would only damage the model."""
    gradient = curv.gradient()
    norm_estimate = None
    if cfg.scale is None:  # ||H + lambda I|| <= ||H|| + lambda; iterating on H itself also converges faster
        norm_estimate = power_iteration(lambda v: curv.hvp(v) - curv.lam * v, len(gradient), cfg.power_iterations,
                                        generator, curv.device)
        scale = cfg.scale_margin * (norm_estimate + curv.lam)
    else:
        scale = float(cfg.scale)
    if cfg.depth == "auto":
        bound_b = estimator_scale_b(curv.theta, curv.lam, cfg.grad_lipschitz_forget, cfg.grad_lipschitz_retain,
                                    len(curv.forget), len(curv.retain))
        depth = estimator_depth(bound_b, curv.lam, cfg.lam_min, cfg.repeats)
    else:
        depth = int(cfg.depth)
    direction = stochastic_inverse_hvp(
        gradient, lambda part, v: curv.sample_hvp(part, v, cfg.sample_size, generator), curv.theta, curv.lam,
        scale, depth, cfg.repeats, generator)
    residual = ((curv.hvp(direction) - gradient).norm() / gradient.norm().clamp(min=1e-30)).item()
    if not residual <= cfg.max_residual:
        raise TTPUserError(
            f"the estimated Newton direction has relative residual {residual:.3g} > method.max_residual="
            f"{cfg.max_residual}; nothing was released. H + lambda I may be indefinite here (raise method.lam, "
            f"now {curv.lam}), or the estimate too noisy (raise method.repeats, method.sample_size or method.depth)")
    return {"direction": direction, "gradient": gradient, "scale": scale, "depth": depth,
            "hessian_norm_estimate": norm_estimate, "residual": residual}


def estimator_constants(cfg: DictConfig, curv: ParetoCurvature, steps: list[dict]) -> dict:
    """The estimator's part of a certificate, over one Newton step (Alg 3) or several (Alg 4)."""
    return {
        "scale": [s["scale"] for s in steps] if len(steps) > 1 else steps[0]["scale"],
        "depth": min(s["depth"] for s in steps), "repeats": int(cfg.repeats), "sample_size": int(cfg.sample_size),
        "rho": float(cfg.rho),
        "zeta_min": curv.lam + float(cfg.lam_min) if cfg.zeta_min == "auto" else float(cfg.zeta_min),
        "gradient_bound": max(s["gradient"].norm().item() for s in steps),
        "num_params": sum(p.numel() for p in curv.params), "estimator_seed": int(cfg.estimator_seed),
    }


def distance_to_exact(net: nn.Module, cfg: DictConfig, curv: ParetoCurvature, direction: torch.Tensor) -> float:
    """||p - p_exact|| / ||p_exact||, p_exact the Cholesky solve of Alg 2 on a float64 copy of the model."""
    exact_curv = ParetoCurvature(copy.deepcopy(net), curv.retain, curv.forget, curv.theta, curv.uniformity,
                                 lam=curv.lam, forget_temperature=curv.forget_temperature,
                                 chunk_size=curv.chunk_size, dtype=torch.float64)
    exact, _, _ = exact_newton_step(exact_curv, cfg.max_exact_params)
    return ((direction.double().cpu() - exact.cpu()).norm() / exact.norm().clamp(min=1e-30)).item()


def run_certified_lissa(ctx: RunContext, pretrained: nn.Module, datamodule: TTPDataModule, make_net) -> MethodOutput:
    cfg = ctx.cfg.method
    prepared = warm_start(ctx, pretrained, datamodule)
    start = time.perf_counter()
    curv = curvature(prepared.net, cfg, datamodule.dataset("retain"), datamodule.dataset("forget"))
    generator = torch.Generator().manual_seed(int(cfg.estimator_seed))
    step = estimated_newton_direction(curv, cfg, generator)
    estimate_wall = time.perf_counter() - start
    comparison = {}
    if cfg.compare_exact:
        comparison["direction_vs_exact"] = distance_to_exact(prepared.net, cfg, curv, step["direction"])
    weights = flatten(p.detach() for p in curv.params)
    certificate = {**stated_constants(ctx, ESTIMATOR), **estimator_constants(cfg, curv, [step]),
                   "forget_sizes": [len(curv.forget)], "retain_sizes": [len(curv.retain)]}
    certificate = calibrate_noise(cfg, certificate)
    net = release_noisy(curv, weights - step["direction"].to(weights), certificate["sigma"], certificate["noise_seed"])
    metrics = {
        "wall_s": round(prepared.warmup_wall_s + estimate_wall, 3),
        "warmup_wall_s": prepared.warmup_wall_s,
        "estimator_wall_s": round(estimate_wall, 3),
        "newton_residual": step["residual"],
        "newton_step_norm": step["direction"].norm().item(),
        "gradient_norm": step["gradient"].norm().item(),
        "weight_norm_before_step": weights.norm().item(),
        "scale_J": step["scale"], "depth_n": step["depth"], "repeats_b": int(cfg.repeats),
        "hessian_norm_estimate": step["hessian_norm_estimate"],
        "batchnorm_refreshed": prepared.batchnorm_refreshed,
        **comparison,
        **noise_metrics(certificate),
    }
    return MethodOutput(net, metrics, prepared.history, certificate)
