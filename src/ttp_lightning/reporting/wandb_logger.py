"""Lightning's WandbLogger, minus one argument: it always hands wandb.init `anonymous` (None when unset), and
wandb 0.19+ prints "The anonymous setting has no effect" on every run for any value of it."""

from lightning.pytorch.loggers import WandbLogger as _LightningWandbLogger


class WandbLogger(_LightningWandbLogger):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        init = getattr(self, "_wandb_init", None)
        if isinstance(init, dict) and init.get("anonymous") is None:
            init.pop("anonymous", None)
