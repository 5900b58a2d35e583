"""The certified objective's worst-image reductions (certified/maths/reductions.py): values against their definitions,
gradients against autograd, Hessian-vector products against finite differences of the gradient, and the
convexity claim (the Hessian of F minus lambda I is positive semidefinite) at random points."""

import math

import pytest
import torch
import torch.nn.functional as F

from ttp_lightning.certified.maths.linear_head import HeadPart, LinearHeadObjective
from ttp_lightning.certified.maths.reductions import (
    Reduction,
    cvar_threshold,
    reduce,
    temperature_rule,
    threshold_loss,
)
from ttp_lightning.core.objectives import PER_INSTANCE_LOSSES

SMOOTHMAX, CVAR = Reduction("smoothmax", temperature=0.3), Reduction("cvar", temperature=0.05, fraction=0.25)
CLASSES, FEATURES, LAM = 4, 5, 1e-3


def reverse_kl(logits, label):
    return PER_INSTANCE_LOSSES["reverse_kl"](logits[None])[0]


def cross_entropy(logits, label):
    return F.cross_entropy(logits[None], label[None])


def objective(reduction: Reduction, seed: int = 0) -> LinearHeadObjective:
    generator = torch.Generator().manual_seed(seed)
    def features(n):
        phi = torch.randn(n, FEATURES, generator=generator, dtype=torch.float64)
        return torch.cat([phi, torch.ones(n, 1, dtype=torch.float64)], dim=1)
    labels = lambda n: torch.randint(CLASSES, (n,), generator=generator)
    parts = [HeadPart(features(12), labels(12), 0.6, reverse_kl, reduction),
             HeadPart(features(30), labels(30), 0.4, cross_entropy)]
    return LinearHeadObjective(parts, LAM, CLASSES)


def autograd_value(obj: LinearHeadObjective, flat: torch.Tensor) -> torch.Tensor:
    """F written directly in torch ops (cvar's threshold held at its optimum: by the envelope theorem the
    gradient is the same)."""
    matrix = obj.matrix(flat)
    value = 0.5 * LAM * flat.dot(flat)
    for part in obj.parts:
        logits = part.features @ matrix.T
        losses = torch.stack([part.loss(z, y) for z, y in zip(logits, part.labels)])
        r = part.reduction
        if r.name == "mean":
            reduced = losses.mean()
        elif r.name == "smoothmax":
            reduced = r.temperature * (torch.logsumexp(losses / r.temperature, 0) - math.log(len(losses)))
        else:
            share = r.fraction * len(losses)
            t = cvar_threshold(losses.detach(), share, r.temperature)
            reduced = t + r.temperature * F.softplus((losses - t) / r.temperature).sum() / share
        value = value + part.weight * reduced
    return value


