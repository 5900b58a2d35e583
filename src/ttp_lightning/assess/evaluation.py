"""Measuring a finished model: the run's final metric tables through Lightning (`evaluate`: trainer.validate
of models/evaluation.py's module, every DDP rank its share) and the softmax bars (single-process helpers:
core/inference.py)."""

import contextlib
import logging

import lightning as L
import torch
from torch import nn

from ttp_lightning.config.build import Part
from ttp_lightning.core.inference import eval_device
from ttp_lightning.data.datamodule import TTPDataModule
from ttp_lightning.models.evaluation import EvaluationModule


@torch.no_grad()
def forget_softmax(model: nn.Module, datamodule: TTPDataModule, count: int = 5) -> list[dict]:
    """Softmax outputs on the first `count` forget instances, with their labels (for the bar charts)."""
    device = eval_device()
    was_training = model.training
    model.eval().to(device)
    forget = datamodule.dataset("forget")
    images, labels = forget[list(range(min(count, len(forget))))]
    probs = model(images.to(device)).softmax(dim=1).cpu()
    model.train(was_training)
    return [{"label": int(label), "softmax": [round(float(p), 6) for p in row]} for label, row in zip(labels, probs)]


def evaluation_trainer(trainer: Part | None = None) -> L.Trainer:
    """The run's trainer settings (devices, strategy) for a validation pass in full precision, with no logger,
    progress bar or checkpoints; without settings, one device (the GPU when there is one)."""
    quiet = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False,
             "enable_checkpointing": False, "callbacks": [], "precision": "32-true"}
    if trainer is None:
        return L.Trainer(accelerator="auto", devices=1, **quiet)
    return trainer.build(**quiet)


def evaluate(model: nn.Module, datamodule: TTPDataModule, trainer: Part | None = None,
             exposed_above: float | None = None) -> dict[str, float]:
    """{part}_acc and {part}_conf_dist for every evaluation part, plus forget_l2_dist, forget_worst_conf_dist
    and (with `exposed_above`) forget_exposed, the number of forget images whose CD is above it, by
    `trainer.validate` (eval mode). Under DDP every rank takes its own share of each part and the sums are reduced, so all
    ranks must call it; the numbers equal one process's."""
    was_training = model.training
    parts = datamodule.eval_parts()
    module = EvaluationModule(model, parts, exposed_above)
    with _quiet_lightning():
        scores = evaluation_trainer(trainer).validate(
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
