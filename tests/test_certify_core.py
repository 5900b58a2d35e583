"""Certified-learner math: HVPs against finite differences and explicit Hessians, the stochastic
inverse-Hessian estimator against exact solves, Lanczos against eigvalsh, the bounds and their hypotheses."""

import copy
import math

import pytest
import torch
from torch import nn

from test_modules import tiny_sets
from ttp_lightning.certified.maths import hessian as hessian_module
from ttp_lightning.certified.maths.estimator import stochastic_inverse_hvp
from ttp_lightning.certified.maths.hessian import exact_hessian
from ttp_lightning.certified.maths.hvp import ParetoCurvature, flatten, refresh_batchnorm, unflatten
from ttp_lightning.certified.maths.spectrum import exact_spectrum, lanczos_spectrum
from ttp_lightning.core.batching import ImageBatchDataset
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.core.objectives import kl_to_uniform, retain_loss, square_to_uniform
from ttp_lightning.dp.sensitivity import (
    estimator_depth,
    estimator_scale_b,
    exact_newton_sensitivity,
    theta_lower_bound,
    uniformity_bound,
)
from ttp_lightning.models.components.classifier import Classifier


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

    def sample_hvp(part, rows, keep):
        return rows @ (forget_h if part == "forget" else retain_h)  # symmetric: row i -> H v_i

    top = max(torch.linalg.eigvalsh(forget_h + lam / (2 * theta) * torch.eye(dim, dtype=torch.float64)).max(),
              torch.linalg.eigvalsh(retain_h + lam / (2 * (1 - theta)) * torch.eye(dim, dtype=torch.float64)).max())
    estimate = stochastic_inverse_hvp(gradient, sample_hvp, theta, lam, scale=float(top) * 1.1, depth=400,
                                      repeats=200, generator=torch.Generator().manual_seed(1))
    assert (estimate - exact).norm() / exact.norm() < 0.05


def test_estimator_reports_divergence_with_what_to_change():
    matrix = torch.diag(torch.tensor([10.0, 1.0], dtype=torch.float64))
    with pytest.raises(TTPUserError, match="diverged.*method.lam.*J"):
        stochastic_inverse_hvp(torch.ones(2, dtype=torch.float64), lambda part, rows, keep: rows @ matrix, 0.5, 0.1,
                               scale=1.0, depth=200)
    with pytest.raises(TTPUserError, match=r"choose a value in \(0, 1\)"):
        stochastic_inverse_hvp(torch.ones(2), lambda part, v, keep: v, 1.0, 0.1, scale=2.0, depth=5)


def test_lanczos_brackets_the_extreme_eigenvalues_of_an_indefinite_matrix():
    g = torch.Generator().manual_seed(3)
    basis, _ = torch.linalg.qr(torch.randn(40, 40, generator=g, dtype=torch.float64))
    values = torch.linspace(-0.3, 2.0, 40, dtype=torch.float64)
    matrix = basis @ torch.diag(values) @ basis.T
    found = lanczos_spectrum(lambda v: matrix @ v, 40, iterations=40, margin=0.0, dtype=torch.float64,
                             generator=torch.Generator().manual_seed(0))
    assert found.ritz_min == pytest.approx(-0.3, abs=1e-8) and found.ritz_max == pytest.approx(2.0, abs=1e-8)
    few = lanczos_spectrum(lambda v: matrix @ v, 40, iterations=6, margin=0.1, dtype=torch.float64,
                           generator=torch.Generator().manual_seed(0))
    # Ritz values sit inside the spectrum; the residual and the margin move the estimates outside it
    assert -0.3 <= few.ritz_min and few.ritz_max <= 2.0
    assert few.lam_min <= -0.3 and few.norm >= 2.0 and few.method == "lanczos" and few.iterations == 6
    exact = exact_spectrum(matrix + 0.5 * torch.eye(40, dtype=torch.float64), shift=0.5)
    assert exact.lam_min == pytest.approx(-0.3, abs=1e-10) and exact.norm == pytest.approx(2.0, abs=1e-10)


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
    # B of the mean-normalised objective: the largest sampled Hessian, P + the part's share of lambda
    b = estimator_scale_b(0.75, 0.1, 1.0, 1.0)
    assert b == pytest.approx(1.0 + 0.1 / (2 * 0.25))
    n = estimator_depth(b, 0.1, 0.0, repeats=1)
    assert n == math.ceil(2 * 12 * math.log(12)) > 1  # kappa = 12: the depth rule means something again
    assert estimator_depth(5.0, 0.1, 0.0, repeats=2) == math.ceil(2 * 50 * math.log(100))


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
    scale = 1.5 * lanczos_spectrum(curv.hvp, dim, 30, 0.0, generator, dtype=torch.float64).norm
    estimate = stochastic_inverse_hvp(gradient, lambda part, v, keep: curv.sample_hvp(part, v, 16, generator, keep),
                                      curv.theta,
                                      curv.lam, scale, depth=60, repeats=60, generator=generator)
    assert (estimate - exact).norm() / exact.norm() < 0.1


