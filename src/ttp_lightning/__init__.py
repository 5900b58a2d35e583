"""ttp_lightning: test-time privacy for open-weight image classifiers (Lightning + Hydra)."""

from ttp_lightning.config.naming import register as _register_resolvers
from ttp_lightning.config.schema import register as _register_schemas
from ttp_lightning.version import __version__ as __version__

_register_schemas()  # the typed config schemas the YAML files name (group `schema`)
_register_resolvers()  # ${ttp.model_name:...}: the default experiment name


def __getattr__(name: str):
    """`ttp_lightning.load_released(DIR)`, imported on first use (the CLI does not pay for torch here)."""
    if name == "load_released":
        from ttp_lightning.release import load_released

        return load_released
    raise AttributeError(f"module 'ttp_lightning' has no attribute {name!r}")
