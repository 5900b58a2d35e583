"""Checks config values before any work starts, so bad input fails in one line with nothing written: the
typed schemas' ranges (config_schema.py; types and closed choices failed at composition already), the
attacks' settings, the accelerator, and what depends on more than one setting; then builds the method,
which checks its own."""

import hydra
from omegaconf import DictConfig

from ttp_lightning.checks import choice as _choice
from ttp_lightning.checks import number as _number
from ttp_lightning.checks import positive as _positive
from ttp_lightning.checks import positive_int as _positive_int
from ttp_lightning.config_schema import MainSchema, typed
from ttp_lightning.errors import TTPUserError
from ttp_lightning.methods.base import Method


def _attacks(attacks: DictConfig) -> None:
    from ttp_lightning.attacks import ATTACKS, OBJECTIVES

    for name in attacks.names:
        _choice(name, "attacks.names", list(ATTACKS))
    for gamma in attacks.gammas:
        _positive(gamma, "attacks.gammas")
    if _number(attacks.alpha, "attacks.alpha") < 0:
        raise TTPUserError(f"attacks.alpha={attacks.alpha} is not allowed; choose a value >= 0")
    _positive_int(attacks.pgd_steps, "attacks.pgd_steps")
    _positive(attacks.pgd_step_size, "attacks.pgd_step_size")
    if attacks.get("relu_gradient_beta") is not None:
        _positive(attacks.relu_gradient_beta, "attacks.relu_gradient_beta")
    if float(_number(attacks.robust_gamma, "attacks.robust_gamma")) not in [float(g) for g in attacks.gammas]:
        raise TTPUserError(f"attacks.robust_gamma={attacks.robust_gamma} is not allowed; choose one of "
                           f"attacks.gammas: {', '.join(f'{float(g):g}' for g in attacks.gammas)}")
    _positive_int(attacks.apgd_steps, "attacks.apgd_steps")
    _positive_int(attacks.restarts, "attacks.restarts")
    _positive_int(attacks.eot_samples, "attacks.eot_samples")
    _positive_int(attacks.chunk_size, "attacks.chunk_size")
    if not attacks.surrogate_betas:
        raise TTPUserError("attacks.surrogate_betas=[] is not allowed; list at least one beta > 0 or null (exact)")
    for beta in attacks.surrogate_betas:
        if beta is not None:
            _positive(beta, "attacks.surrogate_betas")
    if not attacks.objectives:
        raise TTPUserError("attacks.objectives=[] is not allowed; choose at least one of: " + ", ".join(OBJECTIVES))
    for objective in attacks.objectives:
        _choice(objective, "attacks.objectives", list(OBJECTIVES))


def _accelerator(trainer: DictConfig) -> None:
    """A GPU trainer on a machine without one fails here in one line instead of deep inside Lightning."""
    import torch

    if str(trainer.get("accelerator", "cpu")) in ("gpu", "cuda") and not torch.cuda.is_available():
        raise TTPUserError(f"trainer.accelerator={trainer.accelerator} needs a CUDA GPU and this machine has none "
                           "(torch.cuda.is_available() is False); use trainer=cpu, or trainer=ddp_sim for two "
                           "CPU processes")


def build_method(cfg: DictConfig) -> Method:
    """The method named by `cfg.method._target_` (conf/method/<name>.yaml), instantiated by Hydra."""
    target = cfg.method.get("_target_")
    if not target:
        raise TTPUserError(f"method {cfg.method.get('name')!r} names no _target_ class; a method's YAML needs "
                           "`_target_: <module>.<Method subclass>` (README, Adding a method)")
    try:
        method = hydra.utils.instantiate(cfg.method, _recursive_=False)
    except Exception as exc:  # an unimportable or wrong target: one line naming it
        cause = exc.__cause__ or exc
        raise TTPUserError(f"method._target_={target} cannot be built ({type(cause).__name__}: "
                           f"{str(cause).splitlines()[0] if str(cause) else ''})") from exc
    if not isinstance(method, Method):
        raise TTPUserError(f"method._target_={target} is not a ttp_lightning.methods.base.Method subclass")
    return method


def validate_config(cfg: DictConfig) -> Method:
    """Raise TTPUserError naming the first bad value and what is allowed; returns the method, whose own
    settings it has checked (Method.check)."""
    _accelerator(cfg.trainer)
    MainSchema(threads=cfg.get("threads", "auto"), progress_bar_refresh_rate=cfg.progress_bar_refresh_rate,
               checkpoint_every_n_epochs=cfg.get("checkpoint_every_n_epochs", 1))
    for key in ("pretrain", "data", "method"):  # ranges in the typed schemas' __post_init__
        typed(cfg[key], key)
    if cfg.data.forget.source != "train":
        _positive_int(cfg.pretrain.absorb_epochs, "pretrain.absorb_epochs")
    if cfg.attacks.enabled:
        _attacks(cfg.attacks)
    method = build_method(cfg)
    method.check(cfg)
    return method
