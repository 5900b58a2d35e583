"""Uniformity and accuracy metrics as torchmetrics Metrics that sum and count, so DDP reduction is exact."""

import torch
from torchmetrics import Metric


class _MeanOverInstances(Metric):
    """Mean over instances of a per-instance score of the softmax; states are a sum and a count."""

    full_state_update = False
    higher_is_better = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def per_instance(self, probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        probs = torch.softmax(logits.detach().float(), dim=-1)
        self.total += self.per_instance(probs, targets).sum().double()
        self.count += probs.shape[0]

    def compute(self) -> torch.Tensor:
        return (self.total / self.count.clamp(min=1)).float()


def conf_dist_of_confidence(top: torch.Tensor, classes: int) -> torch.Tensor:
    """Sec. 5's confidence distance from a top-class probability (measured, attacked or bounded): max(0, top - 1/K);
    the one definition every metric, attack and bound uses."""
    return (top - 1.0 / classes).clamp(min=0.0)


def conf_dist_of_probs(probs: torch.Tensor) -> torch.Tensor:
    """Sec. 5's confidence distance of each softmax row: max(0, max_c p_c - 1/K); 0 means uniform."""
    return conf_dist_of_confidence(probs.max(dim=-1).values, probs.shape[-1])


class ConfidenceDistance(_MeanOverInstances):
    """Sec. 5: mean of max(0, max_c p_c - 1/K). 0 means a uniform softmax."""

    def per_instance(self, probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return conf_dist_of_probs(probs)


class L2UniformDistance(_MeanOverInstances):
    """App. "Evaluating Confidence Distance": mean of ||p - 1/K||_2."""

    def per_instance(self, probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (probs - 1.0 / probs.shape[-1]).norm(dim=-1)


class Accuracy(_MeanOverInstances):
    """Fraction of instances whose arg-max class is the label."""

    higher_is_better = True

    def per_instance(self, probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (probs.argmax(dim=-1) == targets).float()


def conf_dist_per_instance(logits: torch.Tensor) -> torch.Tensor:
    """max(0, max_c p_c - 1/K) of each instance."""
    return conf_dist_of_probs(torch.softmax(logits.detach().float(), dim=-1))


class WorstConfidenceDistance(Metric):
    """The largest CD of any one instance: the worst protected image, not the mean (max-reduced under DDP)."""

    full_state_update = False
    higher_is_better = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("worst", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="max")

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        if len(logits):
            self.worst = torch.maximum(self.worst, conf_dist_per_instance(logits).max().double())

    def compute(self) -> torch.Tensor:
        return self.worst.float()


class CountAbove(Metric):
    """How many instances have a CD above `threshold` (the images a release leaves exposed); summed under DDP."""

    full_state_update = False
    higher_is_better = False

    def __init__(self, threshold: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.threshold = float(threshold)
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        self.count += int((~(conf_dist_per_instance(logits) <= self.threshold)).sum())  # NaN counts as above

    def compute(self) -> torch.Tensor:
        return self.count.float()
