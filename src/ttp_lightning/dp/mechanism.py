"""The Gaussian mechanism: noise sigma for a sensitivity Delta and an (epsilon, delta) budget, and back,
for one release or for k releases that compose.

One release (Algs 2, 3, and Alg 4 releasing only its final model):
- epsilon in (0, 1): the paper's classical calibration sigma = Delta / epsilon * sqrt(2 ln(1.25 / delta));
- epsilon >= 1: the analytic Gaussian mechanism of Balle and Wang (2018), exact for every epsilon, as
  implemented by Google's `dp-accounting` (`gaussian_mechanism.get_sigma_gaussian` /
  `get_epsilon_gaussian`, noise multipliers for sensitivity 1).

k releases (Alg 4 releasing the model after every request): each release adds fresh noise N(0, sigma^2 I)
to a point that is within Delta of its target, so the k releases together are one Gaussian mechanism whose
mean shift has norm at most sqrt(k) Delta. Their privacy loss is that of the analytic Gaussian mechanism
with noise multiplier sigma / (sqrt(k) Delta) - the identity dp-accounting's PLD accountant itself uses to
self-compose Gaussian events (tested against its PLDAccountant). Never Delta / k: the paper's Alg 4 states
sigma = Delta / (k epsilon) sqrt(2 ln(1.25 / delta)), which understates epsilon (docs/certified.md, the erratum).
"""

import math

from dp_accounting import gaussian_mechanism

CLASSICAL, ANALYTIC = "classical", "analytic_gaussian"


def classical_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    return sensitivity / epsilon * math.sqrt(2.0 * math.log(1.25 / delta))


def _effective(sensitivity: float, releases: int) -> float:
    return sensitivity * math.sqrt(releases)


def noise_sigma(sensitivity: float, epsilon: float, delta: float, releases: int = 1) -> tuple[float, str]:
    """sigma for (epsilon, delta) over `releases` composed releases, and the name of the calibration."""
    if not (epsilon > 0 and 0 < delta < 1 and sensitivity > 0 and releases >= 1):
        raise ValueError(f"need epsilon > 0, delta in (0, 1), Delta > 0, releases >= 1 "
                         f"(got {epsilon}, {delta}, {sensitivity}, {releases})")
    if epsilon < 1 and releases == 1:
        return classical_sigma(sensitivity, epsilon, delta), CLASSICAL
    return _analytic_multiplier(epsilon, delta) * _effective(sensitivity, releases), ANALYTIC


def _analytic_multiplier(epsilon: float, delta: float) -> float:
    """dp-accounting's noise multiplier, searched to a tolerance relative to its size (its default is absolute,
    1e-12, coarse for the tiny multipliers of huge epsilons) and never below what (epsilon, delta) needs."""
    multiplier = float(gaussian_mechanism.get_sigma_gaussian(epsilon, delta))
    multiplier = float(gaussian_mechanism.get_sigma_gaussian(epsilon, delta, tol=multiplier * 1e-12))
    while gaussian_mechanism.get_epsilon_gaussian(multiplier, delta) > epsilon:
        multiplier *= 1 + 1e-9
    return multiplier


def implied_epsilon(sensitivity: float, sigma: float, delta: float, releases: int = 1) -> tuple[float, str]:
    """The epsilon that noise sigma certifies at delta over `releases` composed releases."""
    if not (sigma > 0 and 0 < delta < 1 and sensitivity > 0 and releases >= 1):
        raise ValueError(f"need sigma > 0, delta in (0, 1), Delta > 0, releases >= 1 "
                         f"(got {sigma}, {delta}, {sensitivity}, {releases})")
    classical = sensitivity / sigma * math.sqrt(2.0 * math.log(1.25 / delta))
    if classical < 1 and releases == 1:
        return classical, CLASSICAL
    epsilon = gaussian_mechanism.get_epsilon_gaussian(sigma / _effective(sensitivity, releases), delta)
    return float(epsilon), ANALYTIC
