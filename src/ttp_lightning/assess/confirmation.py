"""The accuracy a protection cost, confirmed on images no rule chose by (issue 79).

Alg 1's retain rule reads its cost on the withheld images it selects an epoch by, and picks one of up to
hundreds of epochs on those same images: the reading of the epoch it keeps flatters itself (the best of many
noisy readings sits above their mean). So the withheld images are split in two (alg1/method.retain_parts): the
rule selects on one half and the cost that the release gate, the frontier and the card state is read on the
other, the confirmation half, which nothing selects by. It is read once for the kept epoch, against A(D) on the
same images, and stated with a one-sided upper confidence bound:

  paired    A(D) never trained on the confirmation images (withheld from D, or the provider's val/): each image
            is right or wrong under A(D) and under the kept weights. The cost is (lost - gained) / n, `lost` the
            images A(D) got right and the kept weights wrong, `gained` the reverse. The bound: conditional on the
            m = lost + gained images that changed, lost ~ Binomial(m, q) (Clopper-Pearson upper bound on q at
            alpha / 2), and m ~ Binomial(n, s) (a two-sided Clopper-Pearson interval on s at alpha / 2); the cost
            is s (2q - 1), so with probability at least 1 - alpha it is at most s_U (2 q_U - 1) (s_L where that
            factor is negative). Exact, with no normal approximation; conservative.
  reference A(D) trained on them (the slice of a provider's checkpoint held out of finetuning only): the cost is
            A(D)'s accuracy on the test split minus the kept weights' on the confirmation images, bounded by
            the test reading's upper and the confirmation reading's lower Clopper-Pearson bound at alpha / 2 each.

Where the held-out images are too few to split (alg1/method.split_for_confirmation), the cost is read on the
images the rule selected by, and its bound must hold for whichever epoch the rule kept: a union (Bonferroni)
bound over every epoch the fit could have compared, each at alpha / epochs (`bound_selected`). It holds when the
training path did not itself read those images (no learning-rate back-off fired, no radius rule, one round):
the epochs compared are then one fixed sequence, whatever the rule kept from it.

No torch here: counts in, a typed record out, tested against sampled coverage (tests/test_confirmation.py).
"""

import math
from dataclasses import dataclass, field

from scipy.stats import beta

CONFIDENCE = 0.95  # the stated bound's one-sided confidence


def binomial_upper(successes: int, trials: int, alpha: float) -> float:
    """Clopper-Pearson: the one-sided upper bound on a binomial probability at confidence 1 - alpha."""
    _check_counts(successes, trials)
    if trials == 0 or successes >= trials:
        return 1.0
    return float(beta.ppf(1.0 - alpha, successes + 1, trials - successes))


def binomial_lower(successes: int, trials: int, alpha: float) -> float:
    """Clopper-Pearson: the one-sided lower bound on a binomial probability at confidence 1 - alpha."""
    _check_counts(successes, trials)
    if trials == 0 or successes <= 0:
        return 0.0
    return float(beta.ppf(alpha, successes, trials - successes + 1))


def _check_counts(successes: int, trials: int) -> None:
    if not (0 <= successes <= trials):
        raise ValueError(f"{successes} successes of {trials} trials")


def paired_cost_upper(lost: int, gained: int, images: int, alpha: float = 1.0 - CONFIDENCE) -> float:
    """The one-sided upper confidence bound (1 - alpha) on the accuracy cost p_lost - p_gained from `images`
    paired readings, `lost` of them right before and wrong after, `gained` the reverse (module docstring)."""
    changed = lost + gained
    _check_counts(changed, images)
    if images == 0:
        return 1.0
    q_upper = binomial_upper(lost, changed, alpha / 2)
    factor = 2.0 * q_upper - 1.0
    if factor >= 0:
        return min(1.0, binomial_upper(changed, images, alpha / 4) * factor)
    return binomial_lower(changed, images, alpha / 4) * factor


def reference_cost_upper(kept_right: int, images: int, reference_right: int, reference_images: int,
                         alpha: float = 1.0 - CONFIDENCE) -> float:
    """The one-sided upper confidence bound (1 - alpha) on the reference accuracy minus the kept accuracy, read on
    two independent sets (module docstring)."""
    return binomial_upper(reference_right, reference_images, alpha / 2) - binomial_lower(kept_right, images, alpha / 2)


@dataclass(frozen=True)
class ConfirmedCost:
    """results.json `retain_confirmed` (a method's metrics): the kept epoch's accuracy cost on the confirmation
    images, built once by confirm_paired or confirm_against_reference."""

    images: int = field(metadata={"doc": "the confirmation images (withheld, never selected by)"})
    start_acc: float = field(metadata={"doc": "A(D)'s accuracy the cost is relative to: on the confirmation "
                                              "images (paired), or on the test split (reference)"})
    kept_acc: float = field(metadata={"doc": "the kept weights' accuracy on the confirmation images"})
    cost: float = field(metadata={"doc": "start_acc - kept_acc (a fraction; negative: a gain)"})
    cost_upper: float = field(metadata={"doc": "its one-sided upper confidence bound at `confidence`"})
    confidence: float = field(metadata={"doc": "the bound's confidence"})
    threshold: float = field(metadata={"doc": "the accuracy the kept weights must reach there: the retain rule's "
                                              "tau_r, relative to start_acc"})
    paired: bool = field(metadata={"doc": "A(D) read on the same images (it never trained on them); false: "
                                          "against its test-split accuracy"})
    lost: int | None = field(default=None, metadata={"doc": "paired: images A(D) got right and the kept weights "
                                                            "wrong"})
    gained: int | None = field(default=None, metadata={"doc": "paired: images A(D) got wrong and the kept weights "
                                                              "right"})
    reference_images: int | None = field(default=None, metadata={"doc": "reference: the test images start_acc "
                                                                        "was read on"})

    @property
    def passes(self) -> bool:
        """Whether the kept weights meet the retain rule on the confirmation images (NaN never does)."""
        return bool(self.kept_acc >= self.threshold - 1e-12)

    def to_json(self) -> dict:
        return {"images": self.images, "start_acc": round(self.start_acc, 6), "kept_acc": round(self.kept_acc, 6),
                "cost": round(self.cost, 6), "cost_upper": round(self.cost_upper, 6), "confidence": self.confidence,
                "threshold": round(self.threshold, 6), "passes": self.passes, "paired": self.paired,
                "lost": self.lost, "gained": self.gained, "reference_images": self.reference_images}


