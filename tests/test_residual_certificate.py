"""The a-posteriori residual certificate (method.bound=residual): the distance bound against exact solves, the
linear-head objective against autograd, the solver, and (issue 25's check) a solver run far past the release
point: the noise-free release is within Delta of M_theta(D) on digits and MNIST LogReg, for both bound modes."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import HAVE_MNIST, MNIST_ROOT, release_of
from ttp_lightning.certified.maths.linear_head import (
    HeadPart,
    LinearHeadObjective,
    NegativeCurvature,
    SolverSettings,
    into_ball,
    solve_on_ball,
)
from ttp_lightning.certified.maths.reductions import temperature_rule
from ttp_lightning.certified.maths.residual import (
    ball_multiplier,
    capped_paper_sensitivity,
    distance_bound,
    estimator_error_bound,
    strong_convexity,
)
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.core.objectives import PER_INSTANCE_LOSSES

CE = lambda z, y: F.cross_entropy(z[None], y[None])
REVERSE_KL = lambda z, y: PER_INSTANCE_LOSSES["reverse_kl"](z[None])[0]
SQUARE = lambda z, y: PER_INSTANCE_LOSSES["square"](z[None])[0]


def problem(lam=1e-3, n=60, forget=8, features=5, classes=3, uniformity=REVERSE_KL, seed=0, theta=0.6):
    g = torch.Generator().manual_seed(seed)
    phi = lambda rows: torch.cat([torch.randn(rows, features, generator=g, dtype=torch.float64) * 2,
                                  torch.ones(rows, 1, dtype=torch.float64)], 1)
    retain = HeadPart(phi(n), torch.randint(classes, (n,), generator=g), 1 - theta, CE)
    forget_part = HeadPart(phi(forget), torch.randint(classes, (forget,), generator=g), theta, uniformity)
    return LinearHeadObjective([forget_part, retain], lam, classes)


def exact_optimum(objective, norm_bound):
    settings = SolverSettings(tolerance=1e-14, max_newton=200, max_cg=5000)
    return solve_on_ball(objective, torch.zeros(objective.size, dtype=torch.float64), norm_bound, settings).weights


def bound_at(objective, weights, norm_bound, mu):
    """The run's bound: the smaller of nu = 0 and the multiplier estimate, plus the rounding floor."""
    from ttp_lightning.certified.maths.residual_step import stationarity_record

    record = stationarity_record(objective, weights, mu, norm_bound)
    nu = ball_multiplier(objective.evaluate(weights).gradient, weights)
    assert record["multiplier"] in (0.0, nu)
    return record["distance_bound"]


