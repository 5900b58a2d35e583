"""The deterministic, noise-free part of Algs 2-4: Newton step(s) from the start weights w*, each preceded by
a measurement of H's spectrum and a check of the theorems' hypotheses, each followed by the projection onto
the C-ball. `verify --audit` reruns exactly this from the provider's private start weights.

The projection Pi onto {||w|| <= C} (or the product of per-tensor balls) is new relative to the paper: it is
non-expansive and the target M_theta(D) lies in the ball (the bounds assume ||M_theta(D)|| <= C), so
||Pi(w~) - M_theta(D)|| <= ||w~ - M_theta(D)|| <= Delta and the certificate is unchanged, while the released
weights' norm becomes checkable (C plus the noise's norm).
"""

import copy
import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ttp_lightning.certified.maths.estimator import stochastic_inverse_hvp
from ttp_lightning.certified.maths.hessian import exact_hessian
from ttp_lightning.certified.maths.hvp import (
    ParetoCurvature,
    all_reduce,
    flatten,
    refresh_batchnorm,
    trainable,
    unflatten,
)
from ttp_lightning.certified.maths.spectrum import Spectrum, exact_spectrum, lanczos_spectrum
from ttp_lightning.core.batching import ImageBatchDataset
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.core.objectives import UNIFORMITY_LOSSES
from ttp_lightning.dp.noise import gaussian_noise
from ttp_lightning.dp.sensitivity import check_hypotheses, estimator_depth, estimator_scale_b

EXACT, ESTIMATED = "exact", "estimated"


@dataclass
class NewtonPath:
    """The noise-free weights after each step (float64, projected) and one certificate record per step."""

    noise_free: list[torch.Tensor] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    extras: list[dict] = field(default_factory=list)  # per step, for results.json only (not the certificate)


def resolve_lam(cfg) -> float:
    """lambda, or for `auto` the App. "Eliminating Hyperparameters" choice theta P_K + (1 - theta) P_A."""
    if cfg.lam == "auto":
        return cfg.theta * cfg.grad_lipschitz_forget + (1.0 - cfg.theta) * cfg.grad_lipschitz_retain
    return float(cfg.lam)


def curvature(net, cfg, retain: ImageBatchDataset, forget: ImageBatchDataset,
              dtype: torch.dtype = torch.float32, sharded: bool = False) -> ParetoCurvature:
    return ParetoCurvature(net, retain, forget, cfg.theta, UNIFORMITY_LOSSES[cfg.uniformity], lam=resolve_lam(cfg),
                           forget_temperature=cfg.forget_temperature, chunk_size=cfg.chunk_size, dtype=dtype,
                           sharded=sharded)


def project_flat(vector: torch.Tensor, sizes: list[int], bound: float, mode: str) -> torch.Tensor:
    """The projection onto ||w||_2 <= bound (global) or onto each tensor's own ball (per_tensor)."""
    if mode == "global":
        norm = vector.norm()
        return vector * (bound / norm) if norm > bound else vector
    parts = [part * (bound / part.norm()) if part.norm() > bound else part for part in vector.split(sizes)]
    return torch.cat(parts)


def lam_min_for_delta(cfg, spectrum: Spectrum) -> float:
    """Delta uses min(stated, measured) lambda_min."""
    return min(float(cfg.lam_min), spectrum.lam_min)


def _checked(cfg, curv: ParetoCurvature, spectrum: Spectrum) -> float:
    lam_min = lam_min_for_delta(cfg, spectrum)
    check_hypotheses(curv.theta, curv.lam, lam_min, spectrum.norm, cfg.grad_lipschitz_forget,
                     cfg.grad_lipschitz_retain)
    return lam_min


def _record(curv: ParetoCurvature, gradient: torch.Tensor, direction: torch.Tensor, residual: float,
            spectrum: Spectrum, scale=None, depth=None) -> dict:
    return {"forget_size": len(curv.forget), "retain_size": len(curv.retain),
            "gradient_norm": gradient.norm().item(), "residual": residual,
            "lam_min_measured": spectrum.lam_min, "hessian_norm_measured": spectrum.norm,
            "ritz_min": spectrum.ritz_min, "ritz_max": spectrum.ritz_max, "spectrum_method": spectrum.method,
            "lanczos_iterations": spectrum.iterations, "spectrum_margin": spectrum.margin,
            "scale": scale, "depth": depth, "step_norm": direction.norm().item()}


