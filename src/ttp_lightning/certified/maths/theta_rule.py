"""`method.theta=auto` for the certified learners: theta chosen by the rule Alg 1's early stopping applies to
epochs, here applied to the exact optima M_theta(D) of a ladder of thetas.

A theta qualifies when every forget image's CD at M_theta(D) is at most the release gate's threshold tau_c and
the retain accuracy is at least tau_r (the starting model's minus `retain_acc_drop_at_most`). The rule takes the
smallest qualifying theta it finds: the ladder is probed from its smallest theta up until one qualifies or the
retain rule breaks; a qualifying theta above one that met the retain rule but not the gate is then refined by
bisection between the two. When none qualifies it says so, at the largest probed theta that kept the retain
rule (or the smallest probed, when none did), and names the images still above tau_c there.

What the choice rests on: only the probes it made. The chosen theta was measured to qualify (a NaN fails both
rules); that it is the smallest qualifying one assumes the worst CD falls and the retain accuracy falls as theta
grows, which the measured sweeps show but nothing proves. Pure: `probe(theta)` does the solving.
"""

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Probe:
    """What M_theta(D) scores: the retain accuracy and each forget image's CD (in the forget set's order)."""

    theta: float
    retain_acc: float
    forget_conf_dists: tuple[float, ...]

    def exposed(self, threshold: float) -> tuple[int, ...]:
        """Positions of the forget images whose CD is not at most `threshold` (NaN included)."""
        return tuple(i for i, cd in enumerate(self.forget_conf_dists) if not cd <= threshold)

    def keeps_retain(self, retain_floor: float) -> bool:
        return self.retain_acc >= retain_floor  # False for NaN

    @property
    def worst(self) -> float:
        """The largest CD, NaN when any is NaN (Python's max would depend on where it stands)."""
        if any(math.isnan(cd) for cd in self.forget_conf_dists):
            return math.nan
        return max(self.forget_conf_dists, default=math.nan)


@dataclass(frozen=True)
class ThetaChoice:
    theta: float
    met: bool                       # every forget image <= threshold and the retain rule kept
    exposed: tuple[int, ...]        # images above the threshold at `theta` (empty when met)
    probes: tuple[Probe, ...]       # in the order they were made
    threshold: float
    retain_floor: float

    def record(self) -> dict:
        """results.json's view: the rule's verdict and every probe."""
        return {"theta": self.theta, "met": self.met, "exposed": len(self.exposed), "threshold": self.threshold,
                "retain_floor": self.retain_floor,
                "probes": [{"theta": p.theta, "retain_acc": p.retain_acc, "worst_forget_conf_dist": p.worst,
                            "forget_exposed": len(p.exposed(self.threshold))} for p in self.probes]}


def check_ladder(ladder: Sequence[float], refine_steps: int) -> list[str]:
    """Why a ladder cannot be used (empty: it can): thetas in (0, 1), strictly increasing."""
    problems = []
    values = list(ladder)
    if not values:
        problems.append("the theta ladder is empty")
    if any(not (isinstance(t, (int, float)) and 0 < t < 1) for t in values):
        problems.append(f"every theta of the ladder must lie in (0, 1), not {values}")
    elif any(b <= a for a, b in itertools.pairwise(values)):
        problems.append(f"the theta ladder must increase strictly, not {values}")
    if not (isinstance(refine_steps, int) and 0 <= refine_steps <= 20):
        problems.append(f"refine steps must be an integer in [0, 20], not {refine_steps}")
    return problems


def choose_theta(probe: Callable[[float], Probe], ladder: Sequence[float], refine_steps: int, threshold: float,
                 retain_floor: float) -> ThetaChoice:
    """The smallest theta found whose M_theta(D) puts every forget image at CD <= `threshold` with retain accuracy
    >= `retain_floor`; else the verdict at the largest theta that kept the retain rule."""
    problems = check_ladder(ladder, refine_steps)
    if problems:
        raise ValueError("; ".join(problems))
    probes: list[Probe] = []

    def measured(theta: float) -> Probe:
        probes.append(probe(theta))
        return probes[-1]

    below, qualified, kept = 0.0, None, None  # below: the largest theta known not to qualify while keeping retain
    for theta in ladder:
        found = measured(float(theta))
        if not found.keeps_retain(retain_floor):
            break
        kept = found
        if not found.exposed(threshold):
            qualified = found
            break
        below = found.theta
    if qualified is None:
        verdict = kept if kept is not None else probes[0]
        return ThetaChoice(verdict.theta, False, verdict.exposed(threshold), tuple(probes), threshold, retain_floor)
    for _ in range(refine_steps):
        middle = 0.5 * (below + qualified.theta)
        found = measured(middle)
        if found.keeps_retain(retain_floor) and not found.exposed(threshold):
            qualified = found
        else:
            below = middle
    return ThetaChoice(qualified.theta, True, (), tuple(probes), threshold, retain_floor)
