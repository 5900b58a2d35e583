"""LabelDP baseline: two-stage training with randomized response with a prior (Ghazi et al. 2021, LP-2ST),
a PyTorch port. The forget set stays in the training data like any other instance.

The training set is split at random: stage 1 (`stage_fraction` of it) gets labels by plain randomized
response (RR with a uniform prior) and trains a fresh model with mixup. Stage 2 takes the stage-1
model's softmax (at `temperature`) as each instance's prior, draws its labels by RR-with-prior, and
continues training that model, with mixup, on the noisy labels of both stages. Each instance's label is
used once, so the whole run is `epsilon`-label-DP.

RR-with-prior keeps the top k* classes of the prior, k* = argmax over k in {1..K} of
e^eps / (e^eps + k - 1) * (sum of the k largest prior probabilities), with k counted from 1 as in the
paper's algorithm (its official JAX code is reported to pick a k* off by one from this; we follow the
paper, whose privacy proof is for this rule). If the true label is among them it is kept with
probability e^eps / (e^eps + k* - 1), else one of the other k* - 1 is drawn uniformly; if it is not, a
uniform draw from the k* classes is returned.
"""

import math

import torch
from torch import nn

from ttp_lightning.core.inference import eval_device
from ttp_lightning.data.datamodule import TTPDataModule
from ttp_lightning.fit.pretraining import train_erm
from ttp_lightning.fit.training import RunContext
from ttp_lightning.methods.base import Method
from ttp_lightning.methods.output import MethodOutput


def rr_with_prior(prior: torch.Tensor, labels: torch.Tensor, epsilon: float,
                  generator: torch.Generator) -> torch.Tensor:
    """One epsilon-DP randomized-response draw per row of `prior` (n, K) for the true `labels` (n,)."""
    num_classes = prior.shape[1]
    order = prior.argsort(dim=1, descending=True)
    top_mass = prior.gather(1, order).cumsum(dim=1)
    keep_weight = math.exp(epsilon) / (math.exp(epsilon) + torch.arange(num_classes, dtype=prior.dtype))
    sizes = (keep_weight * top_mass).argmax(dim=1) + 1  # k*, counted from 1
    out = torch.empty_like(labels)
    for row in range(len(labels)):
        size, label = int(sizes[row]), int(labels[row])
        candidates = order[row, :size]
        if label in candidates.tolist():
            keep = math.exp(epsilon) / (math.exp(epsilon) + size - 1)
            if size == 1 or torch.rand((), generator=generator).item() < keep:
                out[row] = label
            else:
                others = candidates[candidates != label]
                out[row] = others[torch.randint(len(others), (), generator=generator)]
        else:
            out[row] = candidates[torch.randint(size, (), generator=generator)]
    return out


@torch.no_grad()
def softmax_prior(net: nn.Module, images: torch.Tensor, temperature: float, chunk_size: int = 1024) -> torch.Tensor:
    device = eval_device()
    net.eval().to(device)
    return torch.cat([(net(chunk.to(device)) / temperature).softmax(dim=1).cpu()
                      for chunk in images.split(chunk_size)])


class LabelDP(Method):
    """Two stages of randomized response with a prior (method=labeldp)."""

    def run(self, ctx: RunContext, pretrained: nn.Module, datamodule: TTPDataModule, make_net) -> MethodOutput:
        cfg = self.settings
        generator = torch.Generator().manual_seed(int(cfg.seed))
        images, labels = datamodule.dataset("train").everything()
        order = torch.randperm(len(labels), generator=generator)
        cut = round(cfg.stage_fraction * len(labels))
        first, second = order[:cut], order[cut:]
        num_classes = datamodule.info.num_classes

        uniform = torch.full((len(first), num_classes), 1.0 / num_classes)
        first_labels = rr_with_prior(uniform, labels[first], cfg.epsilon, generator)
        net = make_net()
        wall = train_erm(ctx, net, datamodule.loader_for(datamodule.float_dataset(images[first], first_labels)),
                         cfg.mixup_alpha, key=ctx.key_for("labeldp_stage1"), stage="LabelDP stage 1")

        prior = softmax_prior(net, images[second], cfg.temperature)
        second_labels = rr_with_prior(prior, labels[second], cfg.epsilon, generator)
        both = torch.cat([first, second])
        stage_two = datamodule.float_dataset(images[both], torch.cat([first_labels, second_labels]))
        wall += train_erm(ctx, net, datamodule.loader_for(stage_two), cfg.mixup_alpha, key=ctx.key_for("labeldp_stage2"),
                          stage="LabelDP stage 2")
        metrics = {
            "wall_s": round(wall, 3), "stage_sizes": [len(first), len(second)],
            "stage1_labels_kept": round(float((first_labels == labels[first]).float().mean()), 6),
            "stage2_labels_kept": round(float((second_labels == labels[second]).float().mean()), 6),
        }
        return MethodOutput(net, metrics)
