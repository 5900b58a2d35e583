"""ttp_lightning: test-time privacy for open-weight image classifiers (Lightning + Hydra)."""

__version__ = "0.1.0"

from ttp_lightning.config_schema import register as _register_schemas

_register_schemas()  # the typed config schemas the YAML files name (group `schema`)
