"""What a test-time-privacy adversary maximises on each forget image, per image (higher = more confident).

logsumexp     log sum_c exp(z_c): the paper's smooth max of the logits (rho in App. "Defining Test-Time
              Privacy Attacks"); grows with the scale of the logits, not only with their spread.
max_softmax   max_c log p_c: the confidence itself, on a log scale (the same arg-max, better gradients).
ce_pretrained log p_t with t the pretrained model's prediction: the label the adversary wants back
              (minus the cross-entropy towards it), the attack a data subject fears most.
targeted      log p_t towards other classes in turn: APGD runs it once per class, each image's TARGETED_CLASSES
              highest-scoring classes at the image (APGD-T's targets, Croce & Hein 2020: every class when there
              are at most that many); the inner attack of robust training draws t at random per image. Any
              confident prediction is a harm, whichever class: a uniform model's arg-max flips between classes,
              so max_softmax's gradient wanders, and on the noisy-MNIST stand-in a release no untargeted
              objective moved above CD 0.1 went above it for 96 of 100 images towards fixed classes.
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
                                    "ce_pretrained": ce_pretrained, "targeted": ce_pretrained}
TARGETED = "targeted"  # the objective whose targets are the attack's own choice of class, not A(D)'s prediction
TARGETED_CLASSES = 10  # APGD's targeted runs per image: its highest-scoring classes at the image, at most this many


def top_classes(logits: torch.Tensor, count: int = TARGETED_CLASSES) -> torch.Tensor:
    """[N, min(count, K)]: each image's classes by descending logit (APGD-T's targets; every class when K <=
    count)."""
    return logits.topk(min(count, logits.shape[-1]), dim=-1).indices
