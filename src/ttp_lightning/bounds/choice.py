"""bounds.kind=auto: the bound that proves the most within a time per image, chosen by measuring, not by the
network's size alone (issue 62).

Every bound here is sound, so the choice changes how much is proven, never whether a proof holds. The candidates,
from the cheapest: intervals; CROWN with interval pre-activation bounds (CROWN-IBP); CROWN with its own
pre-activation bounds (full CROWN); full CROWN with alpha-CROWN's optimised slopes (where a ReLU feeds another;
elsewhere it is full CROWN and is not tried twice). Each is tried on the
first PROBE_IMAGES images: their proven radius at the threshold (the radius search the table runs) and their
proven CD at the grid's first radius, timed. A candidate that takes more than `seconds_per_image` is stopped as
soon as it passes the time (bounds.linear.deadline) and is out. Of those within the time, the one with the
largest mean proven radius wins, then the one with the lowest mean proven CD at the grid's first radius (so
that a bound that proves no radius but bounds the CD lower still counts), then the cheaper one: a costlier bound
is used only where it proves more.

What it assumes: the probe images stand for the rest (they are the forget set's first ones, in the data set's
order), and the time measured on them is the time on the others. The record says what was tried, what each
proved and how long it took, so a reader can see the price of the bound not taken.
"""

import math
import time
from dataclasses import asdict, dataclass, replace

import torch
from torch import nn

from ttp_lightning.bounds.linear import OverBudget, deadline
from ttp_lightning.bounds.propagate import UnsupportedLayer
from ttp_lightning.bounds.uniformity import Prover

# (bound, CROWN's intermediate mode, alpha-CROWN: with the settings' slope steps), cheapest first
CANDIDATES = (("interval", None, False), ("linear", "ibp", False), ("linear", "crown", False), ("linear", "crown", True))
PROBE_IMAGES = 2  # enough to time a bound and see whether it proves more; each costs a radius search per bound


@dataclass(frozen=True)
class Trial:
    """One candidate on the probe images: mean proven radius (1/255) and proven CD at the grid's first radius,
    seconds per image; `note` says why it is out (past the time, no rule for a layer)."""

    bound: str
    intermediate: str | None
    slope_steps: int
    seconds_per_image: float
    radius_mean: float | None = None
    conf_dist_mean: float | None = None
    note: str | None = None

    @property
    def finished(self) -> bool:
        return self.note is None


@dataclass(frozen=True)
class BoundChoice:
    """The bound chosen (`bound`, CROWN's `intermediate`, alpha-CROWN's `slope_steps`), every trial, the probe's
    size, the time allowed per image and the time the choice took."""

    bound: str
    intermediate: str | None
    slope_steps: int
    trials: tuple[Trial, ...]
    probe_images: int
    seconds_per_image_allowed: float
    seconds: float

    def to_json(self) -> dict:
        return {"rule": "auto: the most proven within the time per image", "bound": self.bound,
                "intermediate": self.intermediate, "slope_steps": self.slope_steps, "probe_images": self.probe_images,
                "seconds_per_image_allowed": self.seconds_per_image_allowed, "seconds": round(self.seconds, 3),
                "trials": [asdict(trial) for trial in self.trials]}