def cholesky_direction(curv: ParetoCurvature, hessian: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(H + lambda I)^{-1} grad by Cholesky on the explicit H + lambda I: (direction, gradient, residual)."""
    gradient = curv.gradient()
    factor, info = torch.linalg.cholesky_ex(hessian)
    if info.item() != 0:
        raise TTPUserError(f"H + lambda I is not positive definite at method.lam={curv.lam} (Cholesky failed); "
                           f"raise method.lam")
    direction = torch.cholesky_solve(gradient[:, None], factor)[:, 0]
    residual = ((hessian @ direction - gradient).norm() / gradient.norm().clamp(min=1e-30)).item()
    return direction, gradient, residual


def exact_step(curv: ParetoCurvature, cfg) -> tuple[torch.Tensor, dict]:
    """Alg 2: the Cholesky solve on the explicit Hessian, after its exact spectrum and the hypotheses."""
    hessian = exact_hessian(curv, cfg.max_exact_params)
    spectrum = exact_spectrum(hessian, shift=curv.lam)
    _checked(cfg, curv, spectrum)
    direction, gradient, residual = cholesky_direction(curv, hessian)
    return direction, _record(curv, gradient, direction, residual, spectrum)


def measured_spectrum(curv: ParetoCurvature, cfg, generator: torch.Generator) -> Spectrum:
    """Algs 3-4: Lanczos on H (full-data HVPs without the lambda I term)."""
    size = sum(p.numel() for p in curv.params)
    return lanczos_spectrum(lambda v: curv.hvp(v) - curv.lam * v, size, cfg.lanczos_iterations,
                            cfg.spectrum_margin, generator, curv.device, curv.dtype)


def estimated_step(curv: ParetoCurvature, cfg, generator: torch.Generator) -> tuple[torch.Tensor, dict]:
    """Algs 3-4: P_n / J from the stochastic inverse-Hessian estimator, with J >= B (the largest sampled
    Hessian's norm under the stated constants) and n at least what the bound requires; refuses a
    direction whose residual ||(H + lambda I) p - grad|| / ||grad|| is above `max_residual` (the chain ran on
    an indefinite H + lambda I, or too few samples: releasing it would only damage the model)."""
    spectrum = measured_spectrum(curv, cfg, generator)
    lam_min = _checked(cfg, curv, spectrum)
    bound_b = estimator_scale_b(curv.theta, curv.lam, cfg.grad_lipschitz_forget, cfg.grad_lipschitz_retain)
    if cfg.scale is None:
        scale = max(bound_b, cfg.scale_margin * (spectrum.norm + curv.lam))
    elif float(cfg.scale) < bound_b:
        raise TTPUserError(f"method.scale={cfg.scale} (J) is below B = {bound_b:.4g}, the largest norm of a sampled "
                           f"Hessian under the stated constants, which the estimator bound needs; use "
                           f"method.scale=null (J = max(B, scale_margin (||H|| + lambda))) or a value >= B")
    else:
        scale = float(cfg.scale)
    needed = estimator_depth(bound_b, curv.lam, lam_min, cfg.repeats)
    if cfg.depth == "auto":
        depth = needed
    elif int(cfg.depth) < needed:
        raise TTPUserError(f"method.depth={cfg.depth} is below n = {needed}, the least the estimator bound allows "
                           f"(2 kappa ln(kappa b), kappa = B / (lambda + lambda_min) = "
                           f"{bound_b / (curv.lam + lam_min):.4g}); use method.depth=auto or a value >= {needed}")
    else:
        depth = int(cfg.depth)
    gradient = curv.gradient()
    rank, world = (dist.get_rank(), dist.get_world_size()) if curv.sharded else (0, 1)
    direction = stochastic_inverse_hvp(
        gradient, lambda part, v, keep: curv.sample_hvp(part, v, cfg.sample_size, generator, keep), curv.theta,
        curv.lam, scale, depth, cfg.repeats, generator, rank=rank, world=world, reduce=all_reduce)
    residual = ((curv.hvp(direction) - gradient).norm() / gradient.norm().clamp(min=1e-30)).item()
    if not residual <= cfg.max_residual:
        raise TTPUserError(
            f"the estimated Newton direction has relative residual {residual:.3g} > method.max_residual="
            f"{cfg.max_residual}; nothing was released. Raise method.repeats, method.sample_size or method.depth "
            f"(or method.lam, now {curv.lam})")
    return direction, _record(curv, gradient, direction, residual, spectrum, scale, depth)


def distance_to_exact(curv: ParetoCurvature, cfg, direction: torch.Tensor) -> float:
    """||p - p_exact|| / ||p_exact||, p_exact the Cholesky solve of Alg 2 on a float64 copy of the model."""
    exact_curv = ParetoCurvature(copy.deepcopy(curv.net), curv.retain, curv.forget, curv.theta, curv.uniformity,
                                 lam=curv.lam, forget_temperature=curv.forget_temperature,
                                 chunk_size=curv.chunk_size, dtype=torch.float64)
    exact, _, _ = cholesky_direction(exact_curv, exact_hessian(exact_curv, cfg.max_exact_params))
    return ((direction.double().cpu() - exact.cpu()).norm() / exact.norm().clamp(min=1e-30)).item()


def step_generator(cfg, kind: str) -> torch.Generator | None:
    """The estimator's random stream (the same on every DDP rank), or None for the exact step."""
    return torch.Generator().manual_seed(int(cfg.estimator_seed)) if kind == ESTIMATED else None


def newton_step(curv: ParetoCurvature, cfg, kind: str, generator: torch.Generator | None,
                norm_bound: float, projection: str, path: NewtonPath) -> None:
    """One step of Algs 2-4 from the curvature's current weights: the direction, w~ = Pi(w - direction) (float64)
    written back into the model and appended to `path` with its certificate record."""
    weights = flatten(p.detach() for p in curv.params).double()
    if kind == EXACT:
        direction, record = exact_step(curv, cfg)
        extras = {}
    else:
        direction, record = estimated_step(curv, cfg, generator)
        extras = {"direction_vs_exact": distance_to_exact(curv, cfg, direction)} if cfg.compare_exact else {}
    unprojected = weights - direction.double().to(weights.device)
    record["norm_before_projection"] = unprojected.norm().item()
    projected = project_flat(unprojected, [p.numel() for p in curv.params], norm_bound, projection)
    curv.assign(projected.to(curv.dtype))
    path.noise_free.append(projected.cpu())
    path.steps.append(record)
    path.extras.append(extras)


def step_dtype(kind: str) -> torch.dtype:
    return torch.float64 if kind == EXACT else torch.float32


def newton_path(net, parts: list[tuple[ImageBatchDataset, ImageBatchDataset]], cfg, kind: str,
                norm_bound: float, projection: str) -> NewtonPath:
    """One step per (retain, forget) part in this process (the audit's rerun; a run takes them through
    CertifiedStepModule), each from the previous step's projected weights (Alg 4's
    w~_i = Pi(w~_{i-1} - P_n / J)); Alg 2 and 3 have one part. The model ends at the last noise-free weights
    (float32 for the estimator, float64 for the exact step)."""
    path = NewtonPath()
    generator = step_generator(cfg, kind)
    for retain, forget in parts:
        newton_step(curvature(net, cfg, retain, forget, dtype=step_dtype(kind)), cfg, kind, generator, norm_bound,
                    projection, path)
    return path


def noised_states(net, noise_free: list[torch.Tensor], sigma: float, seed: str,
                  retain_sets: list[ImageBatchDataset], chunk_size: int) -> list[dict]:
    """The released state_dicts: w- = fp32(w~_i + sigma N_i) (float64 sum, N_i stream i of the secret seed's
    noise), then BatchNorm statistics recomputed on D_r from those noised weights (post-processing: the
    buffers see the released weights and D_r only)."""
    net = net.float()
    params = trainable(net)
    states = []
    for stream, (weights, retain) in enumerate(zip(noise_free, retain_sets, strict=True)):
        noisy = (weights.double().cpu() + sigma * gaussian_noise(seed, len(weights), stream)).float()
        if not math.isfinite(noisy.abs().max().item()):
            raise TTPUserError(f"sigma={sigma:.4g} overflows float32 weights; choose a larger method.epsilon")
        with torch.no_grad():
            for param, value in zip(params, unflatten(noisy, params)):
                param.copy_(value.to(param.device))
        refresh_batchnorm(net, retain, chunk_size)
        states.append({k: v.detach().cpu().clone() for k, v in net.state_dict().items()})
    return states
