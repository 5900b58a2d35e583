"""Per-epoch validation on named evaluation views (retain/test/forget), logged as val/<part>_<metric>."""

import lightning as L
from torch import nn

from ttp_lightning.core.metrics import (
    Accuracy,
    ConfidenceDistance,
    CountAbove,
    L2UniformDistance,
    WorstConfidenceDistance,
)

PER_IMAGE_PART = "forget"


class PartsValidationMixin(L.LightningModule):
    """Validation dataloader i evaluates part `eval_parts[i]`; metrics are summed (or maximised), so DDP-exact.
    The parts in `l2_parts` also get l2_dist; the forget part also gets worst_conf_dist (its most confident
    image) and, with `exposed_above`, exposed (how many of its images have a CD above that)."""

    def _init_validation(self, eval_parts: list[str], l2_parts: tuple[str, ...] = (),
                         exposed_above: float | None = None) -> None:
        self.eval_parts = list(eval_parts)

        def metrics(part):
            chosen = {"acc": Accuracy(), "conf_dist": ConfidenceDistance()}
            if part in l2_parts:
                chosen["l2_dist"] = L2UniformDistance()
            if part == PER_IMAGE_PART:
                chosen["worst_conf_dist"] = WorstConfidenceDistance()
                if exposed_above is not None:
                    chosen["exposed"] = CountAbove(exposed_above)
            return nn.ModuleDict(chosen)

        self.val_metrics = nn.ModuleDict({part: metrics(part) for part in self.eval_parts})

    def validation_step(self, batch, batch_idx, dataloader_idx: int = 0):
        images, labels = batch
        logits = self(images)
        part = self.eval_parts[dataloader_idx]
        for name, metric in self.val_metrics[part].items():
            metric.update(logits, labels)
            # Logging the Metric object lets Lightning compute (DDP-synced) and reset it at epoch end.
            self.log(f"val/{part}_{name}", metric, on_step=False, on_epoch=True, add_dataloader_idx=False)

    def epoch_value(self, key: str) -> float | None:
        """This validation epoch's value of the logged metric `key` (val/<part>_<name>) so far, computed (DDP-
        synced) before Lightning's epoch end; None where the key is not one of these metrics."""
        for part, chosen in self.val_metrics.items():
            for name, metric in chosen.items():
                if key == f"val/{part}_{name}":
                    return float(metric.compute())
        return None
