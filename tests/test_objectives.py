import math

import torch
import torch.nn.functional as F

from ttp_lightning.core.objectives import (
    combine_gradients,
    kl_from_uniform,
    kl_to_uniform,
    pareto_objective,
    retain_loss,
    square_to_uniform,
)


def test_kl_to_uniform_matches_torch_kl_and_vanishes_at_uniform():
    logits = torch.randn(6, 10)
    uniform = torch.full((6, 10), 0.1)
    # KL(p || u) = sum p log(p/u); torch's kl_div(input=log u, target=p) computes sum p (log p - log u)
    expected = F.kl_div(uniform.log(), F.softmax(logits, -1), reduction="batchmean")
    assert torch.allclose(kl_to_uniform(logits), expected, atol=1e-6)
    assert kl_to_uniform(torch.zeros(3, 10)).abs() < 1e-6
    assert kl_to_uniform(logits) > 0


def test_reverse_kl_and_square_losses():
    logits = torch.randn(4, 5)
    p = F.softmax(logits, -1)
    expected_reverse = (0.2 * (math.log(0.2) - p.log())).sum(-1).mean()
    assert torch.allclose(kl_from_uniform(logits), expected_reverse, atol=1e-6)
    assert torch.allclose(square_to_uniform(logits), 0.5 * ((p - 0.2) ** 2).sum(-1).mean(), atol=1e-7)
    assert square_to_uniform(torch.ones(2, 5) * 3.0).abs() < 1e-8


def test_pareto_objective_weights_and_temperature():
    forget, retain, targets = torch.randn(3, 4), torch.randn(5, 4), torch.tensor([0, 1, 2, 3, 0])
    theta = 0.3
    value = pareto_objective(forget, retain, targets, theta, kl_to_uniform, forget_temperature=2.0)
    expected = theta * kl_to_uniform(forget / 2.0) + (1 - theta) * retain_loss(retain, targets)
    assert torch.allclose(value, expected)
    assert torch.allclose(pareto_objective(forget, retain, targets, 1.0), kl_to_uniform(forget))
    assert torch.allclose(pareto_objective(forget, retain, targets, 0.0), F.cross_entropy(retain, targets))


def test_combine_gradients_plain_sum_without_conflict():
    g_f, g_r = [torch.tensor([1.0, 0.0])], [torch.tensor([1.0, 1.0])]
    for surgery in (False, True):
        (step,) = combine_gradients(g_f, g_r, 0.75, surgery)
        assert torch.allclose(step, 0.75 * g_f[0] + 0.25 * g_r[0])


def test_combine_gradients_surgery_removes_conflict():
    g_f, g_r = [torch.tensor([1.0, 0.0])], [torch.tensor([-1.0, 1.0])]
    (plain,) = combine_gradients(g_f, g_r, 0.5, surgery=False)
    assert torch.dot(plain, g_f[0]) == 0 and torch.dot(plain, g_r[0]) > 0  # the plain step stalls forget
    (fixed,) = combine_gradients(g_f, g_r, 0.5, surgery=True)
    # after projection each part is orthogonal to the other's original, so the step helps both
    assert torch.dot(fixed, g_f[0]) > 0 and torch.dot(fixed, g_r[0]) > 0
    assert torch.allclose(fixed, 0.5 * torch.tensor([0.5, 0.5]) + 0.5 * torch.tensor([0.0, 1.0]))


def test_per_image_losses_average_to_the_batch_losses_and_reductions_weigh_the_hardest():
    from ttp_lightning.core.objectives import PER_INSTANCE_LOSSES, UNIFORMITY_LOSSES, reduce_forget

    torch.manual_seed(0)
    logits = torch.randn(10, 4) * 3
    for name, each in PER_INSTANCE_LOSSES.items():
        assert each(logits).shape == (10,) and torch.allclose(each(logits).mean(), UNIFORMITY_LOSSES[name](logits))
    losses = torch.arange(10.0)
    assert reduce_forget(losses, "mean") == 4.5 and reduce_forget(losses, "max") == 9.0
    assert reduce_forget(losses, "cvar", 0.2) == 8.5 and reduce_forget(losses, "cvar", 0.01) == 9.0
    assert reduce_forget(losses, "cvar", 1.0) == 4.5
    smooth = [reduce_forget(losses, "smoothmax", temperature=t).item() for t in (100.0, 1.0, 0.01)]
    assert 4.5 < smooth[0] < smooth[1] < smooth[2] <= 9.0 and smooth[2] > 9.0 - 0.01 * math.log(10) - 1e-6


def test_reverse_kl_still_pulls_a_saturated_image_where_kl_to_uniform_does_not():
    """mnist_mlp: Alg 1 with KL(p || u) leaves 4 of 100 forget images at CD 0.9. At a saturated softmax its
    gradient is about exp(-margin); KL(u || p)'s is p - u, of order one."""
    from ttp_lightning.core.objectives import kl_from_uniform_each, kl_to_uniform_each

    logits = torch.tensor([[30.0, 0.0, 0.0, 0.0]], requires_grad=True)
    (forward,) = torch.autograd.grad(kl_to_uniform_each(logits).sum(), logits)
    (reverse,) = torch.autograd.grad(kl_from_uniform_each(logits).sum(), logits)
    assert forward.abs().max() < 1e-10 and reverse.abs().max() > 0.5


def test_alg1_s_smoothmax_needs_a_positive_temperature():
    import pytest

    from ttp_lightning.alg1.schema import ParetoSchema
    from ttp_lightning.core.errors import TTPUserError

    with pytest.raises(TTPUserError, match="forget_reduction=smoothmax needs method.forget_reduction_temperature"):
        ParetoSchema(lr=0.01, weight_decay=0.0, momentum=0.9, forget_reduction="smoothmax")
    with pytest.raises(TTPUserError, match="forget_reduction_temperature=-1"):
        ParetoSchema(lr=0.01, weight_decay=0.0, momentum=0.9, forget_reduction="smoothmax", forget_reduction_temperature=-1.0)
    assert ParetoSchema(lr=0.01, weight_decay=0.0, momentum=0.9, forget_reduction="smoothmax", forget_reduction_temperature=0.1).forget_reduction == "smoothmax"
