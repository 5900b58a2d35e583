"""The default attack: APGD (Croce & Hein 2020, L-inf) with several ReLU surrogates, objectives and random
restarts, the worst case per image kept.

Each forget image is attacked once per (surrogate, restart, objective) triple, the pairs of one surrogate
in one batch; the `targeted` objective instead runs once per target class (each image's highest-scoring
classes at the image, attacks/objectives.py), from a random start. Surrogates: exact gradients (None) and
the backward-only softplus_beta derivative of attacks/surrogate.py for each beta; a small beta reaches dead
units far below zero, a large one follows the real model more closely, and neither is best everywhere.
Restart 0 starts at `warm_start` (the worst point found at a smaller radius, so a larger ball never scores
lower) or at the image itself; the others start uniformly at random in the ball. The step size starts at
2 gamma and is halved at APGD's checkpoints (after 22 %, then ever shorter gaps of at least 6 % of the
steps) when fewer than 75 % of the steps since the last checkpoint raised the objective, or when neither
the step size nor the best objective changed; a halving restarts from the best point so far. Steps after
the first use momentum 0.75. Whatever the objective, the point kept for an image is the one with the
highest real confidence (max softmax, from the exact forward pass) seen over every iterate of every pair,
the start included; the run stops once every row's is within SATURATED of 1 (no step can raise it further:
the unbounded check and a confident pretrained model end there).

Expectation over transformation: for a model whose outputs are random (a randomised defence), `Probe`
averages the objective, its gradient and the confidence over `samples` forward passes.
"""

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ttp_lightning.attacks.base import Attack, saturated
from ttp_lightning.attacks.objectives import OBJECTIVES, TARGETED, top_classes
from ttp_lightning.attacks.surrogate import smooth_relu_gradients

MOMENTUM = 0.75
SUCCESS_RATE = 0.75
# Rows per forward and backward pass of the probe: a data set's training batch (data.batch_size's default). On 2
# CPU cores 10 judge's steps on the MNIST ResNet8's 100 images (1,200 rows and more) took 18 s in one pass and 7 s
# in passes of 128; early stopping's 200 rows 2.3 and 2.1 s. Evaluation passes (no gradient) were as fast at
# 1,024 as at 128 in a fit. scripts/bench_passes.py times both kinds of pass by size. A pass holds at most
# VALUES_PER_PASS input values (128 MNIST images): a small image's pass holds more rows, so an MLP on 8x8 digits
# is not run in passes whose Python overhead outweighs their arithmetic.
ROWS_PER_PASS = 128
VALUES_PER_PASS = ROWS_PER_PASS * 28 * 28


