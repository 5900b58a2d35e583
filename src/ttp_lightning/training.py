"""Builds Trainers from the `trainer` config group and fits a module, timing the fit."""

import time
from dataclasses import dataclass

import hydra
import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from omegaconf import DictConfig


@dataclass
class RunContext:
    """What every stage needs: the composed config, the logger (or False) and where outputs go."""

    cfg: DictConfig
    logger: object = False
    output_dir: str = "."


def make_trainer(ctx: RunContext, max_epochs: int, callbacks: list | None = None,
                 settings: str = "pretrain") -> L.Trainer:
    """A Trainer from the `trainer` config group, logging to the run's logger; it stops with one error line
    when training diverges (`settings`: the config section whose lr trains it, named in that line)."""
    from ttp_lightning.callbacks import FiniteGuard

    section = ctx.cfg[settings]
    stage = "pretraining" if settings == "pretrain" else f"method {ctx.cfg.method.name}"
    callbacks = [*(callbacks or []), FiniteGuard(stage, settings, float(section.lr))]
    if ctx.cfg.trainer.get("enable_progress_bar", True):
        callbacks.append(TQDMProgressBar(refresh_rate=ctx.cfg.progress_bar_refresh_rate))
    return hydra.utils.instantiate(ctx.cfg.trainer, max_epochs=max_epochs, logger=ctx.logger,
                                   callbacks=callbacks, default_root_dir=ctx.output_dir)


def timed_fit(trainer: L.Trainer, module: L.LightningModule, **loaders) -> float:
    """trainer.fit and its wall-clock seconds."""
    start = time.perf_counter()
    trainer.fit(module, **loaders)
    return time.perf_counter() - start
