"""Every protected image: per-image accounting and the release gate.

A release is judged by its worst protected image, not the mean. For each stage's model and each forget image
this module records three confidence distances (CD):

  clean      at the image itself;
  attacked   the most confident point the attack evaluation found within `attacks.robust_gamma` / 255 (a lower
             bound on what an adversary can reach);
  proven  an upper bound on the CD anywhere in that ball, from the weights alone (interval bound
             propagation, ttp_lightning.bounds): no attack can do better, and anyone holding the released weights
             and the image can recompute it (`python -m ttp_lightning.verify robust`).

The gate (`release_gate` in conf/main.yaml) then decides whether the method's model is released as protected:
every forget image must have each CD named in `release_gate.require` at most `release_gate.conf_dist_at_most`, the
method must have taken a training step when it trains (Alg 1), its early-stopping rule must have been met, and,
where the gate judges the ball, robust Alg 1's kept epoch must not have trained below the radius the release is
judged at unless the bound proves every image there (radius_fallback). Otherwise the weights go to
release_not_protected/, the model card says so and the command exits with EXIT_NOT_PROTECTED after one line naming
how many images failed, which, and why.
"""

import logging
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from ttp_lightning.bounds import UnsupportedLayer, proven_conf_dist
from ttp_lightning.bounds.choice import choose_bound
from ttp_lightning.bounds.uniformity import MAX_RADIUS, Prover
from ttp_lightning.core.errors import EXIT_NOT_PROTECTED, TTPUserError
from ttp_lightning.core.inference import probabilities
from ttp_lightning.core.metrics import conf_dist_of_probs

log = logging.getLogger(__name__)

PROTECTED_DIR, NOT_PROTECTED_DIR = "release", "release_not_protected"
KINDS = ("clean", "attacked", "proven")
SHARES = (0.05, 0.1)  # proven shares reported beside the gate's threshold
SHOWN_IDS = 10  # images named in the gate's line (all of them are in results.json)
ROBUST_DEFAULT = ("clean", "attacked")  # release_gate.require=null under a robust method


def require_problem(kinds) -> str | None:
    """Why a gate's required CDs are no gate a release can state (None when they are): clean among them, each of
    KINDS once. The run checks its settings with it before any work, and a release's config.json is read with it
    (release/format.py), so a run never writes a release load_released refuses."""
    kinds = list(kinds)
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown:
        return f"{unknown[0]!r} is no kind of CD; choose among {', '.join(KINDS)}"
    if len(set(kinds)) != len(kinds):
        return "name each kind once"
    if "clean" not in kinds:
        return "it must include clean"
    return None


