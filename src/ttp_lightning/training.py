"""Builds Trainers from the `trainer` config group and fits a module, timing the fit."""

import time
from dataclasses import dataclass, field

import hydra
import lightning as L
from omegaconf import DictConfig


@dataclass
class RunContext:
    """What every stage needs: the composed config, the logger (or False) and where outputs go."""

    cfg: DictConfig
    logger: object = False
    output_dir: str = "."
    stage_walls: dict = field(default_factory=dict)


def make_trainer(ctx: RunContext, max_epochs: int, callbacks: list | None = None,
                 check_val_every_n_epoch: int | None = 1, limit_val_batches: float | None = None) -> L.Trainer:
    kwargs = {"max_epochs": max_epochs, "logger": ctx.logger, "callbacks": callbacks or [],
              "default_root_dir": ctx.output_dir}
    if check_val_every_n_epoch is None:
        kwargs["limit_val_batches"] = 0
    else:
        kwargs["check_val_every_n_epoch"] = check_val_every_n_epoch
    return hydra.utils.instantiate(ctx.cfg.trainer, **kwargs)


def timed_fit(trainer: L.Trainer, module: L.LightningModule, **loaders) -> float:
    """trainer.fit and its wall-clock seconds."""
    start = time.perf_counter()
    trainer.fit(module, **loaders)
    return time.perf_counter() - start
