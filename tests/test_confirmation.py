"""The confirmed accuracy cost (assess/confirmation.py): its bounds against exact values and sampled coverage."""

import math

import numpy as np
import pytest

from ttp_lightning.assess.confirmation import (
    CONFIDENCE,
    binomial_lower,
    binomial_upper,
    bound_selected,
    confirm_against_reference,
    confirm_paired,
    paired_cost_upper,
    reference_cost_upper,
    threshold_for,
)


def test_clopper_pearson_at_the_ends_is_exact():
    """0 of n: the upper bound solves (1 - p)^n = alpha; n of n: the lower bound solves p^n = alpha."""
    for n in (1, 10, 2000):
        assert binomial_upper(0, n, 0.05) == pytest.approx(1 - 0.05 ** (1 / n), rel=1e-9)
        assert binomial_lower(n, n, 0.05) == pytest.approx(0.05 ** (1 / n), rel=1e-9)
        assert binomial_upper(n, n, 0.05) == 1.0 and binomial_lower(0, n, 0.05) == 0.0
    assert binomial_upper(0, 0, 0.05) == 1.0 and binomial_lower(0, 0, 0.05) == 0.0
    with pytest.raises(ValueError):
        binomial_upper(3, 2, 0.05)


def test_clopper_pearson_against_the_binomial_tail():
    """The upper bound u on k of n is where P(X <= k | u) = alpha."""
    from scipy.stats import binom
    for k, n in ((3, 40), (20, 124), (66, 2000)):
        upper, lower = binomial_upper(k, n, 0.025), binomial_lower(k, n, 0.025)
        assert binom.cdf(k, n, upper) == pytest.approx(0.025, rel=1e-6)
        assert binom.sf(k - 1, n, lower) == pytest.approx(0.025, rel=1e-6)
        assert lower < k / n < upper


@pytest.mark.parametrize("lost_p, gained_p, images", [(0.02, 0.01, 2000), (0.01, 0.01, 1000), (0.03, 0.005, 124),
                                                      (0.002, 0.0, 500), (0.0, 0.01, 300)])
def test_paired_bound_covers_the_true_cost(lost_p, gained_p, images):
    """Sampled trinomial readings: the bound is at least the true cost p_lost - p_gained in at least 95 % of
    them (conservative: every case here covers more), and it is not vacuous."""
    rng = np.random.default_rng(0)
    draws = rng.multinomial(images, [lost_p, gained_p, 1 - lost_p - gained_p], size=2000)
    truth = lost_p - gained_p
    bounds = np.array([paired_cost_upper(int(lost), int(gained), images) for lost, gained, _ in draws])
    assert (bounds >= truth).mean() >= CONFIDENCE
    point = (draws[:, 0] - draws[:, 1]) / images
    assert (point >= truth).mean() < 0.75  # the point estimate alone covers about half the time
    assert np.median(bounds - point) < 6 * math.sqrt(max(lost_p + gained_p, 1 / images) / images) + 4 / images


def test_the_union_bound_holds_for_the_epoch_a_rule_picks_where_the_plain_bound_does_not():
    """Unsplit held-out images (digits' 248): 100 epochs of the same true cost (4 points) read on the same images
    and the one read cheapest kept, the worst case of selection (independent readings spread most). The plain
    bound on the kept epoch covers the truth in about a third of the trials; the union over the 100 in at least
    95 %."""
    rng = np.random.default_rng(1)
    images, epochs, lost_p, gained_p = 248, 100, 0.04, 0.0
    plain, union = [], []
    for _ in range(400):
        draws = rng.multinomial(images, [lost_p, gained_p, 1 - lost_p - gained_p], size=epochs)
        lost, gained, _ = draws[np.argmin(draws[:, 0] - draws[:, 1])]
        plain.append(paired_cost_upper(int(lost), int(gained), images) >= lost_p - gained_p)
        start = [True] * images
        kept = [False] * int(lost) + [True] * (images - int(lost))
        start[images - int(gained):] = [False] * int(gained)
        union.append(bound_selected(start, kept, epochs).cost_upper >= lost_p - gained_p)
    assert np.mean(plain) < 0.5 and np.mean(union) >= CONFIDENCE