@dataclass(frozen=True)
class GateSettings:
    """`release_gate`: the per-image threshold and which CDs of every forget image must meet it."""

    conf_dist_at_most: float = 0.1
    require: tuple[str, ...] = ("clean",)
    min_proven_radius: float | None = None  # in 1/255: every forget image proven at least this far

    @classmethod
    def from_config(cls, cfg, robust_method: bool = False) -> "GateSettings":
        """`require: null` is the method's own promise: a robust method (robust Alg 1, whose uniformity is meant
        to hold within attacks.robust_gamma of each image) is judged there too, [clean, attacked]; any other
        method at the images, [clean]."""
        if cfg is None:
            return cls()
        require = ROBUST_DEFAULT if cfg.require is None and robust_method else \
            ("clean",) if cfg.require is None else tuple(str(kind) for kind in cfg.require)
        radius = getattr(cfg, "min_proven_radius", None)
        return cls(float(cfg.conf_dist_at_most), require, None if radius is None else float(radius))

    @property
    def needs_bound(self) -> bool:
        """Whether the gate reads a proven bound (a proven CD, or a proven radius)."""
        return "proven" in self.require or self.min_proven_radius is not None

    def check(self, num_classes: int, attacks_enabled: bool, gradient_attacks: tuple[str, ...]) -> None:
        """A threshold the CD cannot exceed (it is at most 1 - 1/K) would make a gate that cannot fail; a required
        CD that nothing in the run measures (the attacks off, or only random noise to judge an attacked CD) would
        weaken the promise in silence: both end in one line naming the setting that states the weaker promise.
        `gradient_attacks`: the attacks of attacks.suite that follow gradients."""
        ceiling = 1.0 - 1.0 / num_classes
        if not 0.0 <= self.conf_dist_at_most < ceiling:
            raise TTPUserError(f"release_gate.conf_dist_at_most={self.conf_dist_at_most:g} is not allowed; with "
                               f"{num_classes} classes a CD is at most {ceiling:.4g}, so choose a value in "
                               f"[0, {ceiling:.4g}) (a gate that cannot fail protects nobody)")
        problem = require_problem(self.require)
        if problem:
            raise TTPUserError(f"release_gate.require=[{','.join(self.require)}] is not allowed; {problem}")
        if "attacked" not in self.require:
            return
        weaker = [kind for kind in self.require if kind != "attacked"]
        accept = f"release_gate.require=[{','.join(weaker)}] states the weaker promise"
        if not attacks_enabled:
            raise TTPUserError(f"release_gate.require={list(self.require)} (the method's promise unless stated) needs "
                               f"the attacked CD, and attacks.enabled=false measures none; turn the attacks on, or {accept}")
        if not gradient_attacks:
            raise TTPUserError(f"release_gate.require={list(self.require)} judges the attacked CD, and attacks.suite "
                               f"holds no attack that follows gradients (random noise alone would judge it); add one "
                               f"(+attacks/suite@attacks.suite.apgd=apgd), or {accept}")

    def check_network(self, net: nn.Module, channels: int, image_size: int, max_radius: float = MAX_RADIUS) -> None:
        """A required proven CD or radius needs a network bounds can propagate through, and a radius the
        search reaches: checked before any training, so the run is refused at once instead of failing its gate at
        the end."""
        if self.min_proven_radius is not None and self.min_proven_radius > max_radius:
            raise TTPUserError(f"release_gate.min_proven_radius={self.min_proven_radius:g} is not allowed; the "
                               f"radius search stops at bounds.max_radius={max_radius:g}")
        if not self.needs_bound:
            return
        try:
            proven_conf_dist(net, torch.zeros(1, channels, image_size, image_size), 0.0)
        except UnsupportedLayer as exc:
            weaker = [kind for kind in self.require if kind != "proven"]
            needs = (f"release_gate.require={list(self.require)} needs a proven CD" if "proven" in self.require
                     else f"release_gate.min_proven_radius={self.min_proven_radius:g} needs a proven radius")
            accept = ([f"release_gate.require=[{','.join(weaker)}]"] if "proven" in self.require else []) + \
                (["release_gate.min_proven_radius=null"] if self.min_proven_radius is not None else [])
            raise TTPUserError(f"{needs}, and this network cannot be bounded ({exc}); {' with '.join(accept)} "
                               "states the weaker promise") from None


def clean_conf_dist(net: nn.Module, images: torch.Tensor, device) -> torch.Tensor:
    """[N] float64: each image's CD under `net` (eval mode)."""
    return conf_dist_of_probs(probabilities(net, images, device))


def worst(values: list[float]) -> float:
    """The largest value, NaN when any is NaN (Python's max would depend on where it stands), 0 for none."""
    return math.nan if any(math.isnan(v) for v in values) else max(values, default=0.0)


def stage_summary(columns: dict[str, list | None], threshold: float) -> dict:
    """A stage's per-image numbers for its metrics: the worst image and how many exceed `threshold`, per kind
    (the clean ones come from the evaluation itself), and the proven shares at SHARES."""
    out: dict = {}
    attacked, proven = columns.get("attacked"), columns.get("proven")
    if attacked is not None:
        out["forget_robust_worst_conf_dist"] = round(worst(attacked), 6)
        out["forget_robust_exposed"] = sum(not value <= threshold for value in attacked)  # NaN counts as above
    if proven is not None:
        count = max(len(proven), 1)
        out["forget_proven_conf_dist"] = round(sum(proven) / count, 6)
        out["forget_proven_worst_conf_dist"] = round(worst(proven), 6)
        for share in SHARES:
            out[f"forget_proven_share_{round(share * 100):02d}"] = round(
                sum(value <= share for value in proven) / count, 6)
    radius = columns.get("proven_radius")
    if radius:
        out["forget_proven_radius_min"] = min(radius)
        out["forget_proven_radius_median"] = statistics.median(radius)
    return out


def per_image_rows(ids: list[str], stages: dict[str, dict[str, list | None]]) -> list[dict]:
    """results.json `forget_per_image`: one row per forget image, {id, <stage>: {clean, attacked, proven,
    proven_radius}} (None where not measured; the radius in units of 1/255)."""
    rows = []
    for i, image_id in enumerate(ids):
        row: dict = {"id": image_id}
        for stage, columns in stages.items():
            row[stage] = {kind: (None if columns.get(kind) is None else round(float(columns[kind][i]), 6))
                          for kind in (*KINDS, "proven_radius")}
        rows.append(row)
    return rows