def test_estimator_chains_split_over_ranks_sum_to_the_single_process_estimate():
    """Rank r of w advances chains r, r + w, ... and draws every chain's samples, so the per-rank partial
    estimates add up to the one-process estimate, and each rank computes only its share of the products."""
    curv = curvature(lam=0.5)
    gradient = curv.gradient()
    scale = 1.5 * lanczos_spectrum(curv.hvp, len(gradient), 30, 0.0, torch.Generator().manual_seed(0),
                                   dtype=torch.float64).norm

    def estimate(rank, world):
        generator = torch.Generator().manual_seed(5)
        before = curv.instances
        value = stochastic_inverse_hvp(gradient, lambda part, v, keep: curv.sample_hvp(part, v, 4, generator, keep),
                                       curv.theta, curv.lam, scale, depth=20, repeats=7, generator=generator,
                                       rank=rank, world=world)
        return value, curv.instances - before

    single, single_work = estimate(0, 1)
    parts = [estimate(rank, 3) for rank in range(3)]
    assert torch.allclose(sum(value for value, _ in parts), single, rtol=1e-10, atol=1e-12)
    assert [work for _, work in parts] == [3 * 20 * 4, 2 * 20 * 4, 2 * 20 * 4] and single_work == 7 * 20 * 4


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
    from ttp_lightning.models.components.vit import vision_transformer

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


def test_certificate_sensitivity_and_depth_come_from_the_stated_constants():
    from ttp_lightning.certified.certificate.arithmetic import (
        EXACT,
        ONLINE,
        recomputed_sensitivity,
        required_depth,
    )

    estimator = {"repeats": 4}
    steps = [{"lam_min_measured": -0.1, "residual": 0.01, "gradient_norm": 0.2},
             {"lam_min_measured": 0.3, "residual": 0.02, "gradient_norm": 0.05}]
    cert = {"algorithm": ONLINE, "bound": "paper", "theta": 0.75, "lam": 0.5, "lam_min": -0.1, "lam_min_stated": 0.0,
            "norm_bound": 100.0, "hessian_lipschitz_forget": 1.0, "hessian_lipschitz_retain": 1.0,
            "grad_lipschitz_forget": 1.0, "grad_lipschitz_retain": 1.0, "gradient_bound": 0.2, "num_params": 650,
            "estimator": estimator, "steps": steps, "release_model": "each"}
    b = estimator_scale_b(0.75, 0.5, 1.0, 1.0)
    # per step: the exact step's formula at that step's lambda_min plus its residual's share, the largest wins;
    # a deterministic bound (no probability-(1 - rho) term)
    first = 2 * 100 * (100 + 0.5) / 0.4 + 0.01 * 0.2 / 0.4
    assert recomputed_sensitivity(cert) == (200.0, pytest.approx(first))  # always above 2C: capped (the issue)
    last = 2 * 100 * (100 + 0.5) / 0.5 + 0.02 * 0.05 / 0.5
    assert recomputed_sensitivity({**cert, "release_model": "final"})[1] == pytest.approx(last)
    # below 2C it stands: a large lambda_min shrinks the formula
    wide = {**cert, "lam_min_stated": 1e4, "steps": [dict(s, lam_min_measured=1e4) for s in steps]}
    assert recomputed_sensitivity(wide)[0] == pytest.approx(2 * 100 * (100 + 0.5) / (0.5 + 1e4) + 0.01 * 0.2 / (0.5 + 1e4))
    # each step's n is judged with its own lambda_min (Alg 4's later steps measure their own)
    assert required_depth(cert, {"lam_min_measured": -0.1}) == estimator_depth(b, 0.5, -0.1, 4) > 1
    assert required_depth(cert, {"lam_min_measured": 0.3}) == estimator_depth(b, 0.5, 0.0, 4)
    exact = {**cert, "algorithm": EXACT, "steps": steps[:1], "release_model": "single"}
    assert recomputed_sensitivity(exact)[1] == pytest.approx(2 * 100 * (100 + 0.5) / 0.4)


