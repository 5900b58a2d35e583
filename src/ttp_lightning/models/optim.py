"""Optimizers and lr schedules (Hydra `_partial_` configs from conf/optimizer and conf/schedule) and the
norm-ball projection shared by every training stage."""

import torch
from torch import nn

from ttp_lightning.config.build import instantiate
from ttp_lightning.config.schema import TrainingSchema, plain


def optimizer_settings(section: TrainingSchema, fused: str = "auto") -> dict:
    """The `optimizer` and `schedule` configs of a training section (`pretrain`, `method`), resolved into plain
    dicts (their lr, weight_decay and momentum interpolate the section's own keys); schedule=none (an empty
    config) gives None."""
    return {"optimizer": plain(section.optimizer), "schedule": plain(section.schedule) if section.schedule else None,
            "fused": str(fused)}


def use_fused(partial, params: list, policy: str) -> bool:
    """performance.fused_optimizer: `true`, or `auto` with every parameter on a GPU, where the optimizer
    class takes `fused` (torch's Adam, AdamW, SGD) and the config does not set it itself."""
    import inspect

    if policy not in ("auto", "true") or "fused" in partial.keywords:
        return False
    if "fused" not in inspect.signature(partial.func).parameters:
        return False
    return policy == "true" or (bool(params) and all(p.is_cuda for p in params))


def configure_optimizer(params, max_epochs: int, optimizer: dict, schedule: dict | None = None,
                        fused: str = "auto"):
    """What LightningModule.configure_optimizers expects: the `_partial_` optimizer applied to `params` (fused
    as `fused`, performance.fused_optimizer, says), and the `_partial_` schedule (stepped once per epoch)
    applied to it; a schedule's T_max left null becomes the fit's epochs."""
    params = list(params)
    partial = instantiate(optimizer)
    opt = partial(params, fused=True) if use_fused(partial, params, str(fused).lower()) else partial(params)
    if schedule is None:
        return opt
    filled = {key: max(1, max_epochs) for key, value in schedule.items() if key == "T_max" and value is None}
    sched = instantiate({k: v for k, v in schedule.items() if k not in filled})(opt, **filled)
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}


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
