"""The run's final metric tables for retain / test / forget through Lightning (`trainer.validate`), with the
same Metric objects as Alg 1's per-epoch validation."""

import contextlib
import logging

import hydra
import lightning as L
import torch
from omegaconf import DictConfig
from torch import nn

from ttp_lightning.data.datamodule import TTPDataModule
from ttp_lightning.models.evaluation_mixin import PartsValidationMixin


class EvaluationModule(PartsValidationMixin):
    """A finished stage's network under `trainer.validate`: one dataloader per evaluation part, the metric
    objects of Alg 1's per-epoch validation (sum/count states, summed across DDP ranks) plus the forget
    set's l2 distance."""

    def __init__(self, net: nn.Module, parts: list[str], exposed_above: float | None = None):
        super().__init__()
        self.net = net
        self._init_validation(parts, l2_parts=("forget",), exposed_above=exposed_above)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)


def evaluation_trainer(trainer_cfg: DictConfig | None = None) -> L.Trainer:
    """The run's trainer settings (devices, strategy) for a validation pass in full precision, with no logger,
    progress bar or checkpoints; without settings, one device (the GPU when there is one)."""
    quiet = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False,
             "enable_checkpointing": False, "callbacks": [], "precision": "32-true"}
    if trainer_cfg is None:
        return L.Trainer(accelerator="auto", devices=1, **quiet)
    return hydra.utils.instantiate(trainer_cfg, **quiet)


def evaluate(model: nn.Module, datamodule: TTPDataModule, trainer_cfg: DictConfig | None = None,
             exposed_above: float | None = None) -> dict[str, float]:
    """{part}_acc and {part}_conf_dist for every evaluation part, plus forget_l2_dist, forget_worst_conf_dist
    and (with `exposed_above`) forget_exposed, the number of forget images whose CD is above it, by
    `trainer.validate` (eval mode). Under DDP every rank takes its own share of each part and the sums are reduced, so all
    ranks must call it; the numbers equal one process's."""
    was_training = model.training
    parts = datamodule.eval_parts()
    module = EvaluationModule(model, parts, exposed_above)
    with _quiet_lightning():
        scores = evaluation_trainer(trainer_cfg).validate(
            module, dataloaders=[datamodule.eval_loader(part) for part in parts], verbose=False)
    model.train(was_training)
    merged = {key: value for per_loader in scores for key, value in per_loader.items()}
    return {f"{part}_{name}": _number(name, merged[f"val/{part}_{name}"])
            for part in parts for name in module.val_metrics[part]}


def _number(name: str, value) -> float | int:
    return round(float(value)) if name == "exposed" else round(float(value), 6)


@contextlib.contextmanager
def _quiet_lightning():
    """Lightning's INFO lines (GPU available, tips) would print for every evaluation."""
    logger = logging.getLogger("lightning.pytorch")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)
