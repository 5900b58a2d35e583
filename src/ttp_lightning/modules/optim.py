"""Optimizers, schedules and the norm-ball projection shared by every training stage."""

import torch
from torch import nn

OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
SCHEDULES = ("none", "cosine")
PROJECTIONS = ("global", "per_tensor")


def configure_optimizer(params, max_epochs: int, optimizer: str = "adam", lr: float = 0.01,
                        weight_decay: float = 0.0, momentum: float = 0.9, schedule: str = "none"):
    """Return what LightningModule.configure_optimizers expects; cosine anneals per epoch to zero."""
    kwargs = {"lr": lr, "weight_decay": weight_decay}
    if optimizer == "sgd":
        kwargs["momentum"] = momentum
    opt = OPTIMIZERS[optimizer](params, **kwargs)
    if schedule == "cosine":
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, max_epochs))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}
    return opt


@torch.no_grad()
def project_to_norm_ball(module: nn.Module, bound: float, mode: str = "global") -> None:
    """Project trainable weights onto ||w||_2 <= bound: jointly (global norm) or each tensor on its own."""
    params = [p for p in module.parameters() if p.requires_grad]
    if mode == "global":
        norm = torch.sqrt(sum(p.pow(2).sum() for p in params))
        if norm > bound:
            for p in params:
                p.mul_(bound / norm)
    else:
        for p in params:
            norm = p.norm()
            if norm > bound:
                p.mul_(bound / norm)
