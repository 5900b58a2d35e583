"""Single-process inference helpers: the evaluation device, a model's metrics over given batches, its
predictions, accuracy and softmax probabilities (every DDP rank computes the same numbers)."""

import torch
from torch import nn

from ttp_lightning.core.batching import iterate_shard
from ttp_lightning.core.metrics import Accuracy, ConfidenceDistance, L2UniformDistance
from ttp_lightning.core.nn_modes import evaluating

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
