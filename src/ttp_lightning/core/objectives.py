"""Losses of the Pareto objective (Sec. 3.1): uniformity on the forget set, utility on the retain set."""

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

UniformityLoss = Callable[[torch.Tensor], torch.Tensor]


def kl_to_uniform_each(logits: torch.Tensor) -> torch.Tensor:
    """[N]: KL(p || u) = sum_c p_c (log p_c + log K) of each instance. Its gradient vanishes as p becomes
    one-hot: an image the model is saturated on barely moves (mnist_mlp: 4 of 100 forget images stay at CD 0.9)."""
    log_p = F.log_softmax(logits, dim=-1)
    return (log_p.exp() * (log_p + math.log(logits.shape[-1]))).sum(-1)


def kl_from_uniform_each(logits: torch.Tensor) -> torch.Tensor:
    """[N]: KL(u || p) = logsumexp(z) - mean(z) - log K of each instance (cross entropy to uniform labels minus
    log K). Convex in the logits, and its gradient p - u does not vanish when the model is confident."""
    return torch.logsumexp(logits, dim=-1) - logits.mean(-1) - math.log(logits.shape[-1])


def square_to_uniform_each(logits: torch.Tensor) -> torch.Tensor:
    """[N]: 0.5 ||p - u||_2^2 of each instance."""
    probs = F.softmax(logits, dim=-1)
    return 0.5 * (probs - 1.0 / logits.shape[-1]).pow(2).sum(-1)


def kl_to_uniform(logits: torch.Tensor) -> torch.Tensor:
    """KL(p || u), batch mean. The paper's default L_K."""
    return kl_to_uniform_each(logits).mean()


def kl_from_uniform(logits: torch.Tensor) -> torch.Tensor:
    """KL(u || p), batch mean."""
    return kl_from_uniform_each(logits).mean()


def square_to_uniform(logits: torch.Tensor) -> torch.Tensor:
    """0.5 ||p - u||_2^2, batch mean. Convex in the weights of a linear model (used for LogReg)."""
    return square_to_uniform_each(logits).mean()


UNIFORMITY_LOSSES: dict[str, UniformityLoss] = {
    "kl": kl_to_uniform,
    "reverse_kl": kl_from_uniform,
    "square": square_to_uniform,
}
PER_INSTANCE_LOSSES: dict[str, UniformityLoss] = {
    "kl": kl_to_uniform_each,
    "reverse_kl": kl_from_uniform_each,
    "square": square_to_uniform_each,
}


def smooth_maximum(losses: torch.Tensor, temperature: float) -> torch.Tensor:
    """T log(mean exp(l / T)) over the losses: between their mean and their max, at most T log n below the max."""
    return temperature * (torch.logsumexp(losses / temperature, 0) - math.log(len(losses)))


def reduce_forget(losses: torch.Tensor, reduction: str, fraction: float = 0.2,
                  temperature: float | None = None) -> torch.Tensor:
    """A forget batch's per-image losses as one number: their mean (the paper), their max (the hardest image
    alone), their CVaR (the mean of the `fraction` largest: hardest-image weighting that still sees more
    than one image) or their smooth maximum T log(mean exp(l / T)) at `temperature` T (between the mean and
    the max; the certified learners' smoothmax, certified/maths/reductions.py)."""
    if reduction == "mean":
        return losses.mean()
    if reduction == "max":
        return losses.max()
    if reduction == "cvar":
        count = max(1, math.ceil(fraction * len(losses)))
        return losses.topk(count).values.mean()
    if reduction == "smoothmax":
        return smooth_maximum(losses, temperature)
    raise ValueError(f"unknown forget reduction {reduction!r}")


FORGET_REDUCTIONS = ("mean", "max", "cvar", "smoothmax")


def retain_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """L_A: cross entropy against the true labels, batch mean."""
    return F.cross_entropy(logits, targets)


def pareto_objective(
    forget_logits: torch.Tensor,
    retain_logits: torch.Tensor,
    retain_targets: torch.Tensor,
    theta: float,
    uniformity: UniformityLoss = kl_to_uniform,
    forget_temperature: float = 1.0,
) -> torch.Tensor:
    """theta * L_K(forget) + (1 - theta) * L_A(retain); forget logits divided by the temperature first."""
    return theta * uniformity(forget_logits / forget_temperature) + (1.0 - theta) * retain_loss(
        retain_logits, retain_targets
    )


def combine_gradients(
    forget_grads: list[torch.Tensor], retain_grads: list[torch.Tensor], theta: float, surgery: bool
) -> list[torch.Tensor]:
    """theta * g_f + (1 - theta) * g_r; with `surgery`, PCGrad first: when the two conflict (g_f . g_r < 0)
    each is projected onto the normal plane of the other, so the step does not undo either objective."""
    if surgery:
        dot = sum((f * r).sum() for f, r in zip(forget_grads, retain_grads))
        if dot < 0:
            f_sq = sum(f.pow(2).sum() for f in forget_grads)
            r_sq = sum(r.pow(2).sum() for r in retain_grads)
            forget_grads, retain_grads = (
                [f - dot / r_sq * r for f, r in zip(forget_grads, retain_grads)],
                [r - dot / f_sq * f for f, r in zip(forget_grads, retain_grads)],
            )
    return [theta * f + (1.0 - theta) * r for f, r in zip(forget_grads, retain_grads)]