def threshold_for(start_acc: float, at_least: float, drop_at_most: float | None) -> float:
    """tau_r on the confirmation images: the absolute `at_least`, raised to start_acc - `drop_at_most` when set
    (alg1/method.retain_threshold's rule, relative to the confirmation's own start)."""
    return at_least if drop_at_most is None else max(at_least, start_acc - float(drop_at_most))


def changes(start_right: list[bool], kept_right: list[bool]) -> tuple[int, int, float, float]:
    """(lost, gained, A(D)'s accuracy, the kept weights') from paired per-image correctness, in order."""
    if len(start_right) != len(kept_right) or not kept_right:
        raise ValueError(f"{len(start_right)} and {len(kept_right)} readings: one pair per image")
    lost = sum(bool(a) and not bool(k) for a, k in zip(start_right, kept_right))
    gained = sum(bool(k) and not bool(a) for a, k in zip(start_right, kept_right))
    images = len(kept_right)
    return lost, gained, sum(map(bool, start_right)) / images, sum(map(bool, kept_right)) / images


def confirm_paired(start_right: list[bool], kept_right: list[bool], at_least: float,
                   drop_at_most: float | None) -> ConfirmedCost:
    """The cost from each confirmation image's correctness under A(D) and under the kept weights, in order."""
    lost, gained, start, kept = changes(start_right, kept_right)
    images = len(kept_right)
    return ConfirmedCost(images, start, kept, start - kept, paired_cost_upper(lost, gained, images), CONFIDENCE,
                         threshold_for(start, at_least, drop_at_most), True, lost, gained)


def confirm_against_reference(kept_right: list[bool], reference_acc: float, reference_images: int, at_least: float,
                              drop_at_most: float | None) -> ConfirmedCost:
    """The cost of the kept weights on the confirmation images against A(D)'s accuracy on `reference_images`
    other images (the test split)."""
    if not kept_right or reference_images <= 0 or not math.isfinite(reference_acc):
        raise ValueError("a reference cost needs confirmation images and a finite reference accuracy")
    images = len(kept_right)
    right = sum(map(bool, kept_right))
    reference_right = round(reference_acc * reference_images)
    upper = reference_cost_upper(right, images, reference_right, reference_images)
    return ConfirmedCost(images, reference_acc, right / images, reference_acc - right / images, upper, CONFIDENCE,
                         threshold_for(reference_acc, at_least, drop_at_most), False,
                         reference_images=reference_images)


@dataclass(frozen=True)
class SelectedCost:
    """results.json `retain_selected` (a method's metrics): the kept epoch's cost on the images the retain rule
    selected it by (too few to split), with a bound that accounts for every epoch compared (module docstring),
    built once by bound_selected."""

    images: int = field(metadata={"doc": "the held-out images the rule read every epoch"})
    compared: int = field(metadata={"doc": "the epochs the fit could compare on them (the union's size)"})
    start_acc: float = field(metadata={"doc": "A(D)'s accuracy on them (it never trained on them)"})
    kept_acc: float = field(metadata={"doc": "the kept weights' accuracy on them"})
    cost: float = field(metadata={"doc": "start_acc - kept_acc (a fraction; negative: a gain), as the rule read it"})
    cost_upper: float = field(metadata={"doc": "its one-sided upper bound at `confidence`, over all `compared`"})
    confidence: float = field(metadata={"doc": "the bound's confidence"})
    lost: int = field(metadata={"doc": "images A(D) got right and the kept weights wrong"})
    gained: int = field(metadata={"doc": "images A(D) got wrong and the kept weights right"})

    def to_json(self) -> dict:
        return {"images": self.images, "compared": self.compared, "start_acc": round(self.start_acc, 6),
                "kept_acc": round(self.kept_acc, 6), "cost": round(self.cost, 6),
                "cost_upper": round(self.cost_upper, 6), "confidence": self.confidence, "lost": self.lost,
                "gained": self.gained}


def bound_selected(start_right: list[bool], kept_right: list[bool], compared: int,
                   alpha: float = 1.0 - CONFIDENCE) -> SelectedCost:
    """The cost of an epoch kept from `compared` epochs, all read on the same images (each image's correctness
    under A(D) and under the kept weights, in order): paired_cost_upper at alpha / compared."""
    if compared < 1:
        raise ValueError(f"{compared} epochs compared: at least 1")
    lost, gained, start, kept = changes(start_right, kept_right)
    images = len(kept_right)
    return SelectedCost(images, compared, start, kept, start - kept,
                        paired_cost_upper(lost, gained, images, alpha / compared), 1.0 - alpha, lost, gained)
