"""What Algs 2-4 share: the Alg 1 warm-up, the retain-only BatchNorm statistics, the curvature of the
Pareto objective, the `auto` lambda, the Gaussian noise and the constants every certificate states."""

import copy
from dataclasses import dataclass, field

import torch
from omegaconf import DictConfig
from torch import nn

from ttp_lightning.certify.certificate import calibrated_sensitivity, recomputed_sensitivity
from ttp_lightning.certify.hvp import ParetoCurvature, refresh_batchnorm
from ttp_lightning.certify.mechanism import implied_epsilon, noise_sigma
from ttp_lightning.data.batching import ImageBatchDataset
from ttp_lightning.data.datamodule import TTPDataModule
from ttp_lightning.evaluation import eval_device
from ttp_lightning.methods.pareto import finetune
from ttp_lightning.modules.optim import project_to_norm_ball
from ttp_lightning.objectives import UNIFORMITY_LOSSES
from ttp_lightning.training import RunContext


def resolve_lam(cfg: DictConfig) -> float:
    """lambda, or for `auto` the App. "Eliminating Hyperparameters" choice theta P_K + (1 - theta) P_A."""
    if cfg.lam == "auto":
        return cfg.theta * cfg.grad_lipschitz_forget + (1.0 - cfg.theta) * cfg.grad_lipschitz_retain
    return float(cfg.lam)


@dataclass
class Prepared:
    """The model at the start of the Newton step(s) and what the warm-up produced."""

    net: nn.Module
    history: list = field(default_factory=list)
    warmup_wall_s: float = 0.0
    batchnorm_refreshed: bool = False


def warm_start(ctx: RunContext, pretrained: nn.Module, datamodule: TTPDataModule) -> Prepared:
    """A copy of A(D), after `method.warmup_epochs` of Alg 1 (projected back onto ||w|| <= C, which the
    bounds assume), with BatchNorm statistics recomputed on the retain set when `batchnorm_stats: retain`,
    on the device the Newton step runs on (a GPU when there is one, as for evaluation)."""
    cfg = ctx.cfg.method
    prepared = Prepared(copy.deepcopy(pretrained))
    if cfg.warmup_epochs:
        warm = finetune(ctx, prepared.net, datamodule, cfg, cfg.warmup_epochs, stopping=None)
        prepared = Prepared(warm.net, warm.history, warm.metrics["wall_s"])
        project_to_norm_ball(prepared.net, ctx.cfg.pretrain.norm_bound, ctx.cfg.pretrain.projection)
    prepared.net.to(eval_device())
    if cfg.batchnorm_stats == "retain":
        prepared.batchnorm_refreshed = refresh_batchnorm(prepared.net, datamodule.dataset("retain"), cfg.chunk_size)
    return prepared


def curvature(net: nn.Module, cfg: DictConfig, retain: ImageBatchDataset, forget: ImageBatchDataset,
              dtype: torch.dtype = torch.float32) -> ParetoCurvature:
    return ParetoCurvature(net, retain, forget, cfg.theta, UNIFORMITY_LOSSES[cfg.uniformity], lam=resolve_lam(cfg),
                           forget_temperature=cfg.forget_temperature, chunk_size=cfg.chunk_size, dtype=dtype)


def stated_constants(ctx: RunContext, algorithm: str) -> dict:
    """The hyperparameters a certificate states, before the measured ones are added."""
    cfg = ctx.cfg.method
    return {
        "algorithm": algorithm,
        "theta": float(cfg.theta), "lam": resolve_lam(cfg), "lam_min": float(cfg.lam_min),
        "norm_bound": float(ctx.cfg.pretrain.norm_bound), "uniformity": cfg.uniformity,
        "forget_temperature": float(cfg.forget_temperature),
        "hessian_lipschitz_forget": float(cfg.hessian_lipschitz_forget),
        "hessian_lipschitz_retain": float(cfg.hessian_lipschitz_retain),
        "grad_lipschitz_forget": float(cfg.grad_lipschitz_forget),
        "grad_lipschitz_retain": float(cfg.grad_lipschitz_retain),
        "delta": float(cfg.delta), "noise_seed": int(cfg.noise_seed), "warmup_epochs": int(cfg.warmup_epochs),
        "batchnorm_stats": cfg.batchnorm_stats,
    }


def calibrate_noise(cfg: DictConfig, certificate: dict) -> dict:
    """Delta from the certificate's constants, then sigma from the (epsilon, delta) budget, or the epsilon
    that a configured sigma implies; returns the certificate with these fields added."""
    sensitivity = recomputed_sensitivity(certificate)
    calibrated = calibrated_sensitivity(certificate, sensitivity)
    if cfg.sigma is None:
        sigma, mechanism = noise_sigma(calibrated, cfg.epsilon, cfg.delta)
        noise = {"sigma": sigma, "epsilon": float(cfg.epsilon), "mechanism": mechanism, "sigma_source": "budget"}
    else:
        epsilon, mechanism = implied_epsilon(calibrated, cfg.sigma, cfg.delta)
        noise = {"sigma": float(cfg.sigma), "epsilon": epsilon, "mechanism": mechanism, "sigma_source": "config"}
    return {**certificate, "sensitivity": sensitivity, **noise}


def release_noisy(curv: ParetoCurvature, weights: torch.Tensor, sigma: float, seed: int) -> nn.Module:
    """w- = w~ + N(0, sigma^2 I) written into the model's trainable parameters; the model back in fp32."""
    generator = torch.Generator().manual_seed(seed)
    curv.assign(weights + sigma * torch.randn(len(weights), generator=generator, dtype=weights.dtype).to(weights.device))
    return curv.net.float()


def noise_metrics(certificate: dict) -> dict:
    return {key: certificate[key] for key in ("sensitivity", "sigma", "epsilon", "mechanism")}