def test_bound_selected_is_the_paired_bound_at_alpha_over_the_epochs():
    start = [True] * 240 + [False] * 8
    kept = [False] * 3 + [True] * 237 + [True] + [False] * 7
    selected = bound_selected(start, kept, 68)
    assert (selected.lost, selected.gained, selected.images, selected.compared) == (3, 1, 248, 68)
    assert selected.cost == pytest.approx(2 / 248)
    assert selected.cost_upper == pytest.approx(paired_cost_upper(3, 1, 248, 0.05 / 68))
    assert selected.cost_upper > paired_cost_upper(3, 1, 248) > selected.cost
    assert bound_selected(start, kept, 1).cost_upper == pytest.approx(paired_cost_upper(3, 1, 248))
    for bad in ((start, kept[:-1], 68), ([], [], 68), (start, kept, 0)):
        with pytest.raises(ValueError):
            bound_selected(*bad)


def test_paired_bound_cases():
    assert paired_cost_upper(0, 0, 1000) == pytest.approx(binomial_upper(0, 1000, 0.0125), rel=1e-9)
    assert paired_cost_upper(0, 30, 1000) < 0  # only gains: a certain gain of accuracy
    assert paired_cost_upper(30, 0, 1000) > 0.03
    assert paired_cost_upper(1, 0, 1) == 1.0
    with pytest.raises(ValueError):
        paired_cost_upper(600, 500, 1000)


def test_reference_bound_covers_the_true_cost():
    rng = np.random.default_rng(1)
    kept_p, reference_p, images, reference_images = 0.95, 0.96, 1000, 10000
    kept = rng.binomial(images, kept_p, size=2000)
    reference = rng.binomial(reference_images, reference_p, size=2000)
    bounds = np.array([reference_cost_upper(int(k), images, int(r), reference_images) for k, r in zip(kept, reference)])
    assert (bounds >= reference_p - kept_p).mean() >= CONFIDENCE


def test_confirm_paired_record():
    start = [True] * 90 + [False] * 10
    kept = [True] * 85 + [False] * 5 + [True] * 2 + [False] * 8  # 5 lost, 2 gained
    confirmed = confirm_paired(start, kept, at_least=0.0, drop_at_most=0.01)
    assert (confirmed.lost, confirmed.gained, confirmed.images) == (5, 2, 100)
    assert confirmed.cost == pytest.approx(0.03) and confirmed.start_acc == pytest.approx(0.9)
    assert confirmed.threshold == pytest.approx(0.89) and not confirmed.passes
    assert confirmed.cost_upper >= confirmed.cost
    assert confirm_paired(start, start, 0.0, 0.01).passes
    record = confirmed.to_json()
    assert record["passes"] is False and record["paired"] is True and record["confidence"] == CONFIDENCE
    with pytest.raises(ValueError):
        confirm_paired(start, kept[:-1], 0.0, 0.01)


def test_confirm_against_reference_record():
    kept = [True] * 95 + [False] * 5
    confirmed = confirm_against_reference(kept, 0.97, 539, at_least=0.0, drop_at_most=0.01)
    assert not confirmed.paired and confirmed.reference_images == 539
    assert confirmed.cost == pytest.approx(0.02) and not confirmed.passes
    assert confirmed.cost_upper > confirmed.cost
    with pytest.raises(ValueError):
        confirm_against_reference(kept, math.nan, 539, 0.0, 0.01)


def test_threshold_for():
    assert threshold_for(0.95, 0.0, 0.01) == pytest.approx(0.94)
    assert threshold_for(0.95, 0.96, 0.01) == 0.96
    assert threshold_for(0.95, 0.5, None) == 0.5
