import torch

from ttp_lightning.core.metrics import Accuracy, ConfidenceDistance, L2UniformDistance


def test_confidence_distance_extremes_and_value():
    metric = ConfidenceDistance()
    metric.update(torch.zeros(4, 10), torch.zeros(4, dtype=torch.long))  # uniform -> 0
    assert metric.compute().abs() < 1e-7
    metric.reset()
    metric.update(torch.tensor([[100.0, 0.0, 0.0, 0.0]]), torch.tensor([0]))  # one-hot -> 1 - 1/K
    assert torch.isclose(metric.compute(), torch.tensor(0.75))
    metric.reset()
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.4, 0.4, 0.2]]))
    metric.update(logits, torch.tensor([0, 1]))
    assert torch.isclose(metric.compute(), torch.tensor(((0.5 - 1 / 3) + (0.4 - 1 / 3)) / 2))


def test_metrics_average_over_instances_not_batches():
    """Two batches of different sizes: the result is the instance mean (sums and counts)."""
    logits = torch.randn(7, 5) * 3
    labels = torch.randint(0, 5, (7,))
    for cls in (ConfidenceDistance, L2UniformDistance, Accuracy):
        whole, parts = cls(), cls()
        whole.update(logits, labels)
        parts.update(logits[:1], labels[:1])
        parts.update(logits[1:], labels[1:])
        assert torch.isclose(whole.compute(), parts.compute(), atol=1e-6)


def test_l2_distance_and_accuracy_values():
    probs = torch.tensor([[0.7, 0.2, 0.1]])
    l2 = L2UniformDistance()
    l2.update(probs.log(), torch.tensor([0]))
    assert torch.isclose(l2.compute(), (probs - 1 / 3).norm(), atol=1e-6)
    acc = Accuracy()
    acc.update(torch.tensor([[2.0, 1.0], [0.0, 3.0], [5.0, 0.0]]), torch.tensor([0, 1, 1]))
    assert torch.isclose(acc.compute(), torch.tensor(2 / 3))


def test_count_above_counts_a_nan_output_as_above_the_threshold():
    from ttp_lightning.core.metrics import CountAbove

    metric = CountAbove(0.1)
    logits = torch.tensor([[0.0, 0.0], [float("nan"), 0.0], [10.0, 0.0]])  # uniform, NaN, confident
    metric.update(logits, torch.zeros(3, dtype=torch.long))
    assert metric.compute().item() == 2
