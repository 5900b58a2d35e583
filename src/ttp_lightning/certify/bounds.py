"""Closed-form bounds of the paper: sensitivities Delta of the certified Newton steps, the uniformity bound
of Prop. `bound_on_pop_distance_between_output_and_unif` and the theta of Cor. `lambda_large`.

Lipschitz constants follow Assumptions 1-2: gradients of the per-instance losses are P_K/|D_f|- and
P_A/|D_r|-Lipschitz, their Hessians F_K/|D_f|- and F_A/|D_r|-Lipschitz (the paper treats them as
hyperparameters, 1 by default).
"""

import math


def uniformity_bound(theta: float, retain_size: int, num_classes: int) -> float:
    """Prop.: ||f_{M_theta}(D_f) - uniform||_inf <= sqrt(2 (1 - theta) / theta |D_r| ln K)."""
    return math.sqrt(2.0 * (1.0 - theta) / theta * retain_size * math.log(num_classes))


def theta_lower_bound(epsilon: float, retain_size: int, num_classes: int) -> float:
    """Cor.: theta >= 2 |D_r| ln K / (epsilon^2 + 2 |D_r| ln K) guarantees the uniformity bound epsilon."""
    scaled = 2.0 * retain_size * math.log(num_classes)
    return scaled / (epsilon**2 + scaled)


def exact_newton_sensitivity(norm_bound: float, theta: float, hessian_lipschitz_forget: float,
                             hessian_lipschitz_retain: float, lam: float, lam_min: float = 0.0) -> float:
    """Eq. `algo_exact_hessian_eq` (Alg 2): 2 C ((theta F_K + (1 - theta) F_A) C + lambda) / (lambda + lambda_min)."""
    mixed = theta * hessian_lipschitz_forget + (1.0 - theta) * hessian_lipschitz_retain
    return 2.0 * norm_bound * (mixed * norm_bound + lam) / (lam + lam_min)


def estimator_scale_b(theta: float, lam: float, grad_lipschitz_forget: float, grad_lipschitz_retain: float,
                      forget_size: int, retain_size: int) -> float:
    """B = max{(theta P_K + lambda) / |D_f|, ((1 - theta) P_A + lambda) / |D_r|}."""
    return max((theta * grad_lipschitz_forget + lam) / forget_size,
               ((1.0 - theta) * grad_lipschitz_retain + lam) / retain_size)


def estimator_depth(scale_b: float, lam: float, lam_min: float, repeats: int) -> int:
    """Smallest n the bound allows: n >= 2 B / (lambda + lambda_min) ln(B / (lambda + lambda_min) b)."""
    ratio = scale_b / (lam + lam_min)
    return max(1, math.ceil(2.0 * ratio * math.log(max(ratio * repeats, 1.0 + 1e-12))))


def estimator_sensitivity(norm_bound: float, theta: float, hessian_lipschitz_forget: float,
                          hessian_lipschitz_retain: float, grad_lipschitz_forget: float,
                          grad_lipschitz_retain: float, lam: float, lam_min: float, grad_norm: float,
                          scale_b: float, zeta_min: float, dimension: int, rho: float, repeats: int) -> float:
    """Eq. `hessian_estimator_bound` (Algs 3, 4), holding with probability at least 1 - rho."""
    mixed_f = theta * hessian_lipschitz_forget + (1.0 - theta) * hessian_lipschitz_retain
    mixed_p = theta * grad_lipschitz_forget + (1.0 - theta) * grad_lipschitz_retain
    newton = (2.0 * norm_bound * (mixed_f * norm_bound + lam) + grad_norm) / (lam + lam_min)
    concentration = 16.0 * scale_b / zeta_min * math.sqrt(math.log(dimension / rho) / repeats) + 1.0 / 16.0
    return newton + concentration * (2.0 * norm_bound * mixed_p + grad_norm)
