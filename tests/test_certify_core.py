"""Certified-learner math: HVPs against finite differences and explicit Hessians, the stochastic
inverse-Hessian estimator against exact solves, power iteration, and the Gaussian mechanism."""

import math

import pytest
import torch
from torch import nn

from test_modules import tiny_sets
from ttp_lightning.certify import hessian as hessian_module
from ttp_lightning.certify.bounds import (
    estimator_depth,
    estimator_scale_b,
    estimator_sensitivity,
    exact_newton_sensitivity,
    theta_lower_bound,
    uniformity_bound,
)
from ttp_lightning.certify.estimator import power_iteration, stochastic_inverse_hvp
from ttp_lightning.certify.hessian import exact_hessian
from ttp_lightning.certify.hvp import ParetoCurvature, flatten, refresh_batchnorm, unflatten
from ttp_lightning.certify.mechanism import (
    ANALYTIC,
    CLASSICAL,
    analytic_delta,
    classical_sigma,
    implied_epsilon,
    noise_sigma,
)
from ttp_lightning.data.batching import ImageBatchDataset
from ttp_lightning.errors import TTPUserError
from ttp_lightning.models.classifier import Classifier
from ttp_lightning.objectives import kl_to_uniform, retain_loss, square_to_uniform


def curvature(lam=0.1, theta=0.6):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 5), nn.Tanh(), nn.Linear(5, 3))
    retain, forget = tiny_sets(n_retain=23, n_forget=7)
    # float64 so the comparisons below can be tight
    return ParetoCurvature(net, retain, forget, theta, kl_to_uniform, lam=lam, forget_temperature=2.0,
                           chunk_size=6, dtype=torch.float64)


def objective_of(curv: ParetoCurvature, flat_w: torch.Tensor) -> torch.Tensor:
    """The regularised Pareto objective as an explicit function of the flat weights (for autograd.hessian)."""
    params = unflatten(flat_w, curv.params)
    names = [n for n, p in curv.net.named_parameters() if p.requires_grad]
    state = dict(zip(names, params))

    def mean_loss(dataset, loss_fn):
        images, labels = dataset.everything()
        return loss_fn(torch.func.functional_call(curv.net, state, (images.double(),)), labels)

    return (curv.theta * mean_loss(curv.forget, curv.forget_loss)
            + (1 - curv.theta) * mean_loss(curv.retain, retain_loss) + 0.5 * curv.lam * flat_w.pow(2).sum())