def rows_per_pass(x: torch.Tensor) -> int:
    """Rows of `x` one probe pass takes: VALUES_PER_PASS input values, at least ROWS_PER_PASS rows."""
    per_row = max(1, x[0].numel()) if len(x) else 1
    return max(ROWS_PER_PASS, VALUES_PER_PASS // per_row)


def apgd_checkpoints(steps: int) -> list[int]:
    """The iterations after which APGD may halve its step: p_0 = 0, p_1 = 0.22,
    p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03, 0.06), scaled by `steps`."""
    fractions = [0.0, 0.22]
    while fractions[-1] < 1:
        fractions.append(fractions[-1] + max(fractions[-1] - fractions[-2] - 0.03, 0.06))
    scaled = [math.ceil(round(p * steps, 9)) for p in fractions[1:] if p <= 1]
    return sorted({k for k in scaled if k >= 1})


@dataclass
class Probe:
    """The attacker's view of a model: per row, the chosen objective, its input gradient and the
    confidence (max softmax), each averaged over `samples` forward passes. The rows go through the model
    ROWS_PER_PASS at a time: each row's values do not depend on the others (the model is in eval mode), and a
    large pass is slower on a CPU (ROWS_PER_PASS says by how much)."""

    model: nn.Module
    objectives: list[str]
    samples: int = 1

    def __call__(self, x: torch.Tensor, objective_ids: torch.Tensor, targets: torch.Tensor):
        size = rows_per_pass(x)
        parts = [self._rows(x[i:i + size], objective_ids[i:i + size], targets[i:i + size])
                 for i in range(0, len(x) or 1, size)]
        return tuple(torch.cat(values) for values in zip(*parts, strict=True))

    def _rows(self, x: torch.Tensor, objective_ids: torch.Tensor, targets: torch.Tensor):
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            value = confidence = 0.0
            for _ in range(self.samples):
                logits = self.model(x)
                per_objective = torch.stack([OBJECTIVES[name](logits, targets) for name in self.objectives])
                value = value + per_objective.gather(0, objective_ids.view(1, -1)).squeeze(0)
                confidence = confidence + F.softmax(logits.detach(), dim=-1).max(dim=-1).values
            (grad,) = torch.autograd.grad(value.sum(), x)
        return value.detach() / self.samples, grad, confidence / self.samples


class Found(NamedTuple):
    """Per row: the most confident point seen and its confidence; the point of highest objective."""

    most_confident: torch.Tensor
    confidence: torch.Tensor
    best_objective: torch.Tensor


def _where(mask: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.view((-1,) + (1,) * (a.dim() - 1)), a, b)


def apgd(probe: Probe, images: torch.Tensor, targets: torch.Tensor, objective_ids: torch.Tensor, gamma: float,
         steps: int, start: torch.Tensor) -> Found:
    """APGD in the gamma ball around `images` (within [0, 1]), one row per image."""
    lower, upper = (images - gamma).clamp(0, 1), (images + gamma).clamp(0, 1)

    def project(x):
        return torch.max(torch.min(x, upper), lower)

    x = project(start)
    f, grad, conf = probe(x, objective_ids, targets)
    best_f, x_best_f, grad_best_f = f, x, grad
    best_conf, x_best_conf = conf, x
    eta = torch.full_like(f, 2 * gamma)
    x_prev = x
    checkpoints, last_checkpoint = apgd_checkpoints(steps), 0
    increases = torch.zeros_like(f)
    eta_at_checkpoint, best_f_at_checkpoint = eta.clone(), best_f.clone()
    for k in range(1, steps + 1):
        if bool(saturated(best_conf).all()):
            break
        z = project(x + eta.view((-1,) + (1,) * (x.dim() - 1)) * grad.sign())
        x_new = z if k == 1 else project(x + MOMENTUM * (z - x) + (1 - MOMENTUM) * (x - x_prev))
        x_prev, x = x, x_new
        f_new, grad, conf = probe(x, objective_ids, targets)
        increases += (f_new > f).float()
        f = f_new
        better = f > best_f
        best_f, x_best_f, grad_best_f = torch.where(better, f, best_f), _where(better, x, x_best_f), \
            _where(better, grad, grad_best_f)
        more_confident = conf > best_conf
        best_conf, x_best_conf = torch.where(more_confident, conf, best_conf), _where(more_confident, x, x_best_conf)
        if k in checkpoints:
            stalled = (eta == eta_at_checkpoint) & (best_f == best_f_at_checkpoint)
            halve = (increases < SUCCESS_RATE * (k - last_checkpoint)) | stalled
            eta = torch.where(halve, eta / 2, eta)
            x, x_prev = _where(halve, x_best_f, x), _where(halve, x_best_f, x_prev)
            f, grad = torch.where(halve, best_f, f), _where(halve, grad_best_f, grad)
            increases.zero_()
            last_checkpoint, eta_at_checkpoint, best_f_at_checkpoint = k, eta.clone(), best_f.clone()
    return Found(x_best_conf.detach(), best_conf, x_best_f.detach())


def adaptive_attack(model: nn.Module, images: torch.Tensor, gamma: float, generator: torch.Generator, cfg,
                    targets: torch.Tensor, warm_start: torch.Tensor | None = None, samples: int = 1) -> torch.Tensor:
    """APGD for every (surrogate, restart, objective) triple; per image the most confident point of all.
    Each ReLU surrogate in `cfg.surrogate_betas` (None: exact gradients) gets every restart and objective,
    in one batch."""
    best, best_confidence = images, None
    for beta in cfg.surrogate_betas:
        with smooth_relu_gradients(beta):
            found, confidence = _restarts_and_objectives(model, images, gamma, generator, cfg, targets, warm_start,
                                                         samples)
        if best_confidence is None:
            best, best_confidence = found, confidence
        else:
            more = confidence > best_confidence
            best, best_confidence = _where(more, found, best), torch.where(more, confidence, best_confidence)
    return best


def _restarts_and_objectives(model, images, gamma, generator, cfg, targets, warm_start, samples):
    """Every (restart, objective) pair in one batch, and with the `targeted` objective one more run per target
    class (each image's TARGETED_CLASSES highest-scoring classes at the image, from a random start in the ball,
    as APGD-T); per image the most confident point of all."""
    names, restarts, n = [str(o) for o in cfg.objectives], int(cfg.restarts), len(images)
    objectives = [name for name in names if name != TARGETED]
    targeted = TARGETED in names
    pairs = restarts * len(objectives)
    classes = _target_classes(model, images) if targeted else images.new_zeros((n, 0), dtype=torch.long)
    runs = pairs + classes.shape[1]
    shape = (runs,) + tuple(images.shape)
    rows = images.unsqueeze(0).expand(shape).reshape((runs * n,) + tuple(images.shape[1:]))
    noise = (torch.rand(shape, generator=generator).to(images) * 2 - 1) * gamma
    noise[: len(objectives)] = 0  # restart 0 of every objective starts at the warm start
    first = images if warm_start is None else warm_start
    starts = (first.unsqueeze(0) + noise).reshape(rows.shape)
    probe_names = objectives + ([TARGETED] if targeted else [])
    paired = torch.arange(len(objectives), device=images.device).repeat_interleave(n).repeat(restarts)
    objective_ids = torch.cat([paired, paired.new_full((classes.numel(),), len(objectives))])
    row_targets = torch.cat([targets.repeat(restarts * len(objectives)), classes.T.reshape(-1)])
    found = apgd(Probe(model, probe_names, samples), rows, row_targets, objective_ids, gamma, int(cfg.apgd_steps),
                 starts)
    confidence = found.confidence.view(runs, n)
    best_run = confidence.argmax(dim=0)
    picked = torch.arange(n, device=images.device)
    return found.most_confident.view(shape)[best_run, picked], confidence[best_run, picked]


def _target_classes(model, images) -> torch.Tensor:
    """[N, T]: the targeted runs' classes, each image's highest-scoring at the image itself."""
    with torch.no_grad():
        return top_classes(model(images))


class APGD(Attack):
    """conf/attacks/suite/apgd.yaml: `adaptive_attack`, APGD under every ReLU surrogate, restart and objective."""

    own_surrogates = True

    def keeps_start(self, cfg) -> bool:
        return any(str(name) != TARGETED for name in cfg.objectives)  # their restart 0 starts at warm_start

    def __call__(self, model, images, gamma, generator, cfg, *, targets, warm_start=None, samples=1) -> torch.Tensor:
        return adaptive_attack(model, images, gamma, generator, cfg, targets=targets, warm_start=warm_start,
                               samples=samples)
