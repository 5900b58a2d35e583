"""Synthetic baseline (App. "Baseline Details"): k points per forget instance, drawn uniformly from the l2
ball of radius `radius`/255 around it in [0, 1] pixel space (then clipped to [0, 1]), each with a
uniformly random label, added to the retain set; a fresh model trained on that with the pretraining
settings. The forget instances themselves are not trained on."""

import torch
from torch import nn

from ttp_lightning.data.datamodule import TTPDataModule
from ttp_lightning.fit.pretraining import train_erm
from ttp_lightning.fit.training import RunContext
from ttp_lightning.methods.base import Method
from ttp_lightning.methods.output import MethodOutput


def uniform_ball_points(centres: torch.Tensor, k: int, radius: float, generator: torch.Generator) -> torch.Tensor:
    """k points per centre, uniform in the l2 ball of `radius` (direction ~ normalised Gaussian, distance
    radius * U^(1/d)), clipped to [0, 1]."""
    flat = centres.flatten(1).repeat_interleave(k, dim=0)
    directions = torch.randn(flat.shape, generator=generator)
    directions /= directions.norm(dim=1, keepdim=True)
    distances = radius * torch.rand(len(flat), 1, generator=generator) ** (1.0 / flat.shape[1])
    return (flat + distances * directions).clamp(0, 1).view(len(flat), *centres.shape[1:])


class Synthetic(Method):
    """D_r plus `k` synthetic points per forget instance with random labels (method=synthetic)."""

    def run(self, ctx: RunContext, pretrained: nn.Module, datamodule: TTPDataModule, make_net) -> MethodOutput:
        cfg = self.settings
        generator = torch.Generator().manual_seed(int(cfg.seed))
        forget_images, _ = datamodule.dataset("forget").everything()
        points = uniform_ball_points(forget_images, int(cfg.k), cfg.radius / 255.0, generator)
        labels = torch.randint(datamodule.info.num_classes, (len(points),), generator=generator)
        retain_images, retain_labels = datamodule.dataset("retain").everything()
        train = datamodule.float_dataset(torch.cat([retain_images, points]), torch.cat([retain_labels, labels]))
        net = make_net()
        wall = train_erm(ctx, net, datamodule.loader_for(train), key=ctx.key_for("synthetic"),
                         stage="training on D_r + synthetic points")
        return MethodOutput(net, {"wall_s": round(wall, 3), "epochs_run": int(ctx.fit_settings.pretrain.epochs),
                                  "synthetic_points": len(points), "train_size": len(train)})
