"""Closed-form bounds of the paper: sensitivities Delta of the certified Newton steps, the uniformity bound
of Prop. `bound_on_pop_distance_between_output_and_unif` and the theta of Cor. `lambda_large`.

Lipschitz constants follow Assumptions 1-2 (per-instance gradients P_K/|D_f|- and P_A/|D_r|-Lipschitz,
Hessians F_K/|D_f|- and F_A/|D_r|-Lipschitz, under a sum over instances), which is the same as the dataset
means L_K and L_A that this code optimises having P_K-, P_A-Lipschitz gradients and F_K-, F_A-Lipschitz
Hessians. They are assumed, not measured (the paper treats them as hyperparameters, 1 by default); a
measured ||H|| can refute the P's (`lipschitz_hessian_bound`).
"""

import math

from ttp_lightning.core.errors import TTPUserError


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


def estimator_scale_b(theta: float, lam: float, grad_lipschitz_forget: float, grad_lipschitz_retain: float) -> float:
    """B, the largest norm of one sampled Hessian the estimator multiplies by, for the mean-normalised
    objective this code optimises: max{P_K + lambda / (2 theta), P_A + lambda / (2 (1 - theta))}.

    The paper writes B = max{(theta P_K + lambda) / |D_f|, ((1 - theta) P_A + lambda) / |D_r|} for a sum of
    per-instance losses whose gradients are P/|D|-Lipschitz (Assumption 1). The estimator is unbiased only
    for the mean objective: a forget sample is the Hessian of the mean forget loss on sampled instances
    (norm <= P_K) plus lambda I / (2 theta), a retain sample likewise with P_A and lambda I / (2 (1 - theta)),
    so that E[H_t] = H + lambda I. Dividing by |D_f| and |D_r| there makes B / (lambda + lambda_min) < 1 and
    the depth rule n >= 2 kappa ln(kappa b) collapse to n = 1 whatever the data; with this B it is the
    condition-number bound of Agarwal et al. (2017) for the samples the chains actually draw."""
    return max(grad_lipschitz_forget + lam / (2.0 * theta), grad_lipschitz_retain + lam / (2.0 * (1.0 - theta)))


def lipschitz_hessian_bound(theta: float, grad_lipschitz_forget: float, grad_lipschitz_retain: float) -> float:
    """theta P_K + (1 - theta) P_A: Assumption 1 bounds ||H|| of the Pareto objective by this everywhere, so a
    measured ||H|| above it refutes the stated constants."""
    return theta * grad_lipschitz_forget + (1.0 - theta) * grad_lipschitz_retain


def estimator_depth(scale_b: float, lam: float, lam_min: float, repeats: int) -> int:
    """Smallest n the bound allows: n >= 2 kappa ln(kappa b), kappa = B / (lambda + lambda_min) (at least 1)."""
    ratio = scale_b / (lam + lam_min)
    return max(1, math.ceil(2.0 * ratio * math.log(max(ratio * repeats, 1.0 + 1e-12))))


def hypothesis_violations(theta: float, lam: float, lam_min: float, hessian_norm: float,
                          grad_lipschitz_forget: float, grad_lipschitz_retain: float) -> list[str]:
    """What fails of the theorems' hypotheses for the measured lambda_min(H) (already min(stated, measured))
    and ||H||, each with its fix: the stated gradient Lipschitz constants are not refuted (||H|| <= theta P_K +
    (1 - theta) P_A), lambda + lambda_min > 0, and lambda > ||H||."""
    violations = []
    lipschitz = lipschitz_hessian_bound(theta, grad_lipschitz_forget, grad_lipschitz_retain)
    if hessian_norm > lipschitz * (1 + 1e-9):
        violations.append(
            f"the measured ||H|| = {hessian_norm:.4g} refutes the stated gradient Lipschitz constants: theta P_K + "
            f"(1 - theta) P_A = {lipschitz:.4g} must bound it (Assumption 1); raise method.grad_lipschitz_forget "
            f"and method.grad_lipschitz_retain to at least {hessian_norm:.4g} (e.g. {_round_up(hessian_norm)})")
    if lam + lam_min <= 0:
        violations.append(
            f"lambda + lambda_min(H) = {lam:.4g} + ({lam_min:.4g}) <= 0: H + lambda I is not positive definite, so "
            f"the Newton step and Delta are undefined; raise method.lam above {-lam_min:.4g}")
    elif not lam > hessian_norm:
        violations.append(
            f"method.lam={lam:.4g} is not above the measured ||H|| = {hessian_norm:.4g}, which the certified "
            f"theorems assume (lambda > ||H||); raise method.lam above {hessian_norm:.4g} (e.g. "
            f"{_round_up(hessian_norm)}, or lam=auto = theta P_K + (1 - theta) P_A)")
    return violations


def check_hypotheses(theta: float, lam: float, lam_min: float, hessian_norm: float, grad_lipschitz_forget: float,
                     grad_lipschitz_retain: float) -> None:
    """Raise TTPUserError with the first of `hypothesis_violations`, if any."""

    violations = hypothesis_violations(theta, lam, lam_min, hessian_norm, grad_lipschitz_forget,
                                       grad_lipschitz_retain)
    if violations:
        raise TTPUserError(violations[0])


def _round_up(value: float) -> float:
    """A round number above `value` for error messages (2 significant digits)."""
    magnitude = 10 ** math.floor(math.log10(max(value, 1e-12)) - 1)
    return round(math.floor(value / magnitude + 1) * magnitude, 12)
