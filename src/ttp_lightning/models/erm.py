"""Empirical risk minimisation A(D): pretraining, and retraining on D_r for the exact-unlearning baseline."""

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from ttp_lightning.models.optim import configure_optimizer, project_to_norm_ball


class ERMModule(L.LightningModule):
    """Cross entropy on minibatches; optional projection onto ||w||_2 <= norm_bound after every step, and
    optional mixup (`mixup_alpha` > 0: images and losses mixed with lambda ~ Beta(alpha, alpha))."""

    def __init__(self, net: nn.Module, optim: dict, norm_bound: float | None = None, projection: str = "global",
                 mixup_alpha: float = 0.0):
        super().__init__()
        self.net, self.optim = net, dict(optim)
        self.norm_bound, self.projection, self.mixup_alpha = norm_bound, projection, mixup_alpha

    def forward(self, images):
        return self.net(images)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        if self.mixup_alpha > 0:
            share = torch.distributions.Beta(self.mixup_alpha, self.mixup_alpha).sample().item()
            partner = torch.randperm(len(labels), device=labels.device)
            logits = self(share * images + (1 - share) * images[partner])
            loss = share * F.cross_entropy(logits, labels) + (1 - share) * F.cross_entropy(logits, labels[partner])
        else:
            loss = F.cross_entropy(self(images), labels)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if self.norm_bound is not None:
            project_to_norm_ball(self.net, self.norm_bound, self.projection)

    def configure_optimizers(self):
        return configure_optimizer(self.net.parameters(), self.trainer.max_epochs, **self.optim)
