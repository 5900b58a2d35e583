"""The a-posteriori certificate (`method.bound=residual`): how far a computed point can be from the exact
regularised Pareto optimum, from its measured gradient alone.

M_theta(D) = argmin_{||w|| <= C} F(w), F(w) = theta L_K(w) + (1 - theta) L_A(w) + lambda / 2 ||w||^2 (dataset
means, as everywhere in this code). If F is mu-strongly convex, then for any w with ||w|| <= C and any
nu >= 0, with r = grad F(w) + nu w and d = ||w - M_theta(D)||:

    mu d^2 <= <grad F(w) - grad F(w*), w - w*>          (strong convexity)
           <= <grad F(w), w - w*>                       (optimality of w*: <grad F(w*), w - w*> >= 0)
           =  <r, w - w*> - nu <w, w - w*>
           <= ||r|| d + nu ||w|| (C - ||w||)            (<w, w*> <= ||w|| C since ||w*|| <= C)

so d <= (||r|| + sqrt(||r||^2 + 4 mu nu ||w|| (C - ||w||))) / (2 mu). nu is chosen to make ||r|| small: the
KKT multiplier estimate max(0, -<grad F(w), w> / ||w||^2) (0 inside the ball, where the bound is ||grad F|| /
mu). Nothing about how w was found enters: the bound is checked on the point itself (Guo et al. 2020,
"Certified Data Removal", use the same gradient-residual argument for strongly convex losses).

mu: with cross-entropy and the reverse-KL uniformity loss KL(u || p) = logsumexp(z) - mean(z) - log K, both
convex in the logits, and logits linear in the certified weights (logistic regression, or the last layer on
frozen features) the unregularised part is convex and mu = lambda exactly. With the square or forward-KL
uniformity loss the forget part is not convex; Assumption 1 (||Hessian of L_K|| <= P_K) gives
mu = lambda - theta P_K, which rests on that assumed constant.

A worst-image reduction of the forget losses (reductions.py: smoothmax, cvar) keeps both rules: it is convex and
nondecreasing in each loss, so it keeps convex losses convex (rule convex_reduction_linear_logits), and its
Hessian is sum_i q_i H_i (q >= 0, sum 1) plus a positive semidefinite term, so Assumption 1 still bounds the
negative curvature by theta P_K. A reduction that is not convex (Reduction.problems) has no rule.
"""

import math

import torch

from ttp_lightning.certified.maths.reductions import MEAN, Reduction

UNIT_ROUNDOFF = 2.0**-53  # float64
EXACT, CONVEX_REDUCTION, ASSUMPTION_1 = "convex_losses_linear_logits", "convex_reduction_linear_logits", "assumption_1"
MU_RULES = (EXACT, CONVEX_REDUCTION, ASSUMPTION_1)
CONVEX_UNIFORMITY = ("reverse_kl",)


class NotConvex(ValueError):
    """A forget reduction that is not a convex, smooth function of the losses: no rule gives mu."""


def strong_convexity(uniformity: str, lam: float, theta: float, grad_lipschitz_forget: float,
                     reduction: Reduction = MEAN) -> tuple[float, str]:
    """(mu, rule): lambda for convex losses on logits linear in the weights (reduced by their mean, or by a
    convex nondecreasing reduction), else lambda - theta P_K. Raises NotConvex for a reduction with problems."""
    problems = reduction.problems()
    if problems:
        raise NotConvex(problems[0])
    if uniformity in CONVEX_UNIFORMITY:
        return lam, EXACT if reduction.name == "mean" else CONVEX_REDUCTION
    return lam - theta * grad_lipschitz_forget, ASSUMPTION_1


def ball_multiplier(gradient: torch.Tensor, weights: torch.Tensor) -> float:
    """nu = max(0, -<g, w> / ||w||^2): the multiplier that makes g + nu w smallest (0 for w = 0)."""
    norm_sq = weights.dot(weights).item()
    return 0.0 if norm_sq == 0.0 else max(0.0, -gradient.dot(weights).item() / norm_sq)


def rounding_floor(absolute_gradient_norm: float, terms: int) -> float:
    """A bound on float64 rounding in a gradient that sums `terms` products per coordinate: Higham's
    gamma_n = n u / (1 - n u) times the norm of the gradient of absolute values, doubled for the elementwise
    losses' own rounding."""
    gamma = terms * UNIT_ROUNDOFF / (1.0 - terms * UNIT_ROUNDOFF)
    return 2.0 * gamma * absolute_gradient_norm


def distance_bound(stationarity: float, mu: float, multiplier: float, weights_norm: float, norm_bound: float) -> float:
    """d <= (||r|| + sqrt(||r||^2 + 4 mu nu ||w|| (C - ||w||))) / (2 mu) (module docstring); needs mu > 0,
    ||w|| <= C, nu >= 0 and ||r|| >= 0."""
    if not (mu > 0 and multiplier >= 0 and stationarity >= 0 and 0 <= weights_norm <= norm_bound):
        raise ValueError(f"the residual bound needs mu > 0, nu >= 0, ||r|| >= 0 and ||w|| <= C (mu={mu}, "
                         f"nu={multiplier}, ||r||={stationarity}, ||w||={weights_norm}, C={norm_bound})")
    slack = multiplier * weights_norm * (norm_bound - weights_norm)
    return (stationarity + math.sqrt(stationarity**2 + 4.0 * mu * slack)) / (2.0 * mu)


def capped_paper_sensitivity(paper_delta: float, norm_bound: float) -> float:
    """min(Delta, 2C): both the noise-free release and M_theta(D) lie in the C-ball, so their distance is at
    most its diameter whatever the paper's formula says."""
    return min(paper_delta, 2.0 * norm_bound)


def estimator_error_bound(residual: float, gradient_norm: float, lam: float, lam_min: float) -> float:
    """||p - (H + lambda I)^{-1} g|| <= ||(H + lambda I) p - g|| / (lambda + lambda_min): the estimated Newton
    direction's distance from the exact one, from its measured relative residual (deterministic; replaces
    the estimator lemma's probability-(1 - rho) term, which needs every sampled Hessian bounded)."""
    return residual * gradient_norm / (lam + lam_min)