@pytest.mark.parametrize("reduction", [Reduction(), SMOOTHMAX, CVAR], ids=["mean", "smoothmax", "cvar"])
def test_value_and_gradient_match_autograd(reduction):
    obj = objective(reduction)
    w = torch.randn(obj.size, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    at = obj.evaluate(w)
    x = w.clone().requires_grad_(True)
    value = autograd_value(obj, x)
    (grad,) = torch.autograd.grad(value, x)
    assert at.value == pytest.approx(value.item(), rel=1e-12)
    torch.testing.assert_close(at.gradient, grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("reduction", [SMOOTHMAX, CVAR], ids=["smoothmax", "cvar"])
def test_hvp_matches_finite_differences_of_the_gradient(reduction):
    obj = objective(reduction)
    generator = torch.Generator().manual_seed(2)
    w = torch.randn(obj.size, dtype=torch.float64, generator=generator)
    v = torch.randn(obj.size, dtype=torch.float64, generator=generator)
    h = 1e-5
    expected = (obj.evaluate(w + h * v).gradient - obj.evaluate(w - h * v).gradient) / (2 * h)
    torch.testing.assert_close(obj.hvp(obj.evaluate(w), v), expected, rtol=1e-6, atol=1e-8)  # both hold lambda v


def test_smoothmax_hvp_matches_the_autograd_hessian():
    obj = objective(SMOOTHMAX)
    w = torch.randn(obj.size, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    hessian = torch.autograd.functional.hessian(lambda x: autograd_value(obj, x), w)
    at = obj.evaluate(w)
    columns = torch.stack([obj.hvp(at, e) for e in torch.eye(obj.size, dtype=torch.float64)], dim=1)
    torch.testing.assert_close(columns, hessian, rtol=1e-9, atol=1e-11)  # both hold lambda I


@pytest.mark.parametrize("reduction", [SMOOTHMAX, CVAR, Reduction("smoothmax", temperature=0.01)],
                         ids=["smoothmax", "cvar", "smoothmax-cold"])
def test_hessian_minus_lambda_is_positive_semidefinite_at_random_points(reduction):
    """The convexity claim behind mu = lambda: at random points (weights at three scales) the exact Hessian
    of F, built from hvp column by column, has every eigenvalue >= lambda (up to float64 rounding)."""
    obj = objective(reduction, seed=4)
    generator = torch.Generator().manual_seed(5)
    for scale in (0.1, 1.0, 10.0):
        at = obj.evaluate(scale * torch.randn(obj.size, dtype=torch.float64, generator=generator))
        hessian = torch.stack([obj.hvp(at, e) for e in torch.eye(obj.size, dtype=torch.float64)], dim=1)
        eigenvalues = torch.linalg.eigvalsh(0.5 * (hessian + hessian.T)) - LAM
        assert eigenvalues.min() >= -1e-10 * max(1.0, eigenvalues.abs().max().item())


def test_a_smooth_minimum_is_not_convex_and_is_refused():
    """T < 0 turns the smooth maximum into a smooth minimum: its Hessian has negative eigenvalues (shown here),
    and Reduction.problems refuses it, as any T that is not a positive number."""
    losses = torch.tensor([0.2, 1.0, 3.0], dtype=torch.float64)
    reduced = reduce(Reduction("smoothmax", temperature=-0.5), losses)
    hessian = torch.stack([reduced.hessian_times(e) for e in torch.eye(3, dtype=torch.float64)])
    assert torch.linalg.eigvalsh(hessian).min() < -1e-3
    assert Reduction("smoothmax", temperature=-0.5).problems()
    assert Reduction("smoothmax", temperature=float("nan")).problems()
    assert Reduction("cvar", temperature=0.1, fraction=1.5).problems()
    assert Reduction("median").problems()
    assert not SMOOTHMAX.problems() and not CVAR.problems() and not Reduction().problems()
    assert not Reduction("smoothmax", temperature=1).problems() and Reduction("smoothmax", temperature=True).problems()


def test_reductions_lie_between_the_mean_and_the_worst_loss_as_stated():
    losses = torch.tensor([0.01, 0.02, 0.05, 0.9, 0.3, 0.02, 0.04, 0.6], dtype=torch.float64)
    for temperature in (1.0, 0.1, 0.01):
        value = reduce(Reduction("smoothmax", temperature=temperature), losses).value
        assert losses.mean() <= value <= losses.max() + 1e-12
        assert value >= losses.max() - temperature * math.log(len(losses)) - 1e-12
        top = losses.topk(2).values.mean().item()  # CVaR at a quarter of 8 images
        smoothed = reduce(Reduction("cvar", temperature=temperature, fraction=0.25), losses).value
        assert top - 1e-12 <= smoothed <= top + temperature * math.log(2) / 0.25 + 1e-12
    assert reduce(Reduction("cvar", temperature=1e-4, fraction=0.25), losses).value == pytest.approx(0.75, abs=1e-3)
    weights = reduce(Reduction("cvar", temperature=1e-3, fraction=0.25), losses).weights
    assert weights.sum().item() == pytest.approx(1.0, abs=1e-9) and weights[3] > 0.45 and weights[7] > 0.45


def test_the_threshold_loss_is_the_smallest_reverse_kl_at_the_gate_s_confidence_distance():
    """No softmax with confidence distance 0.1 (10 classes) has a smaller KL(u || p) than threshold_loss (sampled),
    and the rule's temperature is that loss over log n."""
    loss = threshold_loss(10, 0.1)
    assert loss == pytest.approx(0.0367, abs=1e-4)
    generator = torch.Generator().manual_seed(0)
    spread = torch.cat([torch.rand(10000, 1, dtype=torch.float64, generator=generator)] * 9, dim=1) / 10
    rest = (1.0 + spread * torch.randn(10000, 9, generator=generator, dtype=torch.float64)).clamp(min=1e-3)
    rest = rest / rest.sum(1, keepdim=True) * 0.8  # the other nine classes share 1 - 0.2, near and far from equal
    keep = rest.max(1).values <= 0.2
    p = torch.cat([torch.full((len(rest), 1), 0.2, dtype=torch.float64), rest], dim=1)[keep]
    sampled = (-math.log(10) - p.log().mean(1))
    assert sampled.min().item() >= loss - 1e-12 and sampled.min().item() < loss + 5e-3
    assert temperature_rule(10, 0.1, 100) == pytest.approx(loss / math.log(100))
