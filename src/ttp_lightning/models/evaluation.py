"""The LightningModule behind the run's final metric tables for retain / test / forget (`trainer.validate`,
run by assess.evaluation.evaluate), with the same Metric objects as Alg 1's per-epoch validation."""

import torch
from torch import nn

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
