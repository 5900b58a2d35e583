"""How the certified objective combines the forget images' losses l_1..l_n into one number R(l).

mean       R = mean_i l_i (the paper).
smoothmax  R = T log(mean_i exp(l_i / T)): a smooth maximum; between the mean (T -> infinity) and the
           largest loss (T -> 0), never below the mean, never above the largest loss and at most T log n below it.
cvar       R = min_t t + 1 / (alpha n) sum_i T softplus((l_i - t) / T): the mean of the largest alpha fraction
           of the losses (CVaR_alpha, Rockafellar and Uryasev 2000) with its kink smoothed at temperature T;
           at least CVaR_alpha and at most T log 2 / alpha above it.

Convexity (what mu = lambda needs): each R is convex and nondecreasing in every l_i (smoothmax: log-sum-exp;
cvar: the partial minimum over t of a function jointly convex in (l, t), with dR/dl_i = sigmoid(.) / (alpha n)
>= 0), and a convex nondecreasing function of convex functions is convex. So with convex l_i(w) (reverse KL of
logits linear in w) the forget term stays convex, and a temperature T > 0 is required: at T < 0 the same
formula is a smooth minimum, which is concave.

Derivatives: dR/dl = q, and the Hessian in loss space has one form for both smooth reductions,
(1 / T) (diag(a) - a a^T / sum(a)), with a = q for smoothmax and a_i = sigma_i (1 - sigma_i) / (alpha n) for
cvar (t* moves with l: dt*/dl_j = a_j / sum(a)). It is positive semidefinite (Cauchy-Schwarz). The mean has
q = 1 / n and no curvature of its own.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ttp_lightning.core.objectives import smooth_maximum

REDUCTIONS = ("mean", "smoothmax", "cvar")


@dataclass(frozen=True)
class Reduction:
    name: str = "mean"
    temperature: float | None = None   # smoothmax and cvar: T > 0 in the losses' units (nats)
    fraction: float | None = None      # cvar: alpha in (0, 1]

    def problems(self) -> list[str]:
        """Why this reduction is not a convex, smooth function of the losses (empty: it is)."""
        if self.name not in REDUCTIONS:
            return [f"forget_reduction={self.name!r} is not one of {', '.join(REDUCTIONS)}"]
        if self.name == "mean":
            return [] if self.temperature is None and self.fraction is None else \
                ["forget_reduction=mean takes no temperature or fraction"]
        problems = []
        if not (_is_number(self.temperature) and math.isfinite(self.temperature) and self.temperature > 0):
            problems.append(f"forget_reduction={self.name} needs a temperature > 0, not {self.temperature} (at T <= 0 "
                            "it is a smooth minimum or undefined: not convex)")
        if self.name == "cvar" and not (_is_number(self.fraction) and 0 < self.fraction <= 1):
            problems.append(f"forget_reduction=cvar needs a fraction in (0, 1], not {self.fraction}")
        if self.name == "smoothmax" and self.fraction is not None:
            problems.append("forget_reduction=smoothmax takes no fraction")
        return problems


MEAN = Reduction()


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class Reduced:
    """R(l), its gradient q = dR/dl and the vector a of its loss-space Hessian (1/T)(diag a - a a^T / sum a)."""

    value: float
    weights: torch.Tensor
    curvature: torch.Tensor | None = None
    temperature: float = 1.0

    def hessian_times(self, u: torch.Tensor) -> torch.Tensor:
        """(d^2 R / dl^2) u."""
        if self.curvature is None:
            return torch.zeros_like(u)
        a = self.curvature
        total = a.sum()
        if not total > 0:
            return torch.zeros_like(u)
        return (a * u - a * (a.dot(u) / total)) / self.temperature


def reduce(reduction: Reduction, losses: torch.Tensor) -> Reduced:
    """R at the losses `losses` (n,), float64, with its first and second derivatives."""
    n = len(losses)
    if reduction.name == "mean":
        return Reduced(losses.mean().item(), torch.full_like(losses, 1.0 / n))
    temperature = reduction.temperature
    if reduction.name == "smoothmax":
        weights = torch.softmax(losses / temperature, 0)
        return Reduced(smooth_maximum(losses, temperature).item(), weights, weights, temperature)
    share = reduction.fraction * n
    threshold = cvar_threshold(losses, share, temperature)
    sigma = torch.sigmoid((losses - threshold) / temperature)
    value = threshold + temperature * F.softplus((losses - threshold) / temperature).sum().item() / share
    return Reduced(value, sigma / share, sigma * (1 - sigma) / share, temperature)


def threshold_loss(classes: int, conf_dist: float) -> float:
    """The smallest KL(u || p) of a softmax p over `classes` classes whose confidence distance max p - 1/K is
    `conf_dist`: the top class at 1/K + conf_dist and the rest shared equally (log is concave)."""
    top = 1.0 / classes + conf_dist
    rest = (1.0 - top) / (classes - 1)
    return -math.log(classes) - (math.log(top) + (classes - 1) * math.log(rest)) / classes


def temperature_rule(classes: int, conf_dist: float, forget_size: int) -> float:
    """`forget_reduction_temperature=auto`: T = threshold_loss / log n. The smooth maximum is within T log n of
    the largest loss, so this T resolves the worst image to within the loss of an image at the release gate's
    threshold (MNIST, 10 classes, CD 0.1, 100 images: 0.0367 / 4.61 = 0.0080 nats); no data enters the rule."""
    return threshold_loss(classes, conf_dist) / math.log(max(forget_size, 2))


def cvar_threshold(losses: torch.Tensor, share: float, temperature: float) -> float:
    """t* with sum_i sigmoid((l_i - t*) / T) = share (alpha n): the minimiser over t, by bisection on the
    decreasing left side (exact to float64 in ~100 halvings of a bracket that holds it)."""
    low = losses.min().item() - temperature * (math.log(len(losses)) + 40.0)
    high = losses.max().item() + temperature * 40.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if middle in (low, high):
            break
        if torch.sigmoid((losses - middle) / temperature).sum().item() > share:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)
