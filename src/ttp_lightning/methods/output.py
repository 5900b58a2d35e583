"""What a method hands back to the pipeline."""

from dataclasses import dataclass, field

from torch import nn


@dataclass
class MethodOutput:
    net: nn.Module
    metrics: dict
    history: list = field(default_factory=list)
    certificate: dict | None = None  # certified methods: everything a third party needs to check the noise