def test_objective_matches_autograd_on_an_nn_linear():
    objective = problem()
    weights = torch.randn(objective.size, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def loss(flat):
        matrix = objective.matrix(flat)
        total = 0.5 * objective.lam * flat.dot(flat)
        for part in objective.parts:
            logits = part.features @ matrix.T
            total = total + part.weight * torch.stack([part.loss(z, y) for z, y in zip(logits, part.labels)]).mean()
        return total

    at = objective.evaluate(weights)
    assert at.value == pytest.approx(loss(weights).item(), rel=1e-12)
    assert torch.allclose(at.gradient, torch.func.grad(loss)(weights), rtol=1e-10, atol=1e-12)
    vector = torch.randn(objective.size, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    exact = torch.autograd.functional.hvp(loss, weights, vector)[1]
    assert torch.allclose(objective.hvp(at, vector, shift=0.3), exact + 0.3 * vector, rtol=1e-9, atol=1e-12)
    # the layout is the model's: W row-major, then b
    assert torch.equal(objective.flat(objective.matrix(weights)), weights)


@pytest.mark.parametrize("norm_bound", [0.5, 100.0])  # the ball constraint active / inactive
def test_the_distance_bound_holds_and_is_tight_at_the_optimum(norm_bound):
    objective = problem()
    optimum = exact_optimum(objective, norm_bound)
    assert bound_at(objective, optimum, norm_bound, objective.lam) < 1e-7
    g = torch.Generator().manual_seed(3)
    for trial in range(20):  # points anywhere in the ball, near and far
        scale = 10.0 ** (-trial % 5)
        point = into_ball(optimum + scale * torch.randn(objective.size, generator=g, dtype=torch.float64), norm_bound)
        distance = (point - optimum).norm().item()
        assert distance <= bound_at(objective, point, norm_bound, objective.lam) * (1 + 1e-9) + 1e-10


def test_a_wrong_mu_is_what_the_bound_depends_on():
    """With mu = lambda the bound holds; claiming a larger mu (an edited certificate) gives a bound that a
    point's true distance exceeds: mu is the quantity verify must check."""
    objective = problem(lam=1e-3)
    optimum = exact_optimum(objective, 100.0)
    point = optimum + 0.5 * torch.ones(objective.size, dtype=torch.float64)
    distance = (point - optimum).norm().item()
    assert distance <= bound_at(objective, point, 100.0, 1e-3)
    assert distance > bound_at(objective, point, 100.0, 1e3)


def test_the_bound_needs_a_point_in_the_ball_and_a_positive_mu():
    assert distance_bound(1e-3, 0.1, 0.0, 1.0, 2.0) == pytest.approx(1e-2)
    # the multiplier term: nu ||w|| (C - ||w||) only counts inside the ball
    assert distance_bound(0.0, 1.0, 4.0, 1.0, 2.0) == pytest.approx(math.sqrt(16.0) / 2)
    for bad in [(1e-3, 0.0, 0.0, 1.0, 2.0), (1e-3, 0.1, -1.0, 1.0, 2.0), (1e-3, 0.1, 0.0, 2.5, 2.0),
                (-1e-3, 0.1, 0.0, 1.0, 2.0)]:
        with pytest.raises(ValueError):
            distance_bound(*bad)
    assert into_ball(torch.full((7,), 3.0, dtype=torch.float64), 1.0).norm().item() <= 1.0


def test_mu_rules_and_the_paper_cap():
    assert strong_convexity("reverse_kl", 1e-4, 0.75, 2.0) == (1e-4, "convex_losses_linear_logits")
    assert strong_convexity("square", 3.0, 0.75, 2.0) == (1.5, "assumption_1")
    assert capped_paper_sensitivity(105.6, 10.0) == 20.0 and capped_paper_sensitivity(3.0, 10.0) == 3.0
    assert estimator_error_bound(0.1, 2.0, 0.5, -0.1) == pytest.approx(0.5)


def test_a_non_convex_objective_is_refused_not_certified():
    """The square uniformity loss at a tiny lambda is not convex: the solver meets negative curvature and says so
    instead of returning a point whose bound would rest on a false mu."""
    objective = problem(lam=1e-8, uniformity=SQUARE, theta=0.99, forget=20, n=4)
    start = torch.randn(objective.size, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) * 3
    with pytest.raises(NegativeCurvature, match="not strongly convex"):
        for seed in range(20):
            start = torch.randn(objective.size, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * 3
            solve_on_ball(objective, start, 50.0, SolverSettings(tolerance=1e-12))
    from omegaconf import OmegaConf

    from ttp_lightning.certified.maths.residual_step import mu_of

    with pytest.raises(TTPUserError, match=r"mu = lambda - theta P_K .* <= 0"):
        mu_of(OmegaConf.create({"uniformity": "square", "theta": 0.75, "grad_lipschitz_forget": 2.0}), 1.0)


def test_a_network_that_is_not_linear_needs_layers_last():
    from ttp_lightning.certified.maths.residual_step import select_certified_layers

    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    with pytest.raises(TTPUserError, match="method.layers=last"):
        select_certified_layers(net, "all")
    head = select_certified_layers(net, "last")
    assert head is net[2] and [p.requires_grad for p in net.parameters()] == [False, False, True, True]


# ------------------------------------------------------------------ the solver run far past the release
def _far_past(out):
    """||noise-free release - M_theta(D)|| with M_theta(D) solved from zeros to a tolerance 1000x tighter than
    the run's, on the data rebuilt from the certificate, and the certificate's Delta."""
    from ttp_lightning.certified.certificate.document import load_weights
    from ttp_lightning.certified.maths.residual_step import final_linear, head_objective
    from ttp_lightning.verify.audit import method_config, rebuild_model

    cert = json.loads((release_of(out) / "certificate.json").read_text())
    datamodule, net = rebuild_model(cert, out / "private" / "start.safetensors",
                                    [f"data.root={MNIST_ROOT}"] if cert["data"]["name"] == "mnist" else [])
    objective = head_objective(net, final_linear(net), method_config(cert), cert["lam"],
                               datamodule.dataset("retain"), datamodule.dataset("forget"))
    settings = SolverSettings(tolerance=1e-13, max_newton=300, max_cg=5000)
    optimum = solve_on_ball(objective, torch.zeros(objective.size, dtype=torch.float64), cert["norm_bound"],
                            settings).weights
    noise_free = load_weights(out / "private" / "noise_free.safetensors")["release_1"]
    return (noise_free - optimum).norm().item(), cert


LOGREG = ["model=logreg", "pretrain.norm_bound=10", "attacks.enabled=false", "method=certified_exact"]
BOUND_MODES = {
    "residual": ["method.bound=residual", "method.epsilon=1"],
    # the paper's Newton step needs lambda > ||H||; reverse KL keeps M_theta(D) unique, so "far past" is defined
    # the worst-image term: the same bound on a smooth maximum of the forget losses
    "smoothmax": ["method.bound=residual", "method.epsilon=1", "method.forget_reduction=smoothmax",
                  "method.forget_reduction_temperature=auto"],
    "paper": ["method.bound=paper", "method.lam=auto", "method.grad_lipschitz_forget=6",
              "method.grad_lipschitz_retain=6", "method.warmup_epochs=3", "method.epsilon=1"],
}


@pytest.mark.parametrize("data", ["digits", pytest.param("mnist", marks=pytest.mark.slow)])
@pytest.mark.parametrize("mode", list(BOUND_MODES))
def test_the_noise_free_release_is_within_delta_of_the_optimum_solved_far_past_it(run_job, tmp_path, data, mode):
    if data == "mnist" and not HAVE_MNIST:
        pytest.skip(f"MNIST files not found under {MNIST_ROOT}")
    extra = ["data=mnist", f"data.root={MNIST_ROOT}", "data.max_train_size=3000", "data.max_test_size=500",
             "data.normalize=false"] if data == "mnist" else []
    proc, results = run_job(*LOGREG, *extra, *BOUND_MODES[mode])
    assert results is not None, proc.stderr[-2000:]
    distance, cert = _far_past(tmp_path / "out")
    assert cert["bound"] == ("residual" if mode == "smoothmax" else mode)
    if mode == "smoothmax":  # auto: the rule's temperature from 10 classes, CD 0.1 and the forget set's size
        size = cert["steps"][0]["forget_size"]
        assert cert["forget_reduction"]["temperature"] == pytest.approx(temperature_rule(10, 0.1, size))
    assert distance <= cert["sensitivity"], (distance, cert["sensitivity"])
    if mode != "paper":
        assert cert["sensitivity"] < 1e-4  # the a-posteriori bound is tiny: the release is M_theta(D) + noise
    else:
        assert cert["sensitivity"] == 2 * cert["norm_bound"] <= cert["sensitivity_formula"]  # the paper's, capped
