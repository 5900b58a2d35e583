"""GaussianUniform baseline (App. "GaussianUniform"): a fresh model trained, with the pretraining settings,
on D' (every training image plus Gaussian noise of variance `noise_variance`, the paper's 0.1, with its
true label; not clipped, as in the paper) together with D~ (every clean training image with a uniformly
random label). Reports accuracy on the noisy retain and forget sets it trained on (D_r', D_f'), and on a
noisy copy of the test set (D_test'), besides the usual clean metrics."""

import math

import torch
from torch import nn

from ttp_lightning.core.batching import ImageBatchDataset
from ttp_lightning.core.inference import accuracy
from ttp_lightning.data.datamodule import TTPDataModule
from ttp_lightning.fit.pretraining import train_erm
from ttp_lightning.fit.training import RunContext
from ttp_lightning.methods.base import Method
from ttp_lightning.methods.output import MethodOutput


def noisy_copy(dataset: ImageBatchDataset, std: float, generator: torch.Generator) -> ImageBatchDataset:
    images, labels = dataset.everything()
    return ImageBatchDataset(images + std * torch.randn(images.shape, generator=generator), labels)


class GaussianUniform(Method):
    """Noisy copies with true labels plus clean copies with random labels (method=gaussian_uniform)."""

    def run(self, ctx: RunContext, pretrained: nn.Module, datamodule: TTPDataModule, make_net) -> MethodOutput:
        cfg = self.settings
        generator = torch.Generator().manual_seed(int(cfg.seed))
        std = math.sqrt(cfg.noise_variance)
        noisy_retain = noisy_copy(datamodule.dataset("retain"), std, generator)
        noisy_forget = noisy_copy(datamodule.dataset("forget"), std, generator)
        clean, labels = datamodule.dataset("train").everything()
        random_labels = torch.randint(datamodule.info.num_classes, (len(labels),), generator=generator)
        train = datamodule.float_dataset(torch.cat([noisy_retain.images, noisy_forget.images, clean]),
                                         torch.cat([noisy_retain.labels, noisy_forget.labels, random_labels]))
        net = make_net()
        wall = train_erm(ctx, net, datamodule.loader_for(train), key=ctx.key_for("gaussian_uniform"),
                         stage="training on noisy copies")
        metrics = {"wall_s": round(wall, 3), "epochs_run": int(ctx.fit_settings.pretrain.epochs), "train_size": len(train),
                   "noisy_retain_acc": accuracy(net, noisy_retain), "noisy_forget_acc": accuracy(net, noisy_forget)}
        if len(datamodule.test_labels):
            metrics["noisy_test_acc"] = accuracy(net, noisy_copy(datamodule.dataset("test"), std, generator))
        return MethodOutput(net, metrics)
