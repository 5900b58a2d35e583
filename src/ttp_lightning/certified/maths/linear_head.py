"""The regularised Pareto objective of a model whose logits are linear in its certified weights: logits =
W phi + b with phi fixed (logistic regression's pixels, or a network's frozen penultimate features).

F(w) = sum over parts of weight * R(loss(z_1), ..., loss(z_n)) + lambda / 2 ||w||^2, z_i = [W, b] [phi_i; 1], R the
part's reduction (reductions.py: the mean, or a smooth worst-image term for the forget set), in closed form
on the feature matrices (float64): value, gradient, Hessian-vector products and a preconditioner from
each instance's logit derivatives. And a solver for M_theta(D) = argmin_{||w|| <= C} F: Newton with
conjugate gradients (Kronecker-factored preconditioner) on F + nu / 2 ||w||^2, nu found by a safeguarded secant on
1 / ||w(nu)|| - 1 / C when the ball constraint is active. The solver only has to be good: the certificate
(residual.py) is measured on the point it returns, whatever it did.

The flat weight vector is laid out as the model's parameters are: W row-major (classes x features), then b.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ttp_lightning.certified.maths.reductions import MEAN, Reduced, Reduction, reduce
from ttp_lightning.core import stopping
from ttp_lightning.core.errors import TTPUserError

InstanceLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (logits [K], label []) -> loss []


@dataclass
class HeadPart:
    """One term of the objective: `weight` * `reduction` (the mean by default) over instances of `loss`(logits,
    label)."""

    features: torch.Tensor  # (n, f + 1), float64, last column ones
    labels: torch.Tensor    # (n,) (ignored by a loss that needs none)
    weight: float
    loss: InstanceLoss
    reduction: Reduction = MEAN

    @property
    def averaged(self) -> bool:
        return self.reduction.name == "mean"


@dataclass
class Evaluation:
    """F and its derivatives at one point (the logit derivatives are reused by every product there)."""

    weights: torch.Tensor
    value: float
    gradient: torch.Tensor
    logit_gradients: list[torch.Tensor]
    logit_hessians: list[torch.Tensor]
    reduced: list[Reduced | None]  # per part: its reduction's derivatives (None: the mean, in the shorter form)


class LinearHeadObjective:
    def __init__(self, parts: list[HeadPart], lam: float, classes: int):
        self.parts = [part for part in parts if part.weight and len(part.labels)]
        self.lam, self.classes = lam, classes
        self.features = self.parts[0].features.shape[1] - 1
        self.size = classes * (self.features + 1)
        self._moment = None

    # ------------------------------------------------------------------ layout
    def matrix(self, flat: torch.Tensor) -> torch.Tensor:
        """(K, f + 1): [W, b] from the flat (W row-major, b) vector."""
        split = self.classes * self.features
        return torch.cat([flat[:split].view(self.classes, self.features), flat[split:, None]], dim=1)

    def flat(self, matrix: torch.Tensor) -> torch.Tensor:
        return torch.cat([matrix[:, :-1].reshape(-1), matrix[:, -1]])

    # ------------------------------------------------------------------ derivatives
    def evaluate(self, weights: torch.Tensor) -> Evaluation:
        matrix = self.matrix(weights)
        value = 0.5 * self.lam * weights.dot(weights).item()
        gradient = self.lam * matrix
        grads, hessians, reductions = [], [], []
        for part in self.parts:
            logits = part.features @ matrix.T
            losses, logit_grad, logit_hess = _logit_derivatives(part.loss, logits, part.labels)
            if part.averaged:
                scale = part.weight / len(part.labels)
                value += scale * losses.sum().item()
                gradient = gradient + scale * logit_grad.T @ part.features
                reductions.append(None)
            else:
                reduced = reduce(part.reduction, losses)
                value += part.weight * reduced.value
                gradient = gradient + part.weight * (reduced.weights[:, None] * logit_grad).T @ part.features
                reductions.append(reduced)
            grads.append(logit_grad)
            hessians.append(logit_hess)
        return Evaluation(weights, value, self.flat(gradient), grads, hessians, reductions)

    def hvp(self, at: Evaluation, vector: torch.Tensor, shift: float = 0.0) -> torch.Tensor:
        """(H + (lambda + shift) I) v, H the Hessian of the unregularised part at `at`."""
        direction = self.matrix(vector)
        out = (self.lam + shift) * direction
        for part, hessian, logit_grad, reduced in zip(self.parts, at.logit_hessians, at.logit_gradients, at.reduced):
            change = part.features @ direction.T
            if reduced is None:
                out = out + part.weight / len(part.labels) * torch.einsum("nab,nb->na", hessian, change).T @ part.features
                continue
            # sum_i q_i H_i v (each loss's own curvature) + J^T (d^2 R / dl^2) J v (the reduction's), J's rows the
            # losses' gradients
            inner = reduced.weights[:, None] * torch.einsum("nab,nb->na", hessian, change)
            across = reduced.hessian_times((logit_grad * change).sum(1))[:, None] * logit_grad
            out = out + part.weight * (inner + across).T @ part.features
        return self.flat(out)

    def _instance_weights(self, part: HeadPart, reduced: Reduced | None) -> torch.Tensor:
        """(n,): the weight of each instance's loss in F (weight / n for the mean, weight q_i otherwise)."""
        if reduced is None:
            return torch.full((len(part.labels),), part.weight / len(part.labels), dtype=part.features.dtype)
        return part.weight * reduced.weights

    def preconditioner(self, at: Evaluation, shift: float = 0.0) -> Callable[[torch.Tensor], torch.Tensor]:
        """v -> (A (x) S + (lambda + shift) I)^{-1} v, the Kronecker-factored approximation of H + (lambda + shift) I
        (every instance's logit Hessian replaced by their weighted mean A; S the weighted second moment of
        the features), applied through the eigendecompositions of A (K x K) and S."""
        total = sum(part.weight for part in self.parts)
        mean = sum(part.weight / len(part.labels) * hessian.sum(0) if reduced is None
                   else torch.einsum("n,nab->ab", self._instance_weights(part, reduced), hessian)
                   for part, hessian, reduced in zip(self.parts, at.logit_hessians, at.reduced)) / total
        a_values, a_vectors = torch.linalg.eigh(mean)
        s_values, s_vectors = self._moment_eigen()
        denominator = total * a_values.clamp(min=0)[:, None] * s_values.clamp(min=0)[None, :] + self.lam + shift

        def apply(vector: torch.Tensor) -> torch.Tensor:
            rotated = a_vectors.T @ self.matrix(vector) @ s_vectors
            return self.flat(a_vectors @ (rotated / denominator) @ s_vectors.T)
        return apply

    def _moment_eigen(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._moment is None:
            total = sum(part.weight for part in self.parts)
            moment = sum(part.weight / len(part.labels) * part.features.T @ part.features for part in self.parts)
            self._moment = torch.linalg.eigh(moment / total)
        return self._moment

    def absolute_gradient_norm(self, at: Evaluation) -> float:
        """|| sum of |each product| in the gradient ||: what float64 rounding in the gradient is relative to."""
        total = self.lam * self.matrix(at.weights).abs()
        for part, logit_grad, reduced in zip(self.parts, at.logit_gradients, at.reduced):
            if reduced is None:
                total = total + part.weight / len(part.labels) * logit_grad.abs().T @ part.features.abs()
            else:
                total = total + (self._instance_weights(part, reduced)[:, None] * logit_grad.abs()).T @ part.features.abs()
        return total.norm().item()

    def summed_terms(self) -> int:
        """The most products one gradient coordinate sums (instances, plus the logits' own dot products)."""
        return sum(len(part.labels) for part in self.parts) + self.features + 1 + self.classes


def _logit_derivatives(loss: InstanceLoss, logits: torch.Tensor, labels: torch.Tensor):
    """Per instance: the loss, its gradient and its Hessian with respect to the logits (reverse-over-reverse:
    forward-mode AD would load TorchScript decompositions, deprecated and noisy)."""
    losses = torch.func.vmap(loss)(logits, labels)
    grads = torch.func.vmap(torch.func.grad(loss))(logits, labels)
    hessians = torch.func.vmap(torch.func.jacrev(torch.func.grad(loss)))(logits, labels)
    return losses.detach(), grads.detach(), hessians.detach()


# ---------------------------------------------------------------------------------------------- solver
@dataclass
class SolverSettings:
    tolerance: float = 1e-10       # stop when ||grad (F + nu/2 ||w||^2)|| is below this
    max_newton: int = 100          # Newton iterations per value of nu
    max_cg: int = 2000             # conjugate-gradient iterations per Newton direction
    max_multiplier_steps: int = 60  # values of nu tried when the ball constraint is active


@dataclass
class Solution:
    weights: torch.Tensor
    multiplier: float = 0.0
    newton_iterations: int = 0
    hessian_products: int = 0


class NegativeCurvature(TTPUserError):
    """The objective is not convex along a direction the solver met (the stated mu is refuted)."""


def _preconditioned_cg(product, rhs, precondition, tolerance, max_iterations):
    """x with ||product(x) - rhs|| <= tolerance (or after max_iterations); (x, products used). Raises
    NegativeCurvature on a direction with p^T A p <= 0."""
    x = torch.zeros_like(rhs)
    residual = rhs.clone()
    z = precondition(residual)
    direction = z.clone()
    rz = residual.dot(z)
    for used in range(1, max_iterations + 1):
        stopping.check()
        image = product(direction)
        curvature = direction.dot(image)
        if not curvature > 0:
            raise NegativeCurvature("the objective has non-positive curvature along a direction (p^T H p = "
                                    f"{curvature.item():.3g}): it is not strongly convex, so mu is refuted; raise "
                                    "method.lam or use method.uniformity=reverse_kl")
        step = rz / curvature
        x += step * direction
        residual -= step * image
        if residual.norm() <= tolerance:
            return x, used
        z = precondition(residual)
        rz_next = residual.dot(z)
        direction = z + (rz_next / rz) * direction
        rz = rz_next
    return x, max_iterations


def _penalised(objective: LinearHeadObjective, weights: torch.Tensor, shift: float) -> tuple[Evaluation, torch.Tensor, float]:
    at = objective.evaluate(weights)
    return at, at.gradient + shift * weights, at.value + 0.5 * shift * weights.dot(weights).item()


def newton(objective: LinearHeadObjective, start: torch.Tensor, shift: float, settings: SolverSettings,
           solution: Solution) -> torch.Tensor:
    """argmin F + shift / 2 ||w||^2 from `start`: inexact Newton (CG forcing term min(0.1, sqrt(||g||)) ||g||),
    Armijo backtracking; stops at the tolerance or when a step no longer lowers ||g|| (the float64 floor)."""
    weights = start
    at, gradient, value = _penalised(objective, weights, shift)
    for _ in range(settings.max_newton):
        stopping.check()
        norm = gradient.norm().item()
        if norm <= settings.tolerance:
            break
        direction, used = _preconditioned_cg(lambda v, at=at: objective.hvp(at, v, shift), -gradient,
                                             objective.preconditioner(at, shift),
                                             min(0.1, math.sqrt(norm)) * norm, settings.max_cg)
        solution.hessian_products += used
        solution.newton_iterations += 1
        slope = gradient.dot(direction).item()
        step = 1.0
        while True:
            trial = weights + step * direction
            trial_at, trial_gradient, trial_value = _penalised(objective, trial, shift)
            if trial_value <= value + 1e-4 * step * slope or step < 1e-3:
                break
            step /= 2
        if trial_gradient.norm().item() >= norm and trial_value >= value:
            break  # no progress left in float64
        weights, at, gradient, value = trial, trial_at, trial_gradient, trial_value
    return weights


def solve_on_ball(objective: LinearHeadObjective, start: torch.Tensor, norm_bound: float,
                  settings: SolverSettings) -> Solution:
    """An approximation of argmin_{||w|| <= C} F from `start`. Continuation: nu from 2 ||grad F(0)|| / C (where
    w(nu) is well inside the ball) down by 8x per level until ||w(nu)|| > C or nu is negligible (then nu = 0:
    the constraint is inactive); then a safeguarded secant on 1 / ||w(nu)|| - 1 / C inside the bracket. The
    result is scaled into the ball."""
    solution = Solution(start)
    zero = torch.zeros_like(start)
    scale = objective.evaluate(zero).gradient.norm().item()
    shift = 2.0 * scale / norm_bound
    weights = start * min(1.0, norm_bound / max(start.norm().item(), 1e-300))
    inside = (shift, newton(objective, weights, shift, settings, solution))
    for _ in range(settings.max_multiplier_steps):
        if inside[1].norm().item() <= norm_bound:
            break
        shift *= 8.0  # not yet inside: a stronger pull towards 0
        inside = (shift, newton(objective, weights, shift, settings, solution))
    else:
        raise TTPUserError(f"the solver found no point inside the C-ball (C={norm_bound}); raise pretrain.norm_bound")
    outside = None
    floor = objective.lam * 1e-6
    while inside[1].norm().item() <= norm_bound:
        shift = shift / 8.0 if shift / 8.0 > floor else 0.0
        weights = newton(objective, inside[1], shift, settings, solution)
        if weights.norm().item() > norm_bound:
            outside = (shift, weights)
            break
        inside = (shift, weights)
        if shift == 0.0:
            solution.weights, solution.multiplier = into_ball(weights, norm_bound), 0.0
            return solution
    high, w_high = _secant_on_multiplier(objective, outside, inside, norm_bound, settings, solution)
    weights, multiplier = kkt_polish(objective, w_high, high, norm_bound, settings, solution)
    solution.weights = into_ball(weights, norm_bound)
    solution.multiplier = multiplier
    return solution


def _secant_on_multiplier(objective: LinearHeadObjective, outside: tuple, inside: tuple, norm_bound: float,
                          settings: SolverSettings, solution: Solution) -> tuple[float, torch.Tensor]:
    """The smallest nu found whose w(nu) is inside the ball (and w(nu)), by a safeguarded secant on
    1 / ||w(nu)|| - 1 / C between `outside` and `inside` ((nu, w) pairs)."""
    gap = lambda w: 1.0 / w.norm().item() - 1.0 / norm_bound  # > 0 inside, < 0 outside; ~linear in nu
    (low, w_low), (high, w_high) = outside, inside
    g_low, g_high = gap(w_low), gap(w_high)
    for _ in range(settings.max_multiplier_steps):
        if g_high * norm_bound <= 1e-6:
            break
        guess = high - g_high * (high - low) / (g_high - g_low)
        if not low < guess < high:
            guess = 0.5 * (low + high)
        weights = newton(objective, w_high, guess, settings, solution)
        g = gap(weights)
        if g >= 0:
            high, w_high, g_high = guess, weights, g
        else:
            low, w_low, g_low = guess, weights, g
        if high - low <= 1e-15 * high:
            break
    return high, w_high


def into_ball(weights: torch.Tensor, norm_bound: float) -> torch.Tensor:
    """`weights` scaled onto the ball if outside, then shrunk by ulps until its computed norm is <= C (the
    certificate needs ||w|| <= C as float64 computes it)."""
    if weights.norm().item() > norm_bound:
        weights = weights * (norm_bound / weights.norm().item())
    while weights.norm().item() > norm_bound:
        weights = weights * (1.0 - 2.0**-52)
    return weights


def kkt_polish(objective: LinearHeadObjective, weights: torch.Tensor, multiplier: float, norm_bound: float,
               settings: SolverSettings, solution: Solution, iterations: int = 8) -> tuple[torch.Tensor, float]:
    """Newton on the KKT system grad F(w) + nu w = 0, (||w||^2 - C^2) / 2 = 0 jointly in (w, nu): the secant on
    nu alone cannot put ||w|| on the sphere to float64 precision (||w(nu)|| moves ~||w|| / (lambda + nu) per
    unit of nu), and the certificate pays sqrt(nu ||w|| (C - ||w||) / mu) for any gap. Each step solves
    (H + nu I) a = r and (H + nu I) b = w; dnu = (c - w.a) / (w.b), dw = -a - b dnu. Keeps the best point."""
    best = (weights, multiplier, math.inf)
    for _ in range(iterations):
        at = objective.evaluate(weights)
        residual = at.gradient + multiplier * weights
        gap = 0.5 * (weights.dot(weights).item() - norm_bound**2)
        size = residual.norm().item() + abs(gap) / norm_bound
        if size >= best[2]:
            break
        best = (weights, multiplier, size)
        if residual.norm().item() <= settings.tolerance * 1e-2 and abs(gap) <= 1e-15 * norm_bound**2:
            break
        product = lambda v, at=at, shift=multiplier: objective.hvp(at, v, shift)
        precondition = objective.preconditioner(at, multiplier)
        a, used_a = _preconditioned_cg(product, residual, precondition, 1e-3 * settings.tolerance, settings.max_cg)
        b, used_b = _preconditioned_cg(product, weights, precondition, 1e-12 * weights.norm().item(), settings.max_cg)
        solution.hessian_products += used_a + used_b
        solution.newton_iterations += 1
        change = (gap - weights.dot(a).item()) / weights.dot(b).item()
        weights, multiplier = weights - a - change * b, max(0.0, multiplier + change)
    return best[0], best[1]
