"""What a test-time-privacy adversary maximises on each forget image, per image (higher = more confident).

logsumexp     log sum_c exp(z_c): the paper's smooth max of the logits (rho in App. "Defining Test-Time
              Privacy Attacks"); grows with the scale of the logits, not only with their spread.
max_softmax   max_c log p_c: the confidence itself, on a log scale (the same arg-max, better gradients).
ce_pretrained log p_t with t the pretrained model's prediction: the label the adversary wants back
              (minus the cross-entropy towards it), the attack a data subject fears most.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F

Objective = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def logsumexp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(logits, dim=-1)


def max_softmax(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.log_softmax(logits, dim=-1).max(dim=-1).values


def ce_pretrained(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.log_softmax(logits, dim=-1).gather(-1, targets.view(-1, 1)).squeeze(-1)


OBJECTIVES: dict[str, Objective] = {"logsumexp": logsumexp, "max_softmax": max_softmax,
                                    "ce_pretrained": ce_pretrained}
