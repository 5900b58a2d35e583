"""Optimizers and lr schedules (Hydra `_partial_` configs from conf/optimizer and conf/schedule) and the
norm-ball projection shared by every training stage."""

import hydra
import torch
from torch import nn

from ttp_lightning.config_schema import TrainingSchema, plain


def optimizer_settings(section: TrainingSchema, fused: str = "auto") -> dict:
    """The `optimizer` and `schedule` configs of a training section (`pretrain`, `method`), resolved into plain
    dicts (their lr, weight_decay and momentum interpolate the section's own keys); schedule=none (an empty
    config) gives None."""
    return {"optimizer": plain(section.optimizer), "schedule": plain(section.schedule) if section.schedule else None,
            "fused": str(fused)}


# lr=auto (robust Alg 1): Adam moves each weight by about lr a step, so lr x steps bounds how far finetuning can
# travel from A(D). It is held at LR_TRAVEL, Alg 1's 1e-2 over the 1,000 steps of the digits default job, within
# LR_RANGE: Adam's own default 1e-3 (at 1e-2 over 46,900 steps the noisy-MNIST stand-in lost 3.4 test points
# to overfitting, at 1e-3 one) to Alg 1's 1e-2 (at 1e-3 over its 1,000 steps 3 of digits' 20 forget images
# never became uniform). README, "Robust Alg 1's defaults".
LR_TRAVEL = 10.0
LR_RANGE = (1.0e-3, 1.0e-2)


def fit_lr(setting, steps: int) -> float:
    """A training section's lr: the number it sets, or for `auto` LR_TRAVEL / `steps` (the fit's optimizer
    steps) within LR_RANGE."""
    if setting != "auto":
        return float(setting)
    return min(LR_RANGE[1], max(LR_RANGE[0], LR_TRAVEL / max(1, int(steps))))


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
    partial = hydra.utils.instantiate(optimizer)
    opt = partial(params, fused=True) if use_fused(partial, params, str(fused).lower()) else partial(params)
    if schedule is None:
        return opt
    filled = {key: max(1, max_epochs) for key, value in schedule.items() if key == "T_max" and value is None}
    sched = hydra.utils.instantiate({k: v for k, v in schedule.items() if k not in filled})(opt, **filled)
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
