"""The paper's attacks (App. "Defining Test-Time Privacy Attacks"), as it states them: perturb each forget
image within an L-inf ball of radius gamma in [0, 1] pixel space to raise rho(x) = logsumexp of the logits.

FGSM: one signed-gradient step of size gamma from a symmetry-breaking start x + U(-alpha gamma, alpha gamma).
PGD: from the same start, `pgd_steps` signed-gradient steps of `pgd_step_size`, each followed by projection
onto the gamma ball around x and onto [0, 1] (the paper's pseudocode writes the gradient at x_0; the PGD it
cites, and this code, take it at the current iterate). Gaussian: x + N(0, gamma^2), gamma read as the
noise's standard deviation so all attacks share one scale, clipped to [0, 1].

These are weak against gradient masking (see attacks/surrogate.py); `attacks=paper` reproduces the paper's
tables with them, the default evaluation (attacks/apgd.py) is the adaptive one.
"""

import torch
from torch import nn

from ttp_lightning.attacks.base import Attack


def _confidence_gradient_sign(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    with torch.enable_grad():
        images = images.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(torch.logsumexp(model(images), dim=1).sum(), images)
    return grad.sign()


def _symmetry_breaking_start(images: torch.Tensor, gamma: float, alpha: float,
                             generator: torch.Generator) -> torch.Tensor:
    noise = torch.rand(images.shape, generator=generator).to(images) * 2 - 1
    return (images + alpha * gamma * noise).clamp(0, 1)


def gaussian_attack(model: nn.Module, images: torch.Tensor, gamma: float, generator: torch.Generator,
                    cfg, **_) -> torch.Tensor:
    return (images + gamma * torch.randn(images.shape, generator=generator).to(images)).clamp(0, 1)


def fgsm_attack(model: nn.Module, images: torch.Tensor, gamma: float, generator: torch.Generator,
                cfg, **_) -> torch.Tensor:
    start = _symmetry_breaking_start(images, gamma, cfg.alpha, generator)
    return (images + gamma * _confidence_gradient_sign(model, start)).clamp(0, 1)


def pgd_attack(model: nn.Module, images: torch.Tensor, gamma: float, generator: torch.Generator,
               cfg, **_) -> torch.Tensor:
    adversarial = _symmetry_breaking_start(images, gamma, cfg.alpha, generator)
    for _ in range(cfg.pgd_steps):
        adversarial = adversarial + cfg.pgd_step_size * _confidence_gradient_sign(model, adversarial)
        adversarial = torch.min(torch.max(adversarial, images - gamma), images + gamma).clamp(0, 1)
    return adversarial.detach()


class GaussianNoise(Attack):
    """conf/attacks/suite/gaussian.yaml: x + N(0, gamma^2), clipped to [0, 1]."""

    random = True

    def __call__(self, model, images, gamma, generator, cfg, **_) -> torch.Tensor:
        return gaussian_attack(model, images, gamma, generator, cfg)


class FGSM(Attack):
    """conf/attacks/suite/fgsm.yaml: one signed-gradient step of logsumexp from a symmetry-breaking start."""

    def __call__(self, model, images, gamma, generator, cfg, **_) -> torch.Tensor:
        return fgsm_attack(model, images, gamma, generator, cfg)


class PGD(Attack):
    """conf/attacks/suite/pgd.yaml: attacks.pgd_steps signed-gradient steps of logsumexp, projected onto the ball."""

    def __call__(self, model, images, gamma, generator, cfg, **_) -> torch.Tensor:
        return pgd_attack(model, images, gamma, generator, cfg)
