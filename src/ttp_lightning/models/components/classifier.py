"""Wraps a backbone with input normalisation, so algorithms and attacks work in [0, 1] pixel space."""

import torch
from torch import nn

from ttp_lightning.config.build import Part
from ttp_lightning.core.dataset_info import DatasetInfo


class Classifier(nn.Module):
    """normalise -> backbone -> logits. The softmax is applied by losses and metrics."""

    def __init__(self, backbone: nn.Module, mean: tuple[float, ...], std: tuple[float, ...]):
        super().__init__()
        self.backbone = backbone
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone((images - self.mean) / self.std)


NOT_ARGUMENTS = ("checkpoint", "checkpoint_test_acc")  # model settings the pipeline reads, not the network's constructor


def build_classifier(model, info: DatasetInfo) -> Classifier:
    """The configured backbone (`model`: the run's model Part, or a model config, which becomes one) for the data
    set's shape and classes, wrapped. (The checkpoint, when one is set, is loaded by the pipeline in place of
    pretraining.)"""
    model = model if isinstance(model, Part) else Part.of(model)
    backbone = model.build(leave_out=NOT_ARGUMENTS, in_channels=info.channels, image_size=info.image_size,
                           num_classes=info.num_classes)
    return Classifier(backbone, info.mean, info.std)