def _try(net: nn.Module, bound: str, intermediate: str | None, slopes: int, probe: torch.Tensor, at_most: float,
         step: float, largest: float, seconds_per_image: float, device, precision: str) -> Trial:
    start = time.perf_counter()
    prover = Prover(net, bound, device, intermediate=intermediate or "ibp", slope_steps=slopes, precision=precision)

    def trial(**found) -> Trial:
        return Trial(bound, intermediate, slopes, round((time.perf_counter() - start) / len(probe), 4), **found)

    try:
        with deadline(seconds_per_image * len(probe)):
            seen: dict[float, torch.Tensor] = {}
            radius = prover.radius(probe, at_most, step, largest, seen=seen)
            first = seen.get(float(step), torch.full((len(probe),), torch.nan, dtype=torch.float64))
            missing = first.isnan()  # the search starts at `step` unless a smaller bound already passed it
            if missing.any():
                first[missing] = prover.conf_dist(probe[missing], step)
    except OverBudget:
        return trial(note=f"stopped past {seconds_per_image:g} s per image")
    except UnsupportedLayer as exc:
        return trial(note=str(exc))
    if prover.fallback:  # a layer without a linear rule: the interval bound under another name
        return trial(note=f"fell back to intervals: {prover.fallback}")
    found = trial(radius_mean=float(radius.mean()), conf_dist_mean=float(first.mean()))
    if found.seconds_per_image > seconds_per_image:
        return replace(found, note=f"took more than {seconds_per_image:g} s per image")
    return found


TIE = 1e-9  # proven CDs closer than this are the same: rounding does not buy a costlier bound


def _proves_more(trial: Trial, best: Trial) -> bool:
    """Whether a finished trial proves more than `best`: a larger mean radius, or the same radius and a mean CD
    bound lower by more than TIE (a NaN proves nothing)."""
    radius, bound = trial.radius_mean, trial.conf_dist_mean
    if not (math.isfinite(radius) and math.isfinite(bound)):
        return False
    if not (math.isfinite(best.radius_mean) and math.isfinite(best.conf_dist_mean)):
        return True
    return radius > best.radius_mean or (radius == best.radius_mean and bound < best.conf_dist_mean - TIE)


def _warm_up(net: nn.Module, image: torch.Tensor, device, slope_steps: int) -> bool:
    """Whether alpha-CROWN differs from full CROWN on `net` (some ReLU feeds another), after one untimed linear
    bound at radius 0: the first linear candidate is then not charged the one-time costs (first calls into
    torch.func's transposes) the later ones skip (on the letters MLP CROWN-IBP, timed first, measured 0.13 s per
    image where full CROWN, timed after it, took 0.03). False, with nothing warmed, for a network with a layer no
    bound has a rule for: every trial then says so and the stage gets no proven CD."""
    prover = Prover(net, "linear", device, intermediate="crown", slope_steps=slope_steps)
    try:
        prover.resolve(image)  # counts the neurons behind a ReLU that feeds another
        prover.conf_dist(image, 0.0)
    except UnsupportedLayer:
        return False
    return prover.slopes_used > 0


def choose_bound(net: nn.Module, images: torch.Tensor, at_most: float, step: float, largest: float,
                 seconds_per_image: float, device="cpu", slope_steps: int = 20,
                 precision: str = "float32") -> BoundChoice:
    """The candidate (CANDIDATES) that proves the most on the first PROBE_IMAGES of `images` within
    `seconds_per_image` (module docstring); intervals when none finishes, or no image is given. alpha-CROWN
    takes `slope_steps`, and is tried only where it differs from full CROWN (some ReLU feeds another)."""
    start = time.perf_counter()
    probe = images[:PROBE_IMAGES]
    if not len(probe):
        return BoundChoice("interval", None, 0, (), 0, seconds_per_image, 0.0)
    deep = _warm_up(net, probe[:1], device, slope_steps)
    trials = tuple(_try(net, bound, intermediate, slope_steps if optimised else 0, probe, at_most, step, largest,
                        seconds_per_image, device, precision)
                   for bound, intermediate, optimised in CANDIDATES if deep or not optimised)
    best = None
    for trial in (trial for trial in trials if trial.finished):  # cheapest first: a later one wins only by proving more
        if best is None or _proves_more(trial, best):
            best = trial
    if best is None:
        return BoundChoice("interval", None, 0, trials, len(probe), seconds_per_image, time.perf_counter() - start)
    return BoundChoice(best.bound, best.intermediate, best.slope_steps, trials, len(probe), seconds_per_image,
                       time.perf_counter() - start)
