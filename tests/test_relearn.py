"""The relearning attack: finetuning the released weights on public data, then measuring the forget set."""

import torch
from torch import nn

from ttp_lightning.attacks.relearn import relearn_attack
from ttp_lightning.batching import ImageBatchDataset


def test_relearning_restores_what_finetuning_can_and_leaves_the_model_untouched():
    torch.manual_seed(0)
    centres = torch.rand(3, 1, 4, 4)
    labels = torch.arange(3).repeat_interleave(40)
    images = (centres[labels] + 0.05 * torch.randn(120, 1, 4, 4)).clamp(0, 1)
    public = ImageBatchDataset((images[:90] * 255).round().to(torch.uint8), labels[:90])
    forget = ImageBatchDataset((images[90:] * 255).round().to(torch.uint8), labels[90:])
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    nn.init.zeros_(net[1].weight)
    nn.init.zeros_(net[1].bias)  # uniform everywhere: forget CD 0
    before = [p.clone() for p in net.parameters()]
    scores = relearn_attack(net, public, forget, [1, 10, 100], lr=0.05, batch_size=32, seed=0, device="cpu")
    assert list(scores) == ["1", "10", "100"]
    assert scores["1"]["forget_conf_dist"] < scores["100"]["forget_conf_dist"]  # the forget images come back
    assert scores["100"]["forget_acc"] > 0.9 and scores["100"]["forget_worst_conf_dist"] >= scores["100"]["forget_conf_dist"]
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))  # the attack works on a copy
