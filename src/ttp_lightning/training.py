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


def choose_threads(cfg: DictConfig) -> int:
    """Intra-op threads for this process: `threads` when an integer; with `auto`, OMP_NUM_THREADS when set,
    else the CPU cores shared evenly by the processes this run starts on this machine."""
    import os

    import torch

    if cfg.get("threads", "auto") != "auto":
        threads = int(cfg.threads)
    elif os.environ.get("OMP_NUM_THREADS", "").isdigit():
        threads = int(os.environ["OMP_NUM_THREADS"])
    else:
        trainer = cfg.trainer
        on_cpu = str(trainer.get("accelerator", "cpu")) == "cpu"
        devices = trainer.get("devices", 1)
        processes = int(devices) if on_cpu and "ddp" in str(trainer.get("strategy", "")) and \
            str(devices).isdigit() else 1
        threads = max(1, (os.cpu_count() or 1) // max(processes, 1))
    torch.set_num_threads(max(1, threads))
    return torch.get_num_threads()


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
