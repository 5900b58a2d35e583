"""Certified uniformity: upper bounds on how confident a network can be anywhere near an image.

For an image x and a radius gamma (L-inf, [0, 1] pixels), the box B = [x - gamma, x + gamma] intersected with
[0, 1]^d holds every image an adversary may submit. From lower bounds d_jc <= z_j - z_c over B
(propagate.py):

  softmax_c(z) = 1 / sum_j exp(z_j - z_c) <= 1 / sum_j exp(d_jc)      for every x' in B,

so max_c of the right-hand side, minus 1/K, bounds the confidence distance (CD) at every point of B: a
provable statement anyone holding the released weights and the image can recompute (`python -m
ttp_lightning.verify robust`). At gamma = 0 it is the clean CD.

For training (robust Alg 1's interval term, as GOOD, Bitterwolf et al. 2020), the reverse KL divergence
KL(u || softmax z) = logsumexp_j (z_j - mean z) - log K is bounded over B by logsumexp_j of upper bounds on
z_j - mean z. It is 0 only where the output is uniform on the whole box, it bounds KL(u || p) at every point
(so, by Pinsker's inequality, max_c p_c - 1/K <= sqrt(bound / 2) there), and unlike a bound on the top
probability its gradient does not vanish when the network is confident.
"""

import copy
import math

import torch
from torch import nn

from ttp_lightning.ibp.propagate import centred_logit_upper_bounds, logit_difference_lower_bounds, trace


def input_box(images: torch.Tensor, radius: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The L-inf ball of `radius` around each image, intersected with the pixel range [0, 1]."""
    return (images - radius).clamp(0.0, 1.0), (images + radius).clamp(0.0, 1.0)


def confidence_upper_bound(difference_lower: torch.Tensor) -> torch.Tensor:
    """[N]: an upper bound on max_c softmax_c over the box, from [N, K, K] lower bounds on z_j - z_c."""
    return torch.exp(-torch.logsumexp(difference_lower, dim=1)).amax(dim=-1)


@torch.no_grad()
def certified_conf_dist(net: nn.Module, images: torch.Tensor, gamma: float, chunk_size: int = 256,
                        device: torch.device | str = "cpu") -> torch.Tensor:
    """[N] float64: per image, an upper bound on the CD anywhere in the L-inf ball of radius `gamma` / 255
    around it (and in [0, 1]). Computed in float64 on a copy of the network in eval mode."""
    model = copy.deepcopy(net).to(device=device, dtype=torch.float64).eval()
    graph = trace(model)
    radius = float(gamma) / 255.0
    out = []
    for start in range(0, len(images), chunk_size):
        x = images[start:start + chunk_size].to(device=device, dtype=torch.float64)
        lower, upper = input_box(x, radius)
        differences = logit_difference_lower_bounds(model, lower, upper, graph)
        out.append((confidence_upper_bound(differences) - 1.0 / differences.shape[-1]).clamp(min=0.0).cpu())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def reverse_kl_upper_bound(net: nn.Module, images: torch.Tensor, radius: float, graph=None) -> torch.Tensor:
    """[N]: an upper bound on KL(u || softmax(net(x'))) for every x' in the ball of `radius` ([0, 1] pixel
    units) around each image; differentiable in the network's weights (robust Alg 1's interval term).
    BatchNorm layers must be in eval mode."""
    lower, upper = input_box(images, radius)
    centred = centred_logit_upper_bounds(net, lower, upper, graph)
    return torch.logsumexp(centred, dim=-1) - math.log(centred.shape[-1])
