"""Open-weight test-time-privacy attacks (App. "Defining Test-Time Privacy Attacks"): perturb each forget
instance within an L-inf ball of radius gamma, in [0, 1] pixel space, to make the model confident again.

The adversary maximises rho(x) = logsumexp of the logits (a smooth max). FGSM-style: one signed-gradient
step of size gamma from a symmetry-breaking start x + U(-alpha gamma, alpha gamma). PGD-style: from the
same start, `steps` signed-gradient steps of `step_size`, each followed by projection onto the gamma ball
around x and onto [0, 1] (the paper's pseudocode writes the gradient at x_0; the PGD it cites, and this
code, take it at the current iterate). Gaussian: x + N(0, gamma^2), gamma read as the noise's standard
deviation so all attacks share one scale, clipped to [0, 1]. Models hold their input normalisation, so
clipping acts on real pixels.

Gradient masking: a finetuned ReLU network can switch every hidden unit off on a forget image, so the
input gradient is exactly zero and FGSM/PGD cannot move. `attacks.relu_gradient_beta` (an adaptive
adversary, BPDA-style) keeps every ReLU's forward pass exact but gives its backward pass the derivative of
softplus with that beta, sigmoid(beta z), so dead units still point the way to becoming active.
"""

from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch import nn

from ttp_lightning.data.batching import ImageBatchDataset
from ttp_lightning.evaluation import eval_device
from ttp_lightning.metrics import Accuracy, ConfidenceDistance


class _ReLUWithSoftplusGradient(torch.autograd.Function):
    """relu(z) forward; backward sigmoid(beta z), the derivative of softplus_beta."""

    @staticmethod
    def forward(ctx, z, beta):
        ctx.save_for_backward(z)
        ctx.beta = beta
        return z.clamp(min=0)

    @staticmethod
    def backward(ctx, grad):
        (z,) = ctx.saved_tensors
        return grad * torch.sigmoid(ctx.beta * z), None


class SmoothGradientReLU(nn.Module):
    def __init__(self, beta: float):
        super().__init__()
        self.beta = float(beta)

    def forward(self, z):
        return _ReLUWithSoftplusGradient.apply(z, self.beta)


@contextmanager
def relu_gradient_surrogate(model: nn.Module, beta: float | None):
    """Inside the block every nn.ReLU of `model` is a SmoothGradientReLU(beta) (same outputs, smoothed
    gradients); beta None leaves the model as it is. The original modules are put back afterwards."""
    swapped = []
    if beta is not None:
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.ReLU):
                    setattr(parent, name, SmoothGradientReLU(beta))
                    swapped.append((parent, name, child))
    try:
        yield
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)


def _confidence_gradient_sign(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    images = images.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(torch.logsumexp(model(images), dim=1).sum(), images)
    return grad.sign()


def _symmetry_breaking_start(images: torch.Tensor, gamma: float, alpha: float,
                             generator: torch.Generator) -> torch.Tensor:
    noise = torch.rand(images.shape, generator=generator).to(images) * 2 - 1
    return (images + alpha * gamma * noise).clamp(0, 1)


def gaussian_attack(model: nn.Module, images: torch.Tensor, gamma: float, generator: torch.Generator,
                    cfg) -> torch.Tensor:
    return (images + gamma * torch.randn(images.shape, generator=generator).to(images)).clamp(0, 1)


def fgsm_attack(model: nn.Module, images: torch.Tensor, gamma: float, generator: torch.Generator,
                cfg) -> torch.Tensor:
    start = _symmetry_breaking_start(images, gamma, cfg.alpha, generator)
    return (images + gamma * _confidence_gradient_sign(model, start)).clamp(0, 1)


def pgd_attack(model: nn.Module, images: torch.Tensor, gamma: float, generator: torch.Generator,
               cfg) -> torch.Tensor:
    adversarial = _symmetry_breaking_start(images, gamma, cfg.alpha, generator)
    for _ in range(cfg.pgd_steps):
        adversarial = adversarial + cfg.pgd_step_size * _confidence_gradient_sign(model, adversarial)
        adversarial = torch.min(torch.max(adversarial, images - gamma), images + gamma).clamp(0, 1)
    return adversarial.detach()


ATTACKS: dict[str, Callable] = {"gaussian": gaussian_attack, "fgsm": fgsm_attack, "pgd": pgd_attack}


def attack_forget_set(model: nn.Module, forget: ImageBatchDataset, cfg, chunk_size: int = 512) -> dict:
    """{attack: {gamma in units of 1/255: {forget_conf_dist, forget_acc}}}, with the unattacked scores
    under "none"; each (attack, gamma) starts from `cfg.seed`, so two models face the same random draws."""
    device = eval_device()
    was_training = model.training
    model.eval().to(device)
    results = {"none": {"0": _scores(model, forget, chunk_size, lambda images, generator: images, cfg.seed)}}
    with relu_gradient_surrogate(model, cfg.get("relu_gradient_beta")):
        for name in cfg.names:
            results[name] = {
                f"{gamma:g}": _scores(model, forget, chunk_size,
                                      lambda images, generator, gamma=gamma, name=name: ATTACKS[name](
                                          model, images, gamma / 255.0, generator, cfg), cfg.seed)
                for gamma in cfg.gammas}
    model.train(was_training)
    return results


def _scores(model: nn.Module, forget: ImageBatchDataset, chunk_size: int, perturb: Callable, seed: int) -> dict:
    """Forget CD and accuracy of the model on perturbed forget images, chunk by chunk."""
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(int(seed))
    conf_dist, accuracy = ConfidenceDistance(sync_on_compute=False), Accuracy(sync_on_compute=False)
    for start in range(0, len(forget), chunk_size):
        images, labels = forget[list(range(start, min(start + chunk_size, len(forget))))]
        perturbed = perturb(images.to(device), generator)
        with torch.no_grad():
            logits = model(perturbed).cpu()
        conf_dist.update(logits, labels)
        accuracy.update(logits, labels)
    return {"forget_conf_dist": round(float(conf_dist.compute()), 6), "forget_acc": round(float(accuracy.compute()), 6)}