@dataclass(frozen=True)
class GateVerdict:
    """results.json `release_gate`: whether `stage`'s model is released as protected, what it was judged by, every
    reason it is not and the images that fail; built once, by judge()."""

    passed: bool = field(metadata={"doc": "whether the model is released as protected"})
    stage: str = field(metadata={"doc": "the stage judged: the method's"})
    conf_dist_at_most: float = field(metadata={"doc": "the per-image threshold (release_gate.conf_dist_at_most)"})
    require: tuple[str, ...] = field(metadata={"doc": "the CDs every forget image must keep at most the threshold: "
                                                      "clean, attacked, proven"})
    gamma: float = field(metadata={"doc": "the radius the attacked and proven CDs are judged at, in 1/255"})
    min_proven_radius: float | None = field(metadata={"doc": "the proven radius every image must reach, "
                                                                "in 1/255 (null: none)"})
    reasons: tuple[str, ...] = field(metadata={"doc": "every reason the model is not protected (empty when passed)"})
    failing_images: tuple[str, ...] = field(metadata={"doc": "the ids of the forget images that fail"})
    unrequired_above: dict[str, int] = field(metadata={"doc": "per CD the gate did not require but measured: how "
                                                              "many images are above the threshold"})
    DERIVED: ClassVar = (("folder", "str", "where the weights went: release when passed, else release_not_protected"),)

    @property
    def folder(self) -> str:
        """The release folder the verdict sends the weights to."""
        return PROTECTED_DIR if self.passed else NOT_PROTECTED_DIR

    def to_json(self) -> dict:
        return {"passed": self.passed, "stage": self.stage, "folder": self.folder,
                "conf_dist_at_most": self.conf_dist_at_most, "require": list(self.require), "gamma": self.gamma,
                "min_proven_radius": self.min_proven_radius, "reasons": list(self.reasons),
                "failing_images": list(self.failing_images), "unrequired_above": dict(self.unrequired_above)}


def judge(rows: list[dict], stage: str, reported: dict, settings: GateSettings, gamma: float,
          proof_note: str | None = None) -> GateVerdict:
    """The release gate's verdict on `stage`'s model from every forget image's `rows` and the numbers the method
    reported about how it got the model (`reported`: training steps, whether its weights changed, its
    early-stopping rule, robust Alg 1's radius rule)."""
    threshold = settings.conf_dist_at_most
    reasons = how_obtained(reported, settings, gamma, all_proven(rows, stage, threshold))
    failing: list[str] = []
    if settings.min_proven_radius is not None:
        least = settings.min_proven_radius
        radii = [row[stage]["proven_radius"] for row in rows]
        if any(radius is None for radius in radii):
            reasons.append(f"the proven radius of the forget images could not be computed "
                           f"({proof_note or 'not measured'})")
        else:
            short = [row["id"] for row, radius in zip(rows, radii) if not radius >= least]
            if short:
                reasons.append(f"{len(short)} of {len(rows)} forget images are proven within less than {least:g}/255 "
                               f"(min {min(radii):g}/255)")
                failing += [image for image in short if image not in failing]
    for kind in settings.require:
        values = [row[stage][kind] for row in rows]
        if any(value is None for value in values):
            why = proof_note if kind == "proven" and proof_note else "not measured"
            reasons.append(f"the {kind} CD of the forget images could not be computed ({why})")
            continue
        bad = [row["id"] for row, value in zip(rows, values) if not value <= threshold]  # NaN is never at most
        if bad:
            where = "" if kind == "clean" else f" at {gamma:g}/255"
            reasons.append(f"{len(bad)} of {len(rows)} forget images keep {kind} CD > {threshold:g}{where}")
            failing += [image for image in bad if image not in failing]
    return GateVerdict(passed=not reasons, stage=stage, conf_dist_at_most=threshold, require=tuple(settings.require),
                       gamma=gamma, min_proven_radius=settings.min_proven_radius, reasons=tuple(reasons),
                       failing_images=tuple(failing), unrequired_above=unrequired_above(rows, stage, settings))


def all_proven(rows: list[dict], stage: str, threshold: float) -> bool:
    """Whether the bound proves every forget image's CD at most `threshold` in the ball judged (`stage`'s proven
    CDs in `rows`, as this assessment recomputed them; unmeasured and NaN are no proof)."""
    values = [row[stage]["proven"] for row in rows]
    return bool(values) and all(value is not None and value <= threshold for value in values)


