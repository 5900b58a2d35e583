"""Per-epoch validation on named evaluation views (retain/test/forget), logged as val/<part>_<metric>."""

import lightning as L
from torch import nn

from ttp_lightning.metrics import Accuracy, ConfidenceDistance


class PartsValidationMixin(L.LightningModule):
    """Validation dataloader i evaluates part `eval_parts[i]`; metrics are summed, so DDP-exact."""

    def _init_validation(self, eval_parts: list[str]) -> None:
        self.eval_parts = list(eval_parts)
        self.val_metrics = nn.ModuleDict(
            {part: nn.ModuleDict({"acc": Accuracy(), "conf_dist": ConfidenceDistance()}) for part in self.eval_parts}
        )

    def validation_step(self, batch, batch_idx, dataloader_idx: int = 0):
        images, labels = batch
        logits = self(images)
        for metric in self.val_metrics[self.eval_parts[dataloader_idx]].values():
            metric.update(logits, labels)

    def on_validation_epoch_end(self) -> None:
        for part, metrics in self.val_metrics.items():
            for name, metric in metrics.items():
                self.log(f"val/{part}_{name}", metric.compute())
                metric.reset()
