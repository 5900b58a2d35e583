"""Checks config values before any work starts, so bad input fails in one line with nothing written: the
typed schemas' ranges (config_schema.py; types and closed choices failed at composition already), the
attacks' settings, the accelerator, and what depends on more than one setting; then builds the method,
which checks its own."""

from omegaconf import DictConfig, OmegaConf

from ttp_lightning.checks import positive_int as _positive_int
from ttp_lightning.cli_checks import check_cache_dir, check_devices
from ttp_lightning.config_schema import MainSchema, typed
from ttp_lightning.errors import TTPUserError, build_part
from ttp_lightning.methods.base import Method


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


def build_method(cfg: DictConfig) -> Method:
    """The method named by `cfg.method._target_` (conf/method/<name>.yaml), instantiated by Hydra."""
    target = cfg.method.get("_target_")
    if not target:
        raise TTPUserError(f"method {cfg.method.get('name')!r} names no _target_ class; a method's YAML needs "
                           "`_target_: <module>.<Method subclass>` (README, Adding a method)")
    return build_part(cfg.method, "method", Method, _recursive_=False)


def _required(cfg: DictConfig) -> None:
    """`required: [KEY, ...]` (a workflow's must-give settings): each must be set."""
    for key in cfg.get("required") or []:
        if OmegaConf.select(cfg, str(key)) in (None, ""):
            raise TTPUserError(f"{key} is required here (required: {', '.join(map(str, cfg.required))}); "
                               f"give {key}=...")


def validate_config(cfg: DictConfig) -> Method:
    """Raise TTPUserError naming the first bad value and what is allowed; returns the method, whose own
    settings it has checked (Method.check)."""
    _accelerator(cfg.trainer)
    check_devices(cfg.trainer)
    _trainer_keys(cfg.trainer)
    _seed(cfg.get("seed", 0))
    stated = cfg.model.get("checkpoint_test_acc") if cfg.get("model") is not None else None
    if stated is not None and (isinstance(stated, bool) or not isinstance(stated, (int, float))
                               or not 0.0 <= float(stated) <= 1.0):
        raise TTPUserError(f"model.checkpoint_test_acc={stated} is not allowed; give the accuracy as a fraction in "
                           "[0, 1] (e.g. 0.98)")
    if cfg.get("paths") is not None and cfg.paths.get("cache_dir"):
        check_cache_dir(cfg.paths.cache_dir)
    _required(cfg)
    MainSchema(threads=cfg.get("threads", "auto"), progress_bar_refresh_rate=cfg.progress_bar_refresh_rate,
               checkpoint_every_n_epochs=cfg.get("checkpoint_every_n_epochs", 1))
    for key in ("pretrain", "data", "method", "attacks", "performance", "release_gate"):  # the typed schemas' __post_init__
        if key in cfg:
            typed(cfg[key], key)
    if cfg.data.forget.source != "train":
        _positive_int(cfg.pretrain.absorb_epochs, "pretrain.absorb_epochs")
    if str(cfg.get("performance", {}).get("data_on_device", False)).lower() == "true" and cfg.data.num_workers:
        raise TTPUserError(f"performance.data_on_device=true needs data.num_workers=0 (it is "
                           f"{cfg.data.num_workers}): loader worker processes cannot gather from GPU tensors")
    method = build_method(cfg)
    method.check(cfg)
    return method
