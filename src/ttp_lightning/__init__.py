"""ttp_lightning: test-time privacy for open-weight image classifiers (Lightning + Hydra)."""

from ttp_lightning.alg1.schema import ParetoSchema as _ParetoSchema
from ttp_lightning.certified.schema import CertifiedSchema as _CertifiedSchema
from ttp_lightning.config.naming import register as _register_resolvers
from ttp_lightning.config.schema import register as _register_schemas
from ttp_lightning.methods.baselines.schemas import SCHEMAS as _BASELINE_SCHEMAS
from ttp_lightning.version import __version__ as __version__

# the typed config schemas the YAML files name (group `schema`); the methods' own live beside them
_register_schemas({"pareto": _ParetoSchema, "certified": _CertifiedSchema, **_BASELINE_SCHEMAS})
_register_resolvers()  # ${ttp.model_name:...}: the default experiment name


def __getattr__(name: str):
    """`ttp_lightning.load_released(DIR)`, imported on first use (the CLI does not pay for torch here)."""
    if name == "load_released":
        from ttp_lightning.release import load_released

        return load_released
    raise AttributeError(f"module 'ttp_lightning' has no attribute {name!r}")
