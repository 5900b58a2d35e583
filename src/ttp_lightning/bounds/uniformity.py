"""Proven uniformity: upper bounds on how confident a network can be anywhere near an image.

For an image x and a radius gamma (L-inf, [0, 1] pixels), the box B = [x - gamma, x + gamma] intersected with
[0, 1]^d holds every image an adversary may submit. From lower bounds d_jc <= z_j - z_c over B
(propagate.py):

  softmax_c(z) = 1 / sum_j exp(z_j - z_c) <= 1 / sum_j exp(d_jc)      for every x' in B,

so max_c of the right-hand side, minus 1/K, bounds the confidence distance (CD) at every point of B: a
provable statement anyone holding the released weights and the image can recompute (`python -m
ttp_lightning.verify robust`). At gamma = 0 it is the clean CD.

For training (robust Alg 1's bound term: intervals as GOOD, Bitterwolf et al. 2020, or CROWN-IBP), the reverse KL divergence
KL(u || softmax z) = logsumexp_j (z_j - mean z) - log K is bounded over B by logsumexp_j of upper bounds on
z_j - mean z. It is 0 only where the output is uniform on the whole box, it bounds KL(u || p) at every point
(so, by Pinsker's inequality, max_c p_c - 1/K <= sqrt(bound / 2) there), and unlike a bound on the top
probability its gradient does not vanish when the network is confident.
"""

import copy
import math

import torch
from torch import nn

from ttp_lightning.bounds import linear
from ttp_lightning.bounds.propagate import (
    UnsupportedLayer,
    centred_logit_upper_bounds,
    logit_difference_lower_bounds,
    trace,
)
from ttp_lightning.bounds.rounding import Rounding, softmax_margin
from ttp_lightning.core.metrics import conf_dist_of_confidence

BOUNDS = ("interval", "linear")  # linear: CROWN, intersected with the interval bound (never looser)
RADIUS_STEP, MAX_RADIUS = 0.25, 16.0  # the proven radius's grid, in units of 1/255


