"""The noise of a certified release: the secret stream, the Gaussian mechanism's calibration for one release
and for k composed releases (checked against dp-accounting's PLD accountant and a closed form written here),
and the calibration a certificate states."""

import math

import pytest
import torch
from scipy import stats

from ttp_lightning.dp.mechanism import ANALYTIC, CLASSICAL, classical_sigma, implied_epsilon, noise_sigma
from ttp_lightning.dp.noise import fresh_seed, gaussian_noise, noise_norm_bound


def balle_wang_delta(sigma: float, sensitivity: float, epsilon: float) -> float:
    """Thm. 8 of Balle and Wang (2018), written out here independently of any library."""
    a, b = sensitivity / (2 * sigma), epsilon * sigma / sensitivity
    return stats.norm.cdf(a - b) - math.exp(epsilon) * stats.norm.cdf(-a - b)


def test_noise_stream_is_a_deterministic_function_of_a_fresh_secret_seed():
    seed = fresh_seed()
    assert len(seed) == 64 and int(seed, 16) >= 0 and fresh_seed() != seed
    first = gaussian_noise(seed, 100_001)
    assert first.dtype == torch.float64 and len(first) == 100_001
    assert torch.equal(first, gaussian_noise(seed, 100_001))  # reproducible from the audit record
    assert torch.equal(first[:10], gaussian_noise(seed, 10))  # a prefix does not depend on the length
    other_stream, other_seed = gaussian_noise(seed, 100_001, stream=1), gaussian_noise(fresh_seed(), 100_001)
    for other in (other_stream, other_seed):
        assert abs(torch.corrcoef(torch.stack([first, other]))[0, 1].item()) < 0.02
    assert abs(first.mean().item()) < 0.01 and first.std().item() == pytest.approx(1.0, abs=0.01)
    assert stats.kstest(first.numpy(), "norm").pvalue > 1e-3
    with pytest.raises(ValueError, match="32 bytes"):
        gaussian_noise("00" * 8, 4)  # a short (enumerable) seed is refused


def test_noise_norm_bound_holds_with_room():
    sigma, dim = 0.3, 7850
    norms = [sigma * gaussian_noise(fresh_seed(), dim).norm().item() for _ in range(20)]
    assert max(norms) < noise_norm_bound(sigma, dim) < 1.1 * sigma * math.sqrt(dim)


def test_one_release_calibration_is_the_paper_below_one_and_analytic_above():
    sigma, name = noise_sigma(0.2, 0.5, 1e-5)
    assert name == CLASSICAL and sigma == pytest.approx(0.2 / 0.5 * math.sqrt(2 * math.log(1.25e5)))
    sigma, name = noise_sigma(0.2, 3.0, 1e-5)
    assert name == ANALYTIC
    assert balle_wang_delta(sigma, 0.2, 3.0) <= 1e-5 * (1 + 1e-6) and balle_wang_delta(0.99 * sigma, 0.2, 3.0) > 1e-5
    assert noise_sigma(1.0, 1.0, 1e-5)[0] == pytest.approx(3.7306, abs=1e-4)  # dp-accounting's get_sigma_gaussian
    for epsilon in (0.3, 0.8, 2.0, 10.0, 2e12):
        sigma, _ = noise_sigma(0.05, epsilon, 1e-5)
        assert implied_epsilon(0.05, sigma, 1e-5)[0] == pytest.approx(epsilon, rel=1e-6)


def test_alg4_two_releases_at_epsilon_one_match_the_pld_accountant_and_the_closed_form():
    """Must-show: Alg 4 with 2 requests, each released (release=each), epsilon 1, delta 1e-5."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    delta_bound, k = 7.5, 2
    sigma, name = noise_sigma(delta_bound, 1.0, 1e-5, releases=k)
    assert name == ANALYTIC
    # closed form: k Gaussian releases of sensitivity Delta = one of sensitivity sqrt(k) Delta
    assert balle_wang_delta(sigma, math.sqrt(k) * delta_bound, 1.0) == pytest.approx(1e-5, rel=1e-6)
    # the maintained accountant composing two Gaussian events at the noise multiplier sigma / Delta
    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(sigma / delta_bound), k)
    assert accountant.get_epsilon(1e-5) == pytest.approx(1.0, abs=2e-3)
    calibrated = dp_accounting.calibrate_dp_mechanism(
        pld_privacy_accountant.PLDAccountant,
        lambda z: dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), k), 1.0, 1e-5,
        dp_accounting.LowerEndpointAndGuess(0.1, 5.0), tol=1e-6)
    assert sigma == pytest.approx(calibrated * delta_bound, rel=2e-3)
    # the paper's sigma = Delta / (k epsilon) sqrt(2 ln(1.25/delta)) is far below what two releases need ...
    paper = classical_sigma(delta_bound, 1.0, 1e-5) / k
    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(paper / delta_bound), k)
    assert accountant.get_epsilon(1e-5) > 2.0
    # ... and the final model alone (release=final) is one Gaussian release of sensitivity Delta
    assert noise_sigma(delta_bound, 1.0, 1e-5, releases=1)[0] == pytest.approx(3.7306 * delta_bound, rel=1e-4)
    assert implied_epsilon(delta_bound, sigma, 1e-5, releases=k)[0] == pytest.approx(1.0, rel=1e-6)


def test_calibration_in_a_certificate_counts_the_releases_that_compose():
    from omegaconf import OmegaConf

    from ttp_lightning.certified.common import calibrate_noise

    step = {"lam_min_measured": -0.1, "residual": 0.01, "gradient_norm": 0.2}
    cert = {"algorithm": "alg4_online", "bound": "paper", "theta": 0.75, "lam": 2.0, "lam_min": -0.1,
            "lam_min_stated": 0.0, "norm_bound": 100.0, "hessian_lipschitz_forget": 1.0,
            "hessian_lipschitz_retain": 1.0, "grad_lipschitz_forget": 2.0, "grad_lipschitz_retain": 2.0,
            "gradient_bound": 0.2, "num_params": 650, "estimator": {"repeats": 4}, "steps": [step, step]}
    budget = OmegaConf.create({"sigma": None, "epsilon": 1.0, "delta": 1e-5})
    each = calibrate_noise(budget, {**cert, "release_model": "each"})
    final = calibrate_noise(budget, {**cert, "release_model": "final"})
    assert each["releases"] == 2 and final["releases"] == 1
    assert each["sigma"] == pytest.approx(math.sqrt(2) * final["sigma"], rel=1e-9)
    assert final["sigma"] == pytest.approx(noise_sigma(final["sensitivity"], 1.0, 1e-5)[0])
    fixed = calibrate_noise(OmegaConf.create({"sigma": 1e-3, "epsilon": 1.0, "delta": 1e-5}),
                            {**cert, "release_model": "each"})
    assert fixed["sigma_source"] == "config" and fixed["epsilon"] > 1e9  # the paper's sigma: vacuous
