"""Checks config values before any work starts, so bad input fails in one line with nothing written: the
accelerator and the trainer's keys, then the typed schemas' ranges, once, as the composed config becomes
one MainSchema object (config.schema.settings_of; types and closed choices failed at composition already),
and what depends on more than one setting. build_method then builds the method from its typed settings,
and the method checks what only it knows (Method.check)."""

import logging
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from ttp_lightning.assess.protection import GateSettings
from ttp_lightning.config.build import build_class, to_plain
from ttp_lightning.config.choices import check_cache_dir, check_devices
from ttp_lightning.config.schema import MainSchema, settings_of
from ttp_lightning.core.checks import positive_int as _positive_int
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.methods.base import Method
from ttp_lightning.reporting.run_identity import run_identity

log = logging.getLogger(__name__)


def _accelerator(trainer: DictConfig) -> None:
    """A GPU trainer on a machine without one fails here in one line instead of deep inside Lightning."""
    import torch

    if str(trainer.get("accelerator", "cpu")) not in ("gpu", "cuda"):
        return
    if not torch.cuda.is_available():
        raise TTPUserError(f"trainer.accelerator={trainer.accelerator} needs a CUDA GPU and this machine has none "
                           "(torch.cuda.is_available() is False); use trainer=cpu, or trainer=ddp_sim for two "
                           "CPU processes")
    if str(trainer.get("precision", "32")).startswith("bf16") and \
            not torch.cuda.is_bf16_supported(including_emulation=False):
        raise TTPUserError(f"trainer.precision={trainer.precision} (the GPU trainers' default) needs a GPU with "
                           f"bfloat16 (NVIDIA Ampere or newer) and {torch.cuda.get_device_name()} has none; set "
                           "trainer.precision=16-mixed or trainer.precision=32")


def _trainer_keys(trainer: DictConfig) -> None:
    """Every trainer.* key (`+trainer.KEY=` adds one) must be a Lightning Trainer argument: else one line here
    rather than Hydra's instantiation error at the first fit."""
    import inspect

    import lightning as L

    allowed = set(inspect.signature(L.Trainer.__init__).parameters) - {"self"}
    unknown = sorted(str(key) for key in trainer if key != "_target_" and key not in allowed)
    if unknown:
        raise TTPUserError(f"trainer.{unknown[0]} is not a setting of Lightning's Trainer; allowed: "
                           f"{', '.join(sorted(allowed))}")


def _seed(seed) -> None:
    """A seed Lightning and numpy accept: an integer in [0, 2^32 - 1]."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= 2**32 - 1:
        raise TTPUserError(f"seed={seed} is not allowed; choose an integer in [0, {2**32 - 1}]")


def build_method(settings: MainSchema) -> Method:
    """The method named by `method._target_` (conf/method/<name>.yaml), given its typed settings, with its own
    cross-field checks (Method.check) passed."""
    target = setting(settings.method, "_target_")
    if not target or target == "???":
        raise TTPUserError(f"method {setting(settings.method, 'name')!r} names no _target_ class; a method's YAML "
                           "needs `_target_: <module>.<Method subclass>` (docs/extending.md)")
    method = build_class(target, "method", Method, settings.method)
    method.check(settings)
    return method


def setting(section, key: str):
    """One value of a section that is a schema object or, untyped (a method without a schema), a config."""
    return section.get(key) if OmegaConf.is_config(section) else getattr(section, key, None)


def _required(cfg: DictConfig) -> None:
    """`required: [KEY, ...]` (a workflow's must-give settings): each must be set."""
    for key in cfg.get("required") or []:
        if OmegaConf.select(cfg, str(key)) in (None, ""):
            raise TTPUserError(f"{key} is required here (required: {', '.join(map(str, cfg.required))}); "
                               f"give {key}=...")


def validate_config(cfg: DictConfig) -> MainSchema:
    """The run's settings as one typed object (config.schema.settings_of: every section's schema object, each
    range checked once), after the checks that need the machine or more than one setting; raises TTPUserError
    naming the first bad value and what is allowed."""
    _accelerator(cfg.trainer)
    check_devices(cfg.trainer)
    _trainer_keys(cfg.trainer)
    _required(cfg)
    settings = settings_of(cfg)
    _seed(settings.seed)
    stated = settings.model.get("checkpoint_test_acc") if settings.model is not None else None
    if stated is not None and (isinstance(stated, bool) or not isinstance(stated, (int, float))
                               or not 0.0 <= float(stated) <= 1.0):
        raise TTPUserError(f"model.checkpoint_test_acc={stated} is not allowed; give the accuracy as a fraction in "
                           "[0, 1] (e.g. 0.98)")
    if settings.paths is not None and settings.paths.get("cache_dir"):
        check_cache_dir(settings.paths.cache_dir)
    _ignored_root(cfg)
    if settings.data.forget.source != "train":
        _positive_int(settings.pretrain.absorb_epochs, "pretrain.absorb_epochs")
    if str(settings.performance.data_on_device).lower() == "true" and settings.data.num_workers:
        raise TTPUserError(f"performance.data_on_device=true needs data.num_workers=0 (it is "
                           f"{settings.data.num_workers}): loader worker processes cannot gather from GPU tensors")
    return settings


def _ignored_root(cfg: DictConfig) -> None:
    """A warning when data.root is set away from paths.data_dir for a data set that reads no files (the
    embedded digits): the setting would otherwise be silently ignored."""
    from hydra.utils import get_class

    loader = cfg.data.get("loader")
    target = loader.get("_target_") if loader is not None else None
    try:
        reads = getattr(get_class(str(target)), "reads_root", True) if target else True
    except (ImportError, AttributeError, ValueError):  # reported, in one line, where the data module builds it
        return
    root, default = cfg.data.get("root"), cfg.get("paths", {}).get("data_dir")
    if not reads and root is not None and str(root) != str(default):
        log.warning("data.root=%s is ignored: data=%s reads no files, it needs %s", root, cfg.data.get("name"),
                    loader.get("expected_files", "bundled"))


@dataclass(frozen=True)
class Validated:
    """All a run takes from its composed config, taken once: the typed settings (everything the stages read), the
    resolved config as plain data (results.json's `config`, the logger's hyperparameters), the run's identity (its
    name, sweep group and swept values) and the logger group's plain config (built at the start of the run). The raw
    config travels no further."""

    settings: MainSchema
    record: dict
    identity: dict
    logger: dict | None
    gate: GateSettings  # release_gate, with the method's own promise where `require` is null


def validate(cfg: DictConfig) -> Validated:
    """validate_config, and what the run records of its config, in one step."""
    settings = validate_config(cfg)
    logger = cfg.get("logger")
    gate = GateSettings.from_config(settings.release_gate, robust_method=setting(settings.method, "adversarial")
                                    is not None)
    return Validated(settings, to_plain(cfg, resolve=True, enum_to_str=True), run_identity(cfg),
                     None if not logger else to_plain(logger, resolve=True), gate)