def how_obtained(reported: dict, settings: GateSettings, gamma: float, proven: bool = False) -> list[str]:
    """The gate's reasons about how the method got its model rather than about any image: no training step, no
    weight changed, the early-stopping rule never met, robust Alg 1's radius fallback (none when `proven`: every
    forget image proven at `gamma`)."""
    reasons = []
    if reported.get("train_steps") == 0:
        reasons.append("the method took 0 training steps")
    elif reported.get("weights_changed") is False:
        reasons.append("the method left every weight unchanged (is the learning rate too small to move them?)")
    if reported.get("constraint_met") is False:
        rule = reported.get("stopping_rule")
        reasons.append("no epoch met the early-stopping rule" + (f" ({rule})" if rule else ""))
    fallback = None if proven else radius_fallback(reported, settings, gamma)
    if fallback:
        reasons.append(fallback)
    unconfirmed = budget_unconfirmed(reported.get("retain_confirmed"))
    if unconfirmed and reported.get("constraint_met") is not False:  # (no epoch met the rule: said above)
        reasons.append(unconfirmed)
    return reasons


def budget_unconfirmed(confirmed: dict | None) -> str | None:
    """The retain rule selected its epoch on one half of the held-out images; on the other half (the
    confirmation images, which nothing selected by: assess/confirmation.py) the kept weights must meet it too.
    The reason when they do not (recomputed from the accuracies, never from the record's `passes`; NaN fails);
    None when they do or nothing was confirmed."""
    if not confirmed:
        return None
    kept, threshold = float(confirmed["kept_acc"]), float(confirmed["threshold"])
    if kept >= threshold - 1e-12:
        return None
    reference = "A(D)'s on them" if confirmed.get("paired") else "A(D)'s on the test split"
    return (f"the kept epoch's accuracy on the {confirmed['images']} confirmation images (held out, never selected "
            f"by) is {kept:.2%}, below the retain rule's {threshold:.2%} there: a cost of "
            f"{100 * float(confirmed['cost']):.2f} points against {reference} (at most "
            f"{100 * float(confirmed['cost_upper']):.2f} at {float(confirmed['confidence']):.0%})")


def radius_fallback(metrics: dict, settings: GateSettings, gamma: float) -> str | None:
    """Robust Alg 1's radius rule trades the training radius for retain accuracy; a release whose kept epoch
    trained below both its training radius and the radius it is judged at (`gamma`) gave the robustness away to
    keep the rule, and is not judged at a smaller radius in silence: that is a gate failure whenever the gate
    judges the ball (attacked or proven CDs), even if the attack at `gamma` found nothing. The one exception is
    the gate's (how_obtained's `proven`): where the bound proves every image at `gamma`, no attack can exceed the
    threshold whatever radius the epoch trained at, and robustness was not given away."""
    kept, target = metrics.get("train_gamma_kept"), metrics.get("train_gamma_target")
    if kept is None or target is None or not set(settings.require) & {"attacked", "proven"}:
        return None
    if float(kept) >= min(float(target), gamma):  # NaN is a fallback
        return None
    return (f"the kept epoch trained at radius {kept:g}/255: the radius rule fell back from {float(target):g}/255 "
            f"to keep the retain rule, below the {gamma:g}/255 the release is judged at")


def unrequired_above(rows: list[dict], stage: str, settings: GateSettings) -> dict[str, int]:
    """{kind: images above the threshold} for the measured kinds the gate did not require, so a release that
    passed at the images but not within the radius says so (console line, model card)."""
    out = {}
    for kind in KINDS:
        values = [row[stage][kind] for row in rows]
        if kind not in settings.require and values and all(value is not None for value in values):
            above = sum(not value <= settings.conf_dist_at_most for value in values)
            if above:
                out[kind] = above
    return out


def unrequired_note(record: dict, forget_size: int) -> str:
    """'' or the sentence saying which CDs the gate did not require exceed its threshold, within the radius."""
    above = record.get("unrequired_above") or {}
    if not above:
        return ""
    parts = ", ".join(f"{kind} CD > {record['conf_dist_at_most']:g} for {count} of {forget_size} images"
                      for kind, count in above.items())
    return (f"not required by the gate and not met within {record['gamma']:g}/255: {parts} "
            f"(release_gate.require=[clean,{','.join(above)}] would refuse this release)")


