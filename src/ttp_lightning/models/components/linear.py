"""Logistic regression and the two-layer ReLU MLP of the paper."""

from torch import nn


class LogReg(nn.Sequential):
    """A single affine layer on flattened pixels (softmax applied by the loss)."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int):
        super().__init__(nn.Flatten(), nn.Linear(in_channels * image_size * image_size, num_classes))


class MLP(nn.Sequential):
    """Flatten -> Linear -> ReLU -> Linear."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int, hidden_dim: int = 100):
        super().__init__(
            nn.Flatten(),
            nn.Linear(in_channels * image_size * image_size, hidden_dim),
            nn.ReLU(),
            nn.Linear(hidden_dim, num_classes),
        )
