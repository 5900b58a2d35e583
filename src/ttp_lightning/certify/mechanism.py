"""The Gaussian mechanism: noise sigma for a sensitivity Delta and an (epsilon, delta) budget, and back.

epsilon in (0, 1): the classical calibration sigma = Delta / epsilon * sqrt(2 ln(1.25 / delta)) (Alg 2).
epsilon >= 1: the analytic Gaussian mechanism of Balle and Wang (2018), exact for every epsilon: the
smallest sigma with Phi(Delta/(2 sigma) - epsilon sigma/Delta) - e^epsilon Phi(-Delta/(2 sigma) -
epsilon sigma/Delta) <= delta.
"""

import math

from scipy.special import log_ndtr

CLASSICAL, ANALYTIC = "classical", "analytic_gaussian"


def classical_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    return sensitivity / epsilon * math.sqrt(2.0 * math.log(1.25 / delta))


def analytic_delta(sigma: float, sensitivity: float, epsilon: float) -> float:
    """The delta that noise sigma achieves at epsilon (Balle and Wang 2018, Thm. 8)."""
    a = sensitivity / (2.0 * sigma)
    b = epsilon * sigma / sensitivity
    return math.exp(log_ndtr(a - b)) - math.exp(epsilon + log_ndtr(-a - b))


def _bisect(predicate, low: float, high: float, iterations: int = 200) -> float:
    """Smallest x in [low, high] with predicate(x) true, for a monotone predicate true at high."""
    for _ in range(iterations):
        middle = 0.5 * (low + high)
        low, high = (low, middle) if predicate(middle) else (middle, high)
    return high


def noise_sigma(sensitivity: float, epsilon: float, delta: float) -> tuple[float, str]:
    """sigma for (epsilon, delta) and the name of the calibration used."""
    if not (epsilon > 0 and 0 < delta < 1 and sensitivity > 0):
        raise ValueError(f"need epsilon > 0, delta in (0, 1), Delta > 0 (got {epsilon}, {delta}, {sensitivity})")
    if epsilon < 1:
        return classical_sigma(sensitivity, epsilon, delta), CLASSICAL
    high = classical_sigma(sensitivity, 1.0, delta) * 2
    return _bisect(lambda s: analytic_delta(s, sensitivity, epsilon) <= delta, 0.0, high), ANALYTIC


def implied_epsilon(sensitivity: float, sigma: float, delta: float) -> tuple[float, str]:
    """The epsilon that a given sigma certifies at delta (for configs that set sigma directly)."""
    classical = sensitivity / sigma * math.sqrt(2.0 * math.log(1.25 / delta))
    if classical < 1:
        return classical, CLASSICAL
    high = max(1.0, classical)
    while analytic_delta(sigma, sensitivity, high) > delta:
        high *= 2
    return _bisect(lambda e: analytic_delta(sigma, sensitivity, e) <= delta, 0.0, high), ANALYTIC
