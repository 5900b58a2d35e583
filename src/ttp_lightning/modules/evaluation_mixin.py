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
        part = self.eval_parts[dataloader_idx]
        for name, metric in self.val_metrics[part].items():
            metric.update(logits, labels)
            # Logging the Metric object lets Lightning compute (DDP-synced) and reset it at epoch end.
            self.log(f"val/{part}_{name}", metric, on_step=False, on_epoch=True, add_dataloader_idx=False)
