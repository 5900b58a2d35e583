"""The arithmetic of a certificate's bound, from its own fields: how many releases compose, the estimator's
depth and scale, each step's distance bound or the paper's sensitivity, Delta, the released norm a genuine
release stays within, and when a certificate guarantees nothing meaningful. Used by the run that writes a
certificate and by the checks that read one (checks.py), so that both compute the same numbers."""

import math

from ttp_lightning.certified.certificate.format import ALGORITHMS
from ttp_lightning.certified.maths.residual import (
    capped_paper_sensitivity,
    distance_bound,
    estimator_error_bound,
)
from ttp_lightning.dp.noise import noise_norm_bound
from ttp_lightning.dp.sensitivity import estimator_depth, estimator_scale_b, exact_newton_sensitivity

EXACT, ESTIMATOR, ONLINE = ALGORITHMS  # Algs 2, 3, 4
RELATIVE_TOLERANCE = 1e-6
NOISE_NORM_FAILURE = 1e-9   # the released-norm check fails a genuine release with at most this probability
DEFAULT_VACUOUS_ABOVE = 10.0


def composed_releases(cert: dict) -> int:
    """How many noised releases the (epsilon, delta) statement covers together."""
    return len(cert["steps"]) if cert["release_model"] == "each" else 1


def scale_b(cert: dict) -> float:
    return estimator_scale_b(cert["theta"], cert["lam"], cert["grad_lipschitz_forget"], cert["grad_lipschitz_retain"])


def required_depth(cert: dict, step: dict) -> int:
    """The n the bound requires of one Newton step: kappa = B / (lambda + lambda_min) with that step's
    lambda_min (min of the stated and the one measured at that step's start)."""
    lam_min = min(cert["lam_min_stated"], step["lam_min_measured"])
    return estimator_depth(scale_b(cert), cert["lam"], lam_min, cert["estimator"]["repeats"])


def step_distance_bound(cert: dict, step: dict) -> float:
    """bound=residual: one step's ||w~ - M_theta(D)|| bound from its stated measurements."""
    return distance_bound(step["stationarity"] + step["rounding_floor"], cert["mu"], step["multiplier"],
                          step["weights_norm"], cert["norm_bound"])


def paper_step_sensitivity(cert: dict, step: dict) -> float:
    """bound=paper, one step: eq. `algo_exact_hessian_eq`, plus for the estimator (Algs 3-4) the measured
    residual's share ||(H + lambda I) p - g|| / (lambda + lambda_min) (deterministic; in place of the estimator
    lemma's probability-(1 - rho) term)."""
    lam_min = min(cert["lam_min_stated"], step["lam_min_measured"])
    exact = exact_newton_sensitivity(cert["norm_bound"], cert["theta"], cert["hessian_lipschitz_forget"],
                                     cert["hessian_lipschitz_retain"], cert["lam"], lam_min)
    if cert["algorithm"] == EXACT:
        return exact
    return exact + estimator_error_bound(step["residual"], step["gradient_norm"], cert["lam"], lam_min)


def recomputed_sensitivity(cert: dict) -> tuple[float, float | None]:
    """(Delta, the paper formula's uncapped value or None): the largest per-step bound over the steps whose
    noise-free weights are released (all of them, or the last for Alg 4's final release). bound=paper caps
    the formula at 2C, the ball's diameter."""
    steps = cert["steps"] if cert["release_model"] != "final" else cert["steps"][-1:]
    if cert["bound"] == "residual":
        return max(step_distance_bound(cert, step) for step in steps), None
    formula = max(paper_step_sensitivity(cert, step) for step in steps)
    return capped_paper_sensitivity(formula, cert["norm_bound"]), formula


def implied_global_norm_bound(norm_bound: float, projection: str, num_tensors: int) -> float:
    """The bound on the global ||w||_2 that the pretraining projection implies: C, or C sqrt(#tensors) when
    each tensor is projected on its own."""
    return norm_bound if projection == "global" else norm_bound * math.sqrt(num_tensors)


def relatively_close(a: float, b: float, tolerance: float = RELATIVE_TOLERANCE) -> bool:
    return abs(a - b) <= tolerance * max(abs(a), abs(b), 1e-300)


def released_norm_limit(cert: dict) -> float:
    """||w|| of a genuine release is at most C plus this bound on the noise's norm (prob. 1 - 1e-9)."""
    return (cert["norm_bound"] + noise_norm_bound(cert["sigma"], cert["num_params"], NOISE_NORM_FAILURE)) * (1 + 1e-6)


def is_vacuous(epsilon: float, threshold: float = DEFAULT_VACUOUS_ABOVE) -> bool:
    return not epsilon <= threshold


def training_set_size(cert: dict) -> int:
    """n = |D|, the records the (epsilon, delta) statement protects: the forget plus the retain set of a step
    (the same for every step; Alg 4 moves instances from one to the other)."""
    return max(int(step["forget_size"]) + int(step["retain_size"]) for step in cert["steps"])


def delta_allowed(delta: float, n: int) -> bool:
    """delta < 1/n, the standard requirement: a mechanism that publishes one of n records at random is
    (0, 1/n)-differentially private, so a delta of 1/n or more can be met while leaking a whole record."""
    return 0.0 < delta < 1.0 / n
