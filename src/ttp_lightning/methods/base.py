"""What a method is: one YAML in conf/method/ whose `_target_` names a Method subclass, plus that class.

The pipeline builds the class its `_target_` names with the YAML's settings, checked once: the schema's
object (alg1/schema.ParetoSchema, certified/schema.CertifiedSchema, ...; a config for a method without a schema). It then
calls `check(settings)` with the whole run's settings (config.schema.MainSchema) before any work (bad values
end in one `error:` line), `check_data(datamodule)` once the data is read, and `run(ctx, pretrained, datamodule, make_net)`, which returns a MethodOutput.
Adding a method touches no other file: see docs/extending.md.
"""

from torch import nn

from ttp_lightning.config.schema import MainSchema
from ttp_lightning.methods.output import MethodOutput


class Method:
    """Base class. `self.settings` holds the method's settings (the run's `method` section, typed)."""

    def __init__(self, settings):
        self.settings = settings
        self.name = str(settings.name)

    def check(self, settings: MainSchema) -> None:
        """Raise TTPUserError for a bad value of this method's settings (cross-field checks included)."""

    def check_data(self, datamodule) -> None:
        """Raise TTPUserError for a setting the data makes impossible (called once the data is read, before any
        training)."""

    def hold_out(self, datamodule, pretrains: bool) -> None:
        """Take the images the method's rules read accuracy on out of D before A(D) is trained (`pretrains`:
        this run trains A(D) itself, no model.checkpoint); by default nothing is taken."""

    def run(self, ctx, pretrained: nn.Module, datamodule, make_net) -> MethodOutput:
        """Apply the method to a copy of `pretrained` (or train a fresh model from `make_net()`)."""
        raise NotImplementedError(f"{type(self).__name__}.run")
