"""Lightning's WandbLogger, with each training phase on its own step axis, and minus one argument.

Phases: the run trains in several fits (pretraining A(D), Alg 1, the relearning floor's retraining, ...), each
restarting Lightning's global step; logged under one name their curves overlap. `set_phase` (called by
fit/training.fit) puts a fit's metrics under `<phase>/` with its own `<phase>/step`, declared to wandb with
define_metric so each phase's charts have their own x axis.

`anonymous`: Lightning always hands wandb.init `anonymous` (None when unset), and wandb 0.19+ prints "The anonymous
setting has no effect" on every run for any value of it."""

from lightning.pytorch.loggers import WandbLogger as _LightningWandbLogger
from lightning.pytorch.utilities import rank_zero_only


class WandbLogger(_LightningWandbLogger):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        init = getattr(self, "_wandb_init", None)
        if isinstance(init, dict) and init.get("anonymous") is None:
            init.pop("anonymous", None)
        self._phase: str | None = None
        self._declared: set[str] = set()

    def set_phase(self, phase: str | None) -> None:
        """The phase the next metrics belong to (None: Lightning's own names and step)."""
        self._phase = phase

    @rank_zero_only
    def log_metrics(self, metrics, step=None) -> None:
        phase = self._phase
        if phase is None:
            super().log_metrics(metrics, step)
            return
        if phase not in self._declared:
            self.experiment.define_metric(f"{phase}/step", hidden=True)
            self.experiment.define_metric(f"{phase}/*", step_metric=f"{phase}/step")
            self._declared.add(phase)
        row = {f"{phase}/{key}": value for key, value in metrics.items()}
        if step is not None:
            row[f"{phase}/step"] = step
        self.experiment.log(row)