def input_box(images: torch.Tensor, radius: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The L-inf ball of `radius` (a number, or one per image) around each image, intersected with the pixel
    range [0, 1]."""
    if isinstance(radius, torch.Tensor) and radius.dim() == 1:
        radius = radius.to(images).view(-1, *([1] * (images.dim() - 1)))
    return (images - radius).clamp(0.0, 1.0), (images + radius).clamp(0.0, 1.0)


class Prover:
    """Proven CD of images under one network: a float64 copy in eval mode, traced once. `bound` is
    `interval` or `linear` (CROWN, intersected with the interval bound; when a layer has no linear rule it falls
    back to the interval bound, `bound` says so and `fallback` why). `intermediate` is CROWN's
    (bounds.linear.INTERMEDIATE); where it is crown (a network small enough for it) and some ReLU feeds another
    (on one ReLU layer the optimised slopes changed no bound measured, at 30x the cost), the final bounds also
    get `slope_steps` of alpha-CROWN's slope optimisation (`slopes_used` says how many).

    The bound holds for the network evaluated in `precision` (float32 by default: what load_released runs), not
    only for the exact function of its weights: every bound is widened by the rounding error that precision's
    forward pass and softmax can make (bounds.rounding, with what it assumes; precision float64 is, in effect, the
    exact function of the weights)."""

    def __init__(self, net: nn.Module, bound: str = "interval", device: torch.device | str = "cpu",
                 intermediate: str = "crown", chunk_size: int = 256,
                 budget: int = linear.INTERMEDIATE_BUDGET,
                 slope_steps: int = linear.SLOPE_STEPS, precision: str = "float32"):
        if bound not in BOUNDS:
            raise ValueError(f"bound={bound!r}; choose one of {', '.join(BOUNDS)}")
        self.model = copy.deepcopy(net).to(device=device, dtype=torch.float64).eval().requires_grad_(False)
        self.graph, self.device, self.chunk_size = trace(self.model), device, chunk_size
        self.intermediate, self.bound, self.fallback, self.budget = intermediate, bound, None, budget
        self.slope_steps, self.deep = slope_steps, None
        self.rounding = Rounding(precision)

    @property
    def slopes_used(self) -> int:
        """alpha-CROWN's steps on the final bounds (0: CROWN's own slopes, or no linear bound)."""
        deep = self.bound == "linear" and self.intermediate == "crown" and bool(self.deep)
        return self.slope_steps if deep else 0

    def resolve(self, image: torch.Tensor) -> str:
        """intermediate=auto becomes crown while the network has at most `budget` neurons whose bounds CROWN
        would tighten by passes of their own (linear.deep_relu_neurons), else ibp; returns the mode."""
        if self.deep is None:
            self.deep = linear.deep_relu_neurons(self.model, image.to(device=self.device, dtype=torch.float64),
                                                 self.graph)
        if self.intermediate == "auto":
            self.intermediate = "crown" if self.deep <= self.budget else "ibp"
        return self.intermediate

    @torch.no_grad()
    def conf_dist(self, images: torch.Tensor, gamma: float | torch.Tensor) -> torch.Tensor:
        """[N] float64: per image, an upper bound on the CD anywhere in the L-inf ball of radius gamma / 255
        (a number, or one per image) around it, and in [0, 1]."""
        radii = torch.as_tensor(gamma, dtype=torch.float64).expand(len(images)) / 255.0
        out = []
        for start in range(0, len(images), self.chunk_size):
            x = images[start:start + self.chunk_size].to(device=self.device, dtype=torch.float64)
            lower, upper = input_box(x, radii[start:start + self.chunk_size].to(self.device))
            differences = self._differences(lower, upper)
            classes = differences.shape[-1]
            confidence = confidence_upper_bound(differences) * (1 + softmax_margin(classes, self.rounding.unit))
            out.append(conf_dist_of_confidence(confidence.clamp(max=1.0), classes).cpu())
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)

    def _differences(self, lower: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
        if self.bound == "linear":
            try:
                self.resolve(lower[:1])
                return linear.logit_difference_lower_bounds(self.model, lower, upper, self.graph, self.intermediate,
                                                            slope_steps=self.slopes_used, rounding=self.rounding)
            except UnsupportedLayer as exc:  # the interval bound has rules for more layers
                self.bound, self.fallback = "interval", str(exc)
        return logit_difference_lower_bounds(self.model, lower, upper, self.graph, rounding=self.rounding)

    def radius(self, images: torch.Tensor, at_most: float, step: float = RADIUS_STEP, largest: float = MAX_RADIUS,
               known: dict[float, torch.Tensor] | None = None,
               seen: dict[float, torch.Tensor] | None = None) -> torch.Tensor:
        """[N] float64, in units of 1/255: per image, the largest radius of the grid 0, step, ..., largest at
        which its proven CD is at most `at_most` (0 also when not even the image passes), all images at once.
        The search climbs from `step`, doubling the last radius that passed (step, 2 step, 4 step, ...) until
        one fails, then bisects between the last pass and the first failure: the small radii, which cost a
        linear bound least (fewer unstable neurons), come first; an image proven at radius r costs about
        2 log2(r / step) bounds, and two (`step`, then 0) where nothing is proven (bisecting the whole grid
        bounded every image at `largest` / 2 first, the costliest). The radius returned is always proven (its
        bound was computed and passed); it is the largest of the grid when the bound does not shrink as the ball
        grows, which interval bounds guarantee and the linear bounds showed on every network tested against a
        full scan. `known`: this prover's bounds already computed at some radii ({gamma: [N]}), which bracket
        the search; the linear bound starts from the interval bound's radius (cheap, and never larger). `seen`,
        when given, gets every bound the search computed: {gamma: [N]}, NaN for the images not bounded at that
        radius."""
        grid = torch.arange(0.0, largest + step / 2, step, dtype=torch.float64)
        passed = torch.full((len(images),), -1, dtype=torch.long)  # the largest grid index known to pass
        failed = torch.full((len(images),), len(grid), dtype=torch.long)  # the smallest known to fail
        if self.bound == "linear":
            floor = Prover(self.model, "interval", self.device, chunk_size=self.chunk_size,
                              precision=self.rounding.precision).radius(
                images, at_most, step, largest)
            passed = torch.where(floor > 0, torch.round(floor / step).long(), passed)
        for gamma, values in (known or {}).items():
            index = round(float(gamma) / step)
            if abs(index * step - float(gamma)) < 1e-9 and 0 <= index < len(grid):  # a point of the grid
                ok = torch.as_tensor(values, dtype=torch.float64) <= at_most
                passed = torch.where(ok, torch.maximum(passed, torch.tensor(index)), passed)
                failed = torch.where(~ok, torch.minimum(failed, torch.tensor(index)), failed)
        failed = torch.maximum(failed, passed + 1)  # should the bound shrink with the radius, the pass stands
        while True:
            open_ = (failed - passed > 1).nonzero().flatten()
            if not len(open_):
                break
            low, high = passed[open_], failed[open_]
            climb = torch.clamp(2 * low, min=1)  # the next radius up: step, then double the last pass
            middle = torch.where(climb < high, torch.clamp(climb, max=len(grid) - 1), (low + high) // 2)
            values = self.conf_dist(images[open_], grid[middle])
            ok = values <= at_most  # NaN never passes
            if seen is not None:
                for index in middle.unique().tolist():
                    gamma = float(grid[index])
                    record = seen.setdefault(gamma, torch.full((len(images),), torch.nan, dtype=torch.float64))
                    record[open_[middle == index]] = values[middle == index]
            passed[open_[ok]], failed[open_[~ok]] = middle[ok], middle[~ok]
        return torch.where(passed >= 0, grid[passed.clamp(min=0)], torch.zeros(()))


def proven_conf_dist(net: nn.Module, images: torch.Tensor, gamma: float, chunk_size: int = 256,
                        device: torch.device | str = "cpu", bound: str = "interval") -> torch.Tensor:
    """[N] float64: per image, an upper bound on the CD anywhere in the L-inf ball of radius `gamma` / 255
    around it (and in [0, 1]), by `bound` (Prover). Computed in float64 on a copy of the network in eval
    mode."""
    return Prover(net, bound, device, chunk_size=chunk_size).conf_dist(images, gamma)


def confidence_upper_bound(difference_lower: torch.Tensor) -> torch.Tensor:
    """[N]: an upper bound on max_c softmax_c over the box, from [N, K, K] lower bounds on z_j - z_c."""
    return torch.exp(-torch.logsumexp(difference_lower, dim=1)).amax(dim=-1)


def reverse_kl_upper_bound(net: nn.Module, images: torch.Tensor, radius: float, graph=None,
                           bound: str = "interval") -> torch.Tensor:
    """[N]: an upper bound on KL(u || softmax(net(x'))) for every x' in the ball of `radius` ([0, 1] pixel
    units) around each image; differentiable in the network's weights (robust Alg 1's bound term). `bound`:
    interval, or linear (CROWN-IBP, never looser: bounds.linear.centred_logit_upper_bounds). BatchNorm layers must
    be in eval mode."""
    if bound not in BOUNDS:
        raise ValueError(f"bound={bound!r}; choose one of {', '.join(BOUNDS)}")
    lower, upper = input_box(images, radius)
    centred = (linear.centred_logit_upper_bounds if bound == "linear" else centred_logit_upper_bounds)(
        net, lower, upper, graph)
    return torch.logsumexp(centred, dim=-1) - math.log(centred.shape[-1])
