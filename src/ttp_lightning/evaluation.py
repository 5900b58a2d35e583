"""Measuring a finished model: the run's final metric tables through Lightning (`evaluate`: trainer.validate
of models/evaluation.py's module, every DDP rank its share), and single-process helpers (metrics over given
batches, predictions, softmax bars)."""

import contextlib
import logging

import hydra
import lightning as L
import torch
from omegaconf import DictConfig
from torch import nn

from ttp_lightning.batching import iterate_shard
from ttp_lightning.data.datamodule import TTPDataModule
from ttp_lightning.metrics import Accuracy, ConfidenceDistance, L2UniformDistance
from ttp_lightning.models.evaluation import EvaluationModule
from ttp_lightning.nn_modes import evaluating

LOCAL = {"sync_on_compute": False}  # one process evaluates everything; never wait for other ranks


def eval_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@torch.no_grad()
def batch_metrics(model: nn.Module, batches, l2: bool = False) -> dict[str, float]:
    """acc and conf_dist (and l2_dist) of the model, already in eval mode on `eval_device()`, over
    (images, labels) batches."""
    device = eval_device()
    metrics = {"acc": Accuracy(**LOCAL), "conf_dist": ConfidenceDistance(**LOCAL)}
    if l2:
        metrics["l2_dist"] = L2UniformDistance(**LOCAL)
    for images, labels in batches:
        logits = model(images.to(device))
        for metric in metrics.values():
            metric.update(logits.cpu(), labels)
    return {name: round(float(metric.compute()), 6) for name, metric in metrics.items()}


@torch.no_grad()
def predictions(model: nn.Module, dataset, chunk_size: int = 1024, device: torch.device | None = None) -> torch.Tensor:
    """The model's arg-max class for every instance of `dataset`, in order (eval mode), on `device` (default
    `eval_device()`; inside a fit, the module's own device)."""
    device = eval_device() if device is None else device
    was_training = model.training
    model.eval().to(device)
    images, _ = dataset.everything()
    out = torch.cat([model(images[i:i + chunk_size].to(device)).argmax(dim=-1).cpu()
                     for i in range(0, len(images), chunk_size)])
    model.train(was_training)
    return out


def accuracy(net: nn.Module, dataset, chunk_size: int = 1024) -> float:
    """The accuracy of `net` (in eval mode; its mode is restored) on the whole of `dataset`, in this process
    alone (every DDP rank computes the same number)."""
    was_training = net.training
    net.eval().to(eval_device())
    value = batch_metrics(net, iterate_shard(dataset, chunk_size, sharded=False))["acc"]
    net.train(was_training)
    return value


@torch.no_grad()
def probabilities(model: nn.Module, images: torch.Tensor, device, chunk_size: int = 1024) -> torch.Tensor:
    """[N, K] float64 on the CPU: the model's softmax of every image (eval mode, moved to `device`, in chunks;
    every module's own mode is restored afterwards)."""
    with evaluating(model.to(device)):
        return torch.cat([model(images[i:i + chunk_size].to(device)).softmax(-1).double().cpu()
                          for i in range(0, len(images), chunk_size)])


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
