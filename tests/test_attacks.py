"""Test-time-privacy attacks: each stays in its budget in [0, 1] pixel space and raises the confidence."""

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from test_modules import tiny_sets
from ttp_lightning.attacks import attack_forget_set, fgsm_attack, gaussian_attack, pgd_attack

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
