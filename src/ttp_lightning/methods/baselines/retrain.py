"""Exact unlearning baseline: A(D_r), a fresh model trained on the retain set with the pretraining settings."""

from torch import nn

from ttp_lightning.data.datamodule import TTPDataModule
from ttp_lightning.fit.pretraining import train_erm
from ttp_lightning.fit.training import RunContext
from ttp_lightning.methods.base import Method
from ttp_lightning.methods.output import MethodOutput


class Retrain(Method):
    """A(D_r): a fresh model trained on the retain set (method=retrain)."""

    def run(self, ctx: RunContext, pretrained: nn.Module, datamodule: TTPDataModule, make_net) -> MethodOutput:
        net = make_net()
        wall = train_erm(ctx, net, datamodule.training_loader("retain"), key=ctx.key_for("retrain"),
                         stage="retraining A(D_r)")
        return MethodOutput(net, {"wall_s": round(wall, 3), "epochs_run": int(ctx.fit_settings.pretrain.epochs)})
