"""Where Hydra and OmegaConf meet the rest of the package. The composed config's parts that Hydra builds (the
model, the trainer, the logger, callbacks, optimizers, attacks, the data loader, a method) are built here, and
the config files this package registers are read here; every other module takes the typed settings
(config/schema.py) or hands a part's node to these functions without reading it.

The model, the trainer and every callback become a `Part` when the run's settings are made
(config.schema.settings_of, at the run's entry): plain values and a factory. The stages call `build` and read
values; none of them holds a config node. The logger is built at the run's entry itself.

A `Node` is a part of a composed config (an OmegaConf DictConfig). Outside this module only the entry point,
the schemas (config/schema.py), the pre-flight checks (config/choices.py), the composed config's checking
(run/validation.py) and the run's identity (reporting/run_identity.py) import Hydra or OmegaConf
(tests/test_architecture.py).
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.errors import InstantiationException
from hydra.utils import get_class
from hydra.utils import instantiate as hydra_instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ttp_lightning.config.choices import CONF_DIR
from ttp_lightning.core.errors import TTPUserError

Node = DictConfig  # a part of the composed config, for annotations
ConfigError = OmegaConfBaseException  # an unknown key or a bad value set on a Node


def instantiate(node, **kwargs):
    """hydra.utils.instantiate, with a TTPUserError raised inside the constructor coming out unwrapped (Hydra
    wraps constructor errors), so bad user input still ends in the usual one-line error."""
    try:
        return hydra_instantiate(node, **kwargs)
    except InstantiationException as exc:
        if isinstance(exc.__cause__, TTPUserError):
            raise exc.__cause__ from None
        raise


@dataclass(frozen=True)
class Part:
    """A config section Hydra builds (the trainer, the model's backbone, one callback), made once with
    the run's settings: its values as plain, resolved dicts and lists (the run's record and cache keys read them)
    and `build`, the factory the stages call with what only they know (the trainer's epochs and callbacks, the
    backbone's input shape and classes)."""

    values: dict

    @classmethod
    def of(cls, node) -> "Part | None":
        return None if node is None else cls(dict(to_plain(node)))

    def get(self, key: str, default=None):
        return self.values.get(key, default)

    def build(self, *, leave_out: tuple[str, ...] = (), **given):
        """The part, built by Hydra from its values (less the keys `leave_out`: settings the run reads itself, not
        the constructor's) and the arguments `given`."""
        return instantiate({k: v for k, v in self.values.items() if k not in leave_out}, **given)


def build_part(node, key: str, expected: type, **kwargs):
    """`node`'s `_target_` built by Hydra as the part at `key` (`attacks.suite.apgd`, `data.loader`): an
    unimportable or wrong target, or an object that is not an `expected`, is one line naming it."""
    return _built(node.get("_target_"), key, expected, lambda: hydra_instantiate(node, **kwargs))


def build_class(target, key: str, expected: type, *args, **kwargs):
    """The class `target` names (a `_target_` string) called with `args` and `kwargs`: a part whose settings
    were checked and typed already (a method given its schema object, the data module). The same one-line
    errors as build_part; a TTPUserError the constructor raises comes out as it is."""
    return _built(target, key, expected, lambda: get_class(str(target))(*args, **kwargs))


def _built(target, key: str, expected: type, make: Callable):
    try:
        part = make()
    except TTPUserError:
        raise
    except Exception as exc:  # an unimportable or wrong target: one line naming it
        cause = exc.__cause__ or exc
        raise TTPUserError(f"{key}._target_={target} cannot be built ({type(cause).__name__}: "
                           f"{str(cause).splitlines()[0] if str(cause) else ''})") from exc
    if not isinstance(part, expected):
        raise TTPUserError(f"{key}._target_={target} is not a {expected.__module__}.{expected.__qualname__} subclass")
    return part


def is_node(value) -> bool:
    return OmegaConf.is_config(value)


def to_plain(value, resolve: bool = True, enum_to_str: bool = False) -> Any:
    """A Node as plain dicts and lists (interpolations resolved); anything else as it is."""
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=resolve, enum_to_str=enum_to_str)
    return value


def load_file(path: Path) -> Node:
    """One config file of this package as a Node (settable, as composition leaves it)."""
    return OmegaConf.load(path)


def registered_file(group: str, choice: str) -> Node:
    """conf/<group>/<choice>.yaml, one of this package's own config files."""
    return load_file(CONF_DIR / group / f"{choice}.yaml")


def compose_main(overrides: list[str]) -> Node:
    """conf/main.yaml composed with `overrides` (group choices and values), outside a Hydra run."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="main", overrides=overrides)


def set_value(node: Node, key: str, text: str) -> None:
    """`key=text` as a command-line override would set it (text parsed as YAML), on an existing key only;
    ConfigError on an unknown key or a bad value."""
    OmegaConf.update(node, key, OmegaConf.from_dotlist([f"v={text}"]).v, force_add=False)


def resolve(node: Node) -> Node:
    OmegaConf.resolve(node)
    return node


def register_resolver(name: str, function: Callable) -> None:
    """`${name:...}` in the config files, once per process."""
    if not OmegaConf.has_resolver(name):
        OmegaConf.register_new_resolver(name, function)
