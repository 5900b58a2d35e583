"""A(D) trained for an interval bound (`pretrain.certified.gamma` > 0; issue 80): IBP training with Shi et al.
2021's recipe, so that robust Alg 1's bound term and the release's proofs start from a network whose interval
bound is tight. A(D) is then not the paper's (ERM); the card and docs/provable.md say so.

Each step: a clean forward pass records every BatchNorm's batch statistics (and updates the running ones), the
interval pass bounds z_y - z_j over the L-inf ball of the schedule's radius with BatchNorm affine in those
statistics, and the loss is

  (1 - robust_weight) CE(clean) + robust_weight CE(-margins) + lambda (1 - eps_t / eps) R_warmup

with eps_t 0 for `warmup_epochs`, then Shi et al.'s smoothed ramp over `ramp_epochs`, then the full radius.
"""

import math
from dataclasses import dataclass

import torch.nn.functional as F
from torch import nn

from ttp_lightning.bounds.propagate import trace
from ttp_lightning.bounds.training import (
    batch_statistics,
    certified_cross_entropy,
    class_margins,
    smoothed_ramp,
    warmup_regulariser,
)
from ttp_lightning.bounds.uniformity import input_box
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.models.erm import ERMModule

WARMUP_FROM_EPOCHS = 5  # auto: one warm-up epoch of plain cross entropy from this many epochs (Shi et al.: 1 of 70)
RAMP_SHARE = 0.3        # auto: the radius ramps over this share of the epochs (Shi et al.: 20 of 70 on MNIST)


@dataclass(frozen=True)
class Phases:
    """The certified schedule in epochs: plain cross entropy, then the ramp, then the full radius."""

    warmup: int
    ramp: int
    epochs: int

    def share(self, progress_epochs: float) -> float:
        """eps_t / eps at `progress_epochs` (epochs done, fractional) into the fit."""
        if progress_epochs < self.warmup:
            return 0.0
        if self.ramp == 0:
            return 1.0
        return smoothed_ramp((progress_epochs - self.warmup) / self.ramp)


def phases(epochs: int, warmup="auto", ramp="auto") -> Phases:
    """The schedule by rule: `auto` warm-up is 1 epoch from WARMUP_FROM_EPOCHS epochs (else 0); `auto` ramp is
    RAMP_SHARE of the epochs, rounded up, at most what the warm-up leaves. Explicit values must fit in `epochs`."""
    warmup = (1 if epochs >= WARMUP_FROM_EPOCHS else 0) if warmup == "auto" else int(warmup)
    ramp = min(math.ceil(RAMP_SHARE * epochs), max(epochs - warmup, 0)) if ramp == "auto" else int(ramp)
    if warmup + ramp > epochs:
        raise TTPUserError(f"pretrain.certified: warmup_epochs={warmup} + ramp_epochs={ramp} is more than "
                         f"pretrain.epochs={epochs}; choose at most {epochs} in all")
    return Phases(warmup, ramp, epochs)


class CertifiedERMModule(ERMModule):
    """ERM with the IBP loss at `radius` ([0, 1] pixel units) over `schedule` (module docstring)."""

    def __init__(self, net: nn.Module, optim: dict, radius: float, schedule: Phases, robust_weight: float = 0.5,
                 regulariser: float = 0.5, tolerance: float = 0.5, **kwargs):
        super().__init__(net, optim, **kwargs)
        if self.mixup_alpha > 0:
            raise ValueError("certified pretraining takes no mixup")
        self.radius, self.schedule = float(radius), schedule
        self.robust_weight, self.regulariser, self.tolerance = robust_weight, regulariser, tolerance
        self._graph = None

    def radius_now(self, batch_idx: int) -> float:
        batches = max(int(getattr(self.trainer, "num_training_batches", 1) or 1), 1) \
            if self._trainer is not None else 1
        return self.radius * self.schedule.share(self.current_epoch + batch_idx / batches)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        radius = self.radius_now(batch_idx)
        logits, statistics = batch_statistics(self.net, images)
        clean = F.cross_entropy(logits, labels)
        if radius == 0:
            self.log("train/loss", clean, prog_bar=True)
            return clean
        if self._graph is None:
            self._graph = trace(self.net)
        lower, upper = input_box(images, radius)
        margins, relu_inputs = class_margins(self.net, self._graph, lower, upper, labels, statistics)
        robust = certified_cross_entropy(margins, labels)
        loss = (1 - self.robust_weight) * clean + self.robust_weight * robust
        fade = 1.0 - radius / self.radius
        if self.regulariser > 0 and fade > 0:
            loss = loss + self.regulariser * fade * warmup_regulariser(relu_inputs, (upper - lower) / 2,
                                                                       self.tolerance)
        verified = (margins.masked_fill(F.one_hot(labels, margins.shape[1]).bool(), math.inf).amin(1) > 0)
        self.log_dict({"train/loss": loss, "train/robust_loss": robust, "train/radius": radius * 255,
                       "train/verified": verified.float().mean()}, prog_bar=True)
        return loss