def test_hvp_matches_the_explicit_hessian_and_the_gradient_matches_autograd():
    curv = curvature()
    w = flatten(p.detach() for p in curv.params)
    hessian = torch.autograd.functional.hessian(lambda v: objective_of(curv, v), w)
    vector = torch.randn(len(w), dtype=w.dtype, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(curv.hvp(vector), hessian @ vector, atol=1e-10)
    grad = torch.autograd.functional.jacobian(lambda v: objective_of(curv, v), w)
    assert torch.allclose(curv.gradient(), grad - curv.lam * w, atol=1e-10)  # no lambda * w pull


def test_hvp_matches_finite_differences_of_gradients():
    curv = curvature()
    w0 = flatten(p.detach() for p in curv.params)
    vector = torch.randn(len(w0), dtype=w0.dtype, generator=torch.Generator().manual_seed(2))
    finite = finite_difference_hvp(curv, vector, h=1e-5) - curv.lam * vector
    assert torch.allclose(curv.hvp(vector) - curv.lam * vector, finite, rtol=1e-5, atol=1e-8)


def random_psd(dim, generator, scale=1.0):
    a = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
    return scale * a @ a.T / dim


def test_estimator_converges_to_the_exact_solve():
    g = torch.Generator().manual_seed(0)
    dim, theta, lam = 6, 0.7, 0.5
    forget_h, retain_h = random_psd(dim, g), random_psd(dim, g, 2.0)
    exact_matrix = theta * forget_h + (1 - theta) * retain_h + lam * torch.eye(dim, dtype=torch.float64)
    gradient = torch.randn(dim, generator=g, dtype=torch.float64)
    exact = torch.linalg.solve(exact_matrix, gradient)

    def sample_hvp(part, rows):
        return rows @ (forget_h if part == "forget" else retain_h)  # symmetric: row i -> H v_i

    top = max(torch.linalg.eigvalsh(forget_h + lam / (2 * theta) * torch.eye(dim, dtype=torch.float64)).max(),
              torch.linalg.eigvalsh(retain_h + lam / (2 * (1 - theta)) * torch.eye(dim, dtype=torch.float64)).max())
    estimate = stochastic_inverse_hvp(gradient, sample_hvp, theta, lam, scale=float(top) * 1.1, depth=400,
                                      repeats=200, generator=torch.Generator().manual_seed(1))
    assert (estimate - exact).norm() / exact.norm() < 0.05


def test_estimator_reports_divergence_with_what_to_change():
    matrix = torch.diag(torch.tensor([10.0, 1.0], dtype=torch.float64))
    with pytest.raises(TTPUserError, match="diverged.*method.lam.*J"):
        stochastic_inverse_hvp(torch.ones(2, dtype=torch.float64), lambda part, rows: rows @ matrix, 0.5, 0.1,
                               scale=1.0, depth=200)
    with pytest.raises(TTPUserError, match=r"choose a value in \(0, 1\)"):
        stochastic_inverse_hvp(torch.ones(2), lambda part, v: v, 1.0, 0.1, scale=2.0, depth=5)


def test_power_iteration_finds_the_largest_eigenvalue():
    matrix = random_psd(8, torch.Generator().manual_seed(3))
    top = torch.linalg.eigvalsh(matrix).max().item()
    found = power_iteration(lambda v: matrix @ v.double(), 8, iterations=500,
                            generator=torch.Generator().manual_seed(0))
    assert found == pytest.approx(top, rel=1e-3)


def test_gaussian_mechanism_calibrations():
    sigma, name = noise_sigma(0.2, 0.5, 1e-5)
    assert name == CLASSICAL and sigma == pytest.approx(0.2 / 0.5 * math.sqrt(2 * math.log(1.25e5)))
    sigma, name = noise_sigma(0.2, 3.0, 1e-5)
    assert name == ANALYTIC
    assert analytic_delta(sigma, 0.2, 3.0) <= 1e-5 and analytic_delta(sigma * 0.99, 0.2, 3.0) > 1e-5
    # the analytic calibration is never looser than the classical one where both apply
    assert noise_sigma(0.2, 0.9, 1e-5)[0] >= _analytic_sigma(0.2, 0.9, 1e-5)


def _analytic_sigma(sensitivity, epsilon, delta):
    low, high = 1e-9, classical_sigma(sensitivity, epsilon, delta) * 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (low, mid) if analytic_delta(mid, sensitivity, epsilon) <= delta else (mid, high)
    return high


def test_implied_epsilon_round_trips():
    for epsilon in (0.3, 0.8, 2.0, 10.0):
        sigma, _ = noise_sigma(0.05, epsilon, 1e-5)
        assert implied_epsilon(0.05, sigma, 1e-5)[0] == pytest.approx(epsilon, rel=1e-6)


def test_exact_hessian_matches_autograd_and_refuses_large_models():
    curv = curvature()
    w = flatten(p.detach() for p in curv.params)
    expected = torch.autograd.functional.hessian(lambda v: objective_of(curv, v), w)
    found = exact_hessian(curv, max_params=1000, directions_per_pass=7)
    assert torch.allclose(found, expected, atol=1e-10) and torch.allclose(found, found.T, atol=1e-12)
    with pytest.raises(TTPUserError, match=r"model has 103 parameters, more than method.max_exact_params=100"):
        exact_hessian(curv, max_params=100)


def test_theta_lower_bound_meets_the_uniformity_bound():
    for epsilon, retain, classes in ((0.5, 59900, 10), (2.0, 1000, 100), (10.0, 50, 2)):
        theta = theta_lower_bound(epsilon, retain, classes)
        assert 0 < theta < 1
        assert uniformity_bound(theta, retain, classes) == pytest.approx(epsilon, rel=1e-9)
        assert uniformity_bound(min(1.0, theta * 1.01), retain, classes) < epsilon


def test_exact_newton_sensitivity_formula():
    # 2 C ((theta F_K + (1 - theta) F_A) C + lambda) / (lambda + lambda_min)
    assert exact_newton_sensitivity(10, 0.75, 1.0, 1.0, 1e-4, 0.0) == pytest.approx(2 * 10 * (10 + 1e-4) / 1e-4)
    assert exact_newton_sensitivity(2, 0.5, 3.0, 1.0, 0.5, 0.5) == pytest.approx(2 * 2 * (2 * 2 + 0.5) / 1.0)


def test_estimator_bound_pieces():
    b = estimator_scale_b(0.75, 0.1, 1.0, 1.0, forget_size=100, retain_size=59900)
    assert b == pytest.approx((0.75 + 0.1) / 100)
    n = estimator_depth(b, 0.1, 0.0, repeats=1)
    assert n == 1  # B / (lambda + lambda_min) < 1: the logarithm is non-positive, one step suffices
    assert estimator_depth(5.0, 0.1, 0.0, repeats=2) == math.ceil(2 * 50 * math.log(100))
    delta = estimator_sensitivity(10, 0.75, 1, 1, 1, 1, 0.1, 0.0, grad_norm=0.5, scale_b=b, zeta_min=0.1,
                                  dimension=7850, rho=0.05, repeats=4)
    newton = (2 * 10 * (10 + 0.1) + 0.5) / 0.1
    tail = (16 * b / 0.1 * math.sqrt(math.log(7850 / 0.05) / 4) + 1 / 16) * (2 * 10 + 0.5)
    assert delta == pytest.approx(newton + tail)


@pytest.mark.parametrize("uniformity", [kl_to_uniform, square_to_uniform])
def test_affine_model_hessian_equals_the_generic_one(uniformity, monkeypatch):
    torch.manual_seed(0)
    net = Classifier(nn.Sequential(nn.Flatten(), nn.Linear(16, 3)), mean=(0.5,), std=(0.3,))
    retain, forget = tiny_sets(n_retain=23, n_forget=7)
    curv = ParetoCurvature(net, retain, forget, 0.6, uniformity, lam=0.01, forget_temperature=2.0, chunk_size=6,
                           dtype=torch.float64)
    fast = exact_hessian(curv, max_params=1000)
    monkeypatch.setattr(hessian_module, "_sole_trainable_linear", lambda net, params: None)
    generic = exact_hessian(curv, max_params=1000)
    assert torch.allclose(fast, generic, atol=1e-10)


def test_sampled_hessians_average_to_the_part_hessian():
    curv = curvature()
    vector = torch.randn(sum(p.numel() for p in curv.params), dtype=torch.float64,
                         generator=torch.Generator().manual_seed(4))
    generator = torch.Generator().manual_seed(5)
    for part, dataset, loss_fn in (("forget", curv.forget, curv.forget_loss), ("retain", curv.retain, retain_loss)):
        exact = curv.part_mean(dataset, loss_fn, lambda loss: curv._hvp_of(loss, vector))
        sampled = curv.sample_hvp(part, vector[None], 20000, generator)[0]  # a large draw with replacement
        assert (sampled - exact).norm() / exact.norm() < 0.05
        rows = curv.sample_hvp(part, torch.stack([vector, vector, 2 * vector]), 2, generator)
        assert not torch.allclose(rows[0], exact, rtol=1e-3) and not torch.allclose(rows[0], rows[1])  # real samples
    # one forget instance: every draw is that instance, so each row is exactly its Hessian times the row
    single = ParetoCurvature(curv.net, curv.retain, ImageBatchDataset(curv.forget.images[:1], curv.forget.labels[:1]),
                             curv.theta, kl_to_uniform, forget_temperature=2.0, dtype=torch.float64)
    exact = single.part_mean(single.forget, single.forget_loss, lambda loss: single._hvp_of(loss, vector))
    rows = single.sample_hvp("forget", torch.stack([vector, -3 * vector]), 5, generator)
    assert torch.allclose(rows[0], exact, atol=1e-10) and torch.allclose(rows[1], -3 * exact, atol=1e-10)


def test_estimator_on_model_hessians_matches_the_exact_solve():
    curv = curvature(lam=0.5)
    gradient = curv.gradient()
    dim = len(gradient)
    matrix = torch.stack([curv.hvp(column) for column in torch.eye(dim, dtype=torch.float64)], dim=1)
    exact = torch.linalg.solve(matrix, gradient)
    generator = torch.Generator().manual_seed(0)
    scale = 1.5 * power_iteration(curv.hvp, dim, 50, generator)
    estimate = stochastic_inverse_hvp(gradient, lambda part, v: curv.sample_hvp(part, v, 16, generator), curv.theta,
                                      curv.lam, scale, depth=60, repeats=30, generator=generator)
    assert (estimate - exact).norm() / exact.norm() < 0.1


def test_batchnorm_statistics_are_recomputed_on_the_given_data_and_hvps_use_them_frozen():
    torch.manual_seed(0)
    net = nn.Sequential(nn.BatchNorm2d(1), nn.Flatten(), nn.Linear(16, 3))
    retain, forget = tiny_sets(n_retain=40, n_forget=5)
    images = retain.everything()[0]
    assert refresh_batchnorm(net, retain, chunk_size=len(retain))
    assert torch.allclose(net[0].running_var, images.var().reshape(1), rtol=1e-4)
    assert refresh_batchnorm(net, retain, chunk_size=7)  # uneven chunks: still the size-weighted mean
    assert torch.allclose(net[0].running_mean, images.mean().reshape(1), atol=1e-6)
    assert net[0].momentum == 0.1 and net.training
    assert not refresh_batchnorm(nn.Sequential(nn.Flatten(), nn.Linear(16, 3)), retain)

    curv = ParetoCurvature(net, retain, forget, 0.5, kl_to_uniform, lam=0.1, dtype=torch.float64)
    stats = net[0].running_mean.clone()
    w0 = flatten(p.detach() for p in curv.params)
    vector = torch.randn(len(w0), dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    product = curv.hvp(vector)
    assert torch.equal(net[0].running_mean, stats)  # no product moves the statistics
    assert (product - finite_difference_hvp(curv, vector)).norm() / product.norm() < 1e-6


def finite_difference_hvp(curv: ParetoCurvature, vector: torch.Tensor, h: float = 1e-5) -> torch.Tensor:
    """(H + lambda I) v from central differences of full-data gradients (curvature in float64)."""
    w0 = flatten(p.detach() for p in curv.params)

    def grad_at(w):
        curv.assign(w)
        return curv.gradient()

    result = (grad_at(w0 + h * vector) - grad_at(w0 - h * vector)) / (2 * h) + curv.lam * vector
    grad_at(w0)
    return result


def test_vit_hvp_matches_finite_differences_with_fused_attention_off():
    from ttp_lightning.models.vit import vision_transformer

    torch.manual_seed(0)
    net = vision_transformer(in_channels=1, image_size=4, num_classes=3, patch_size=2, embed_dim=8, depth=1,
                             num_heads=2)
    retain, forget = tiny_sets(n_retain=10, n_forget=3)
    curv = ParetoCurvature(net, retain, forget, 0.5, kl_to_uniform, lam=0.1, dtype=torch.float64)
    assert not any(getattr(m, "fused_attn", False) for m in net.modules())
    vector = torch.randn(sum(p.numel() for p in curv.params), dtype=torch.float64,
                         generator=torch.Generator().manual_seed(0))
    product = curv.hvp(vector)
    assert (product - finite_difference_hvp(curv, vector)).norm() / product.norm() < 1e-5


def test_certificate_sensitivity_dispatch_and_estimator_depth_check(tmp_path):
    from ttp_lightning.certify.certificate import (
        ONLINE,
        calibrated_sensitivity,
        check_certificate,
        recomputed_sensitivity,
        required_depth,
        sha256_of,
    )

    cert = {"algorithm": ONLINE, "theta": 0.75, "lam": 0.5, "lam_min": 0.0, "norm_bound": 10.0,
            "hessian_lipschitz_forget": 1.0, "hessian_lipschitz_retain": 1.0, "grad_lipschitz_forget": 1.0,
            "grad_lipschitz_retain": 1.0, "gradient_bound": 0.2, "zeta_min": 0.5, "num_params": 650, "rho": 0.05,
            "repeats": 4, "forget_sizes": [1, 3], "retain_sizes": [99, 97], "depth": 50, "delta": 1e-5,
            "epsilon": 0.5, "mechanism": "classical"}
    b_first = max((0.75 + 0.5) / 1, (0.25 + 0.5) / 99)  # the first request, the smaller forget set, gives B
    expected = estimator_sensitivity(10, 0.75, 1, 1, 1, 1, 0.5, 0.0, 0.2, b_first, 0.5, 650, 0.05, 4)
    assert recomputed_sensitivity(cert) == pytest.approx(expected)
    assert calibrated_sensitivity(cert, expected) == pytest.approx(expected / 2)  # Delta / k, k = 2 requests
    assert required_depth(cert) == estimator_depth(b_first, 0.5, 0.0, 4) > 1
    weights = tmp_path / "w.pt"
    torch.save({"w": torch.zeros(2)}, weights)
    cert.update(sensitivity=expected, sigma=classical_sigma(expected / 2, 0.5, 1e-5), weights_sha256=sha256_of(weights))
    assert check_certificate(cert, weights) == []
    cert["depth"] = 1
    assert any("depth n=1 is below" in failure for failure in check_certificate(cert, weights))


def test_newton_direction_with_a_large_residual_is_refused():
    from omegaconf import OmegaConf

    from ttp_lightning.methods.certified.lissa import estimated_newton_direction

    cfg = OmegaConf.create({"scale": None, "scale_margin": 1.5, "power_iterations": 30, "depth": 60, "repeats": 10,
                            "sample_size": 16, "grad_lipschitz_forget": 1.0, "grad_lipschitz_retain": 1.0,
                            "lam_min": 0.0, "max_residual": 0.5})
    curv = curvature(lam=0.5)
    step = estimated_newton_direction(curv, cfg, torch.Generator().manual_seed(0))
    assert step["residual"] < 0.5 and step["depth"] == 60 and step["scale"] > curv.lam
    cfg.max_residual = step["residual"] / 2
    with pytest.raises(TTPUserError, match="relative residual .* nothing was released.*raise method.lam"):
        estimated_newton_direction(curv, cfg, torch.Generator().manual_seed(0))
