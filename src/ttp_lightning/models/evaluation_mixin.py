"""Per-epoch validation on named evaluation views (retain/test/forget), logged as val/<part>_<metric>."""

import lightning as L
from torch import nn

from ttp_lightning.metrics import Accuracy, ConfidenceDistance, L2UniformDistance


class PartsValidationMixin(L.LightningModule):
    """Validation dataloader i evaluates part `eval_parts[i]`; metrics are summed, so DDP-exact. The parts
    in `l2_parts` also get l2_dist."""

    def _init_validation(self, eval_parts: list[str], l2_parts: tuple[str, ...] = ()) -> None:
        self.eval_parts = list(eval_parts)

        def metrics(part):
            chosen = {"acc": Accuracy(), "conf_dist": ConfidenceDistance()}
            return nn.ModuleDict({**chosen, **({"l2_dist": L2UniformDistance()} if part in l2_parts else {})})

        self.val_metrics = nn.ModuleDict({part: metrics(part) for part in self.eval_parts})

    def validation_step(self, batch, batch_idx, dataloader_idx: int = 0):
        images, labels = batch
        logits = self(images)
        part = self.eval_parts[dataloader_idx]
        for name, metric in self.val_metrics[part].items():
            metric.update(logits, labels)
            # Logging the Metric object lets Lightning compute (DDP-synced) and reset it at epoch end.
            self.log(f"val/{part}_{name}", metric, on_step=False, on_epoch=True, add_dataloader_idx=False)