def test_hypotheses_are_checked_with_the_fix_named():
    from ttp_lightning.dp.sensitivity import check_hypotheses

    check_hypotheses(0.75, 2.0, -0.1, 1.8, 2.0, 2.0)  # all hold
    with pytest.raises(TTPUserError, match=r"refutes the stated gradient Lipschitz.*at least 1.8"):
        check_hypotheses(0.75, 2.0, -0.1, 1.8, 1.0, 1.0)
    with pytest.raises(TTPUserError, match=r"lambda \+ lambda_min\(H\) = 0.1 \+ \(-0.2\) <= 0.*above 0.2"):
        check_hypotheses(0.75, 0.1, -0.2, 0.15, 1.0, 1.0)
    with pytest.raises(TTPUserError, match=r"method.lam=0.5 is not above the measured \|\|H\|\| = 0.9"):
        check_hypotheses(0.75, 0.5, -0.1, 0.9, 1.0, 1.0)


def test_projection_onto_the_ball_global_and_per_tensor():
    from ttp_lightning.certified.maths.newton import project_flat

    vector = torch.tensor([3.0, 4.0, 0.0, 0.5], dtype=torch.float64)
    assert torch.allclose(project_flat(vector, [2, 2], 1.0, "global"), vector / vector.norm())
    assert torch.equal(project_flat(vector, [2, 2], 10.0, "global"), vector)
    per_tensor = project_flat(vector, [2, 2], 1.0, "per_tensor")
    assert torch.allclose(per_tensor, torch.tensor([0.6, 0.8, 0.0, 0.5], dtype=torch.float64))


def estimator_cfg(**changes):
    from omegaconf import OmegaConf

    return OmegaConf.create({"scale": None, "scale_margin": 1.5, "depth": "auto", "repeats": 10, "sample_size": 16,
                             "grad_lipschitz_forget": 4.0, "grad_lipschitz_retain": 4.0, "lam_min": 0.0,
                             "max_residual": 0.5, "lanczos_iterations": 30, "spectrum_margin": 0.1, **changes})


def test_estimated_step_refuses_large_residuals_too_few_steps_and_a_small_scale():
    from ttp_lightning.certified.maths.newton import estimated_step

    curv = curvature(lam=4.5)
    direction, record = estimated_step(curv, estimator_cfg(), torch.Generator().manual_seed(0))
    b = estimator_scale_b(curv.theta, 4.5, 4.0, 4.0)
    assert record["residual"] < 0.5
    assert record["scale"] == pytest.approx(max(b, 1.5 * (record["hessian_norm_measured"] + 4.5)))
    assert record["depth"] == estimator_depth(b, 4.5, min(0.0, record["lam_min_measured"]), 10)
    assert record["step_norm"] == pytest.approx(direction.norm().item())
    with pytest.raises(TTPUserError, match="relative residual .* nothing was released"):
        estimated_step(curv, estimator_cfg(max_residual=record["residual"] / 2), torch.Generator().manual_seed(0))
    with pytest.raises(TTPUserError, match=r"method.depth=1 is below n = \d+"):
        estimated_step(curv, estimator_cfg(depth=1), torch.Generator().manual_seed(0))
    with pytest.raises(TTPUserError, match=r"method.scale=1.0 \(J\) is below B"):
        estimated_step(curv, estimator_cfg(scale=1.0), torch.Generator().manual_seed(0))
    with pytest.raises(TTPUserError, match="refutes the stated gradient Lipschitz"):
        estimated_step(curv, estimator_cfg(grad_lipschitz_forget=1e-3, grad_lipschitz_retain=1e-3),
                       torch.Generator().manual_seed(0))


def test_released_batchnorm_statistics_are_recomputed_on_the_retain_set_from_the_noised_weights():
    from ttp_lightning.certified.maths.newton import noised_states
    from ttp_lightning.dp.noise import fresh_seed

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))
    retain, _ = tiny_sets(n_retain=40, n_forget=5)
    names = [n for n, p in net.named_parameters()]
    noise_free = flatten(p.detach() for p in net.parameters()).double()
    before = net[1].running_mean.clone()
    state = noised_states(net, [noise_free], 0.5, fresh_seed(), [retain], chunk_size=16)[0]
    released = torch.cat([state[n].flatten() for n in names]).double()
    assert (released - noise_free).norm() > 0.5 * 0.5 * len(noise_free) ** 0.5  # the noise is in
    check = copy.deepcopy(net)
    check.load_state_dict(state)
    refresh_batchnorm(check, retain, chunk_size=16)  # the statistics of exactly these weights on D_r
    assert torch.allclose(state["1.running_mean"], check[1].running_mean, atol=1e-6)
    assert torch.allclose(state["1.running_var"], check[1].running_var, rtol=1e-5)
    assert not torch.allclose(state["1.running_mean"], before)
