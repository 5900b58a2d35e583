"""Test-time-privacy attacks: each stays in its budget in [0, 1] pixel space and raises the confidence."""

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from test_modules import tiny_sets
from ttp_lightning.attacks import attack_forget_set, fgsm_attack, gaussian_attack, pgd_attack
from ttp_lightning.data.batching import ImageBatchDataset

SETTINGS = OmegaConf.create({"names": ["gaussian", "fgsm", "pgd"], "gammas": [2, 8], "alpha": 1e-4,
                             "pgd_steps": 50, "pgd_step_size": 1e-3, "seed": 0})


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.Tanh(), nn.Linear(12, 3)).eval()


def confidence(net, images):
    with torch.no_grad():
        return torch.logsumexp(net(images), dim=1)


@pytest.mark.parametrize("attack", [fgsm_attack, pgd_attack])
def test_sign_attacks_stay_in_the_ball_and_raise_the_confidence(attack):
    net, gamma = model(), 8 / 255
    images = torch.rand(30, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    attacked = attack(net, images, gamma, torch.Generator().manual_seed(0), SETTINGS)
    assert (attacked - images).abs().max() <= gamma + 1e-6
    assert attacked.min() >= 0 and attacked.max() <= 1
    assert (confidence(net, attacked) > confidence(net, images)).float().mean() > 0.9


def test_pgd_is_at_least_as_strong_as_fgsm_and_gaussian_is_seeded():
    net, gamma = model(), 8 / 255
    images = torch.rand(30, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    pgd = pgd_attack(net, images, gamma, torch.Generator().manual_seed(0), SETTINGS)
    fgsm = fgsm_attack(net, images, gamma, torch.Generator().manual_seed(0), SETTINGS)
    assert confidence(net, pgd).mean() >= confidence(net, fgsm).mean() - 1e-4
    first = gaussian_attack(net, images, gamma, torch.Generator().manual_seed(3), SETTINGS)
    again = gaussian_attack(net, images, gamma, torch.Generator().manual_seed(3), SETTINGS)
    assert torch.equal(first, again) and not torch.equal(first, images)
    assert 0.5 * gamma < (first - images).std() < 1.5 * gamma


def test_attack_forget_set_reports_every_attack_and_gamma():
    _, forget = tiny_sets(n_forget=9)
    net = model()
    results = attack_forget_set(net, forget, SETTINGS, chunk_size=4)
    assert set(results) == {"none", "gaussian", "fgsm", "pgd"} and set(results["pgd"]) == {"2", "8"}
    assert all(0 <= scores["forget_acc"] <= 1 for per_gamma in results.values() for scores in per_gamma.values())
    images, labels = forget.everything()
    with torch.no_grad():
        probs = net(images).softmax(dim=1)
    expected = (probs.max(dim=1).values - 1 / 3).clamp(min=0).mean().item()
    assert results["none"]["0"]["forget_conf_dist"] == pytest.approx(expected, abs=1e-5)
    assert results["none"]["0"]["forget_acc"] == pytest.approx((probs.argmax(1) == labels).float().mean().item())


def dead_relu_model():
    """Every hidden unit sits just below zero on the all-0.5 image: the exact input gradient vanishes there,
    yet within 8/255 each unit can switch on (||w_j||_1 = 16 * 0.5 = 8, so a signed step moves it by 0.25)."""
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 4), nn.ReLU(), nn.Linear(4, 3))
    with torch.no_grad():
        net[1].weight.fill_(0.5)
        net[1].bias.fill_(-0.5 * 16 * 0.5 - 0.05)  # pre-activation -0.05 at x = 0.5
        net[3].weight.copy_(torch.tensor([[20.0, 20, 20, 20], [0, 0, 0, 0], [0, 0, 0, 0]]))
        net[3].bias.zero_()
    return net.eval()


def test_dead_relus_mask_the_gradient_and_the_softplus_surrogate_unmasks_it():
    forget = ImageBatchDataset(torch.full((4, 1, 4, 4), 0.5), torch.tensor([0, 1, 2, 0]))  # all in the dead region
    net = dead_relu_model()
    exact = attack_forget_set(net, forget, SETTINGS)
    assert exact["none"]["0"]["forget_conf_dist"] == pytest.approx(0.0, abs=1e-6)  # uniform: logits all 0
    assert exact["pgd"]["8"]["forget_conf_dist"] == pytest.approx(0.0, abs=1e-6)  # zero gradient, no move
    adaptive = attack_forget_set(net, forget, OmegaConf.merge(SETTINGS, {"relu_gradient_beta": 10.0}))
    assert adaptive["none"] == exact["none"]  # the forward pass is the real model's
    assert adaptive["pgd"]["8"]["forget_conf_dist"] > 0.5 and adaptive["fgsm"]["8"]["forget_conf_dist"] > 0.5
    assert all(isinstance(module, nn.ReLU) for module in net if not isinstance(module, (nn.Flatten, nn.Linear)))
