"""What a method is: one YAML in conf/method/ whose `_target_` names a Method subclass, plus that class.

Hydra instantiates the class with the YAML's settings (`_recursive_=False`: nested settings stay config).
The pipeline then calls `check(cfg)` before any work (bad values end in one `error:` line) and
`run(ctx, pretrained, datamodule, make_net)`, which returns a MethodOutput. Adding a method touches no
other file: see the README's "Adding a method".
"""

from omegaconf import DictConfig, OmegaConf
from torch import nn

from ttp_lightning.methods.output import MethodOutput


class Method:
    """Base class. `self.settings` holds the method's config section (the same as `cfg.method`)."""

    def __init__(self, **settings):
        self.settings = OmegaConf.create(settings)
        self.name = str(settings["name"])

    def check(self, cfg: DictConfig) -> None:
        """Raise TTPUserError for a bad value of this method's settings (cross-field checks included)."""

    def run(self, ctx, pretrained: nn.Module, datamodule, make_net) -> MethodOutput:
        """Apply the method to a copy of `pretrained` (or train a fresh model from `make_net()`)."""
        raise NotImplementedError(f"{type(self).__name__}.run")