def masking_note(checks: dict | None, forget_size: int) -> str:
    """'' or the sentence saying that the attacked CDs rest on surrogate gradients: the exact input gradient of
    every objective is zero at some forget images (dead ReLUs, a saturated softmax), where an attack that reads
    it learns nothing, so the attacked CD there can understate what an attacker reaches (gradient masking)."""
    share = (checks or {}).get("zero_gradient_share") or 0.0
    if not share > 0:
        return ""
    count = round(share * forget_size)
    return (f"the exact input gradient is zero at {count} of {forget_size} forget images: the attacked CD there rests on "
            "the attack's ReLU surrogates and random starts and may understate what an attacker reaches (gradient "
            "masking); only the proven bound proves a CD")


def gate_line(verdict: GateVerdict) -> str:
    """The one line a failed gate prints (every failing image is in results.json)."""
    shown = verdict.failing_images[:SHOWN_IDS]
    more = len(verdict.failing_images) - len(shown)
    images = f" ({', '.join(shown)}{f', and {more} more' if more > 0 else ''})" if shown else ""
    return (f"not protected: {'; '.join(verdict.reasons)}{images}; the weights are in {verdict.folder}/, "
            f"not released as protected (exit {EXIT_NOT_PROTECTED})")


@dataclass(frozen=True)
class ProvenBounds:
    """One stage's proven bounds on the forget images: {gamma: each image's proven CD}, each image's
    proven radius (1/255), the bound that gave them (linear or interval, with CROWN's intermediate mode), and
    why there is none (`by_gamma` None) or why the linear bound fell back to intervals."""

    by_gamma: dict[str, list[float]] | None
    radius: list[float] | None
    bound: str | None = None
    intermediate: str | None = None
    note: str | None = None
    slope_steps: int = 0
    rule: dict | None = None  # bounds.kind=auto: the choice's record (bounds/choice.BoundChoice.to_json)
    seconds: float | None = None  # the wall time of these bounds, the choice's included
    same_as_rule: bool = False  # bounds.kind=auto: the bound another stage's rule chose (proven_bounds' same_as)


def bound_name(record: dict) -> str | None:
    """A stage's bound in words: intervals, CROWN-IBP (CROWN with interval pre-activation bounds), CROWN, or
    alpha-CROWN (CROWN with optimised ReLU slopes)."""
    if not record.get("bound"):
        return None
    if record["bound"] == "interval":
        return "intervals"
    if record.get("intermediate") != "crown":
        return "CROWN-IBP"
    return "alpha-CROWN" if record.get("slope_steps") else "CROWN"


def proven_bounds(net: nn.Module, images: torch.Tensor, gammas: list[float], device, bounds,
                     threshold: float, same_as: ProvenBounds | None = None) -> ProvenBounds:
    """Every image's proven CD at each radius and its proven radius at `threshold`, by `bounds`
    (config.schema.BoundsSchema; with kind=auto the bound bounds/choice.py picks, or, given `same_as`, the bound
    another stage of the same architecture used; the proven column reads "-" when the network has a layer no bound
    supports)."""
    start = time.perf_counter()
    kind, intermediate, slopes, rule = str(bounds.kind), str(bounds.intermediate), int(bounds.slope_steps), None
    reused = kind == "auto" and same_as is not None and same_as.rule is not None
    if reused:  # what the other stage's rule chose (its slope steps as chosen, not as that network used them)
        chosen = same_as.rule
        kind, intermediate, slopes = chosen["bound"], chosen["intermediate"] or "ibp", chosen["slope_steps"]
    elif kind == "auto":
        choice = choose_bound(net, images, threshold, float(bounds.radius_step), float(bounds.max_radius),
                              float(bounds.seconds_per_image), device, slopes)
        kind, intermediate, slopes, rule = choice.bound, choice.intermediate or "ibp", choice.slope_steps, \
            choice.to_json()
    prover = Prover(net, kind, device, intermediate=intermediate,
                          budget=int(bounds.intermediate_budget), slope_steps=slopes)
    try:
        by_gamma = {f"{float(g):g}": prover.conf_dist(images, float(g)).tolist() for g in gammas}
        radius = prover.radius(images, threshold, float(bounds.radius_step), float(bounds.max_radius),
                                  known={float(g): values for g, values in by_gamma.items()}).tolist()
    except UnsupportedLayer as exc:
        log.warning("no proven CD for this network: %s", exc)
        return ProvenBounds(None, None, note=str(exc), rule=rule, seconds=round(time.perf_counter() - start, 3),
                            same_as_rule=reused)
    if prover.fallback:
        log.warning("linear bounds fell back to interval bounds: %s", prover.fallback)
    return ProvenBounds(by_gamma, radius, prover.bound,
                           prover.intermediate if prover.bound == "linear" else None, prover.fallback,
                           prover.slopes_used, rule, round(time.perf_counter() - start, 3), reused)
