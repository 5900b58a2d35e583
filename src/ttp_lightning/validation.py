"""Checks config values before any work starts, so bad input fails in one line with nothing written."""

from omegaconf import DictConfig

from ttp_lightning.errors import TTPUserError
from ttp_lightning.modules.optim import OPTIMIZERS, PROJECTIONS, SCHEDULES
from ttp_lightning.modules.pareto import MODES
from ttp_lightning.objectives import UNIFORMITY_LOSSES


def _number(value, key: str):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TTPUserError(f"{key}={value!r} is not a number")
    return value


def _positive_int(value, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TTPUserError(f"{key}={value!r} is not allowed; choose a positive integer")


def _positive(value, key: str) -> None:
    if _number(value, key) <= 0:
        raise TTPUserError(f"{key}={value} is not allowed; choose a value > 0")


def _choice(value, key: str, allowed) -> None:
    if value not in allowed:
        raise TTPUserError(f"{key}={value!r} is not allowed; choose one of: {', '.join(map(str, allowed))}")


def _optim(section, prefix: str) -> None:
    _positive_int(section["epochs"], f"{prefix}.epochs")
    _positive(section["lr"], f"{prefix}.lr")
    if _number(section["weight_decay"], f"{prefix}.weight_decay") < 0:
        raise TTPUserError(f"{prefix}.weight_decay={section['weight_decay']} is not allowed; choose a value >= 0")
    _choice(section["optimizer"], f"{prefix}.optimizer", list(OPTIMIZERS))
    _choice(section["schedule"], f"{prefix}.schedule", SCHEDULES)


def _uniformity(method: DictConfig) -> None:
    _choice(method.uniformity, "method.uniformity", list(UNIFORMITY_LOSSES))
    _positive(method.forget_temperature, "method.forget_temperature")


def _certified(cfg: DictConfig) -> None:
    method = cfg.method
    if cfg.pretrain.norm_bound is None:
        raise TTPUserError(f"method={method.name} needs pretrain.norm_bound (C, the weight-norm bound); e.g. 10")
    theta = _number(method.theta, "method.theta")
    if not 0.0 < theta < 1.0:
        raise TTPUserError(f"method.theta={theta} is not allowed for a certified method; choose a value in (0, 1)")
    _positive(method.lam, "method.lam")
    _positive(method.epsilon, "method.epsilon")
    if not 0.0 < _number(method.delta, "method.delta") < 1.0:
        raise TTPUserError(f"method.delta={method.delta} is not allowed; choose a value in (0, 1)")
    if method.sigma is not None:
        _positive(method.sigma, "method.sigma")
    if _number(method.lam_min, "method.lam_min") < 0:
        raise TTPUserError(f"method.lam_min={method.lam_min} is not allowed; choose a value >= 0")
    _uniformity(method)
    _positive_int(method.max_exact_params, "method.max_exact_params")
    if method.warmup_epochs:
        _optim({**method, "epochs": method.warmup_epochs}, "method")
        _choice(method.mode, "method.mode", MODES)


def validate_config(cfg: DictConfig, methods) -> None:
    """Raise TTPUserError naming the first bad value and what is allowed."""
    _choice(cfg.method.name, "method.name", list(methods))
    _positive_int(cfg.progress_bar_refresh_rate, "progress_bar_refresh_rate")
    _optim(cfg.pretrain, "pretrain")
    if cfg.pretrain.norm_bound is not None:
        _positive(cfg.pretrain.norm_bound, "pretrain.norm_bound")
    _choice(cfg.pretrain.projection, "pretrain.projection", PROJECTIONS)
    if cfg.method.name == "pareto":
        method = cfg.method
        theta = _number(method.theta, "method.theta")
        if not 0.0 <= theta <= 1.0:
            raise TTPUserError(f"method.theta={theta} is not allowed; choose a value in [0, 1]")
        _optim(method, "method")
        _choice(method.mode, "method.mode", MODES)
        _uniformity(method)
        _positive_int(method.chunk_size, "method.chunk_size")
        stopping = method.early_stopping
        if stopping.patience is not None:
            _positive_int(stopping.patience, "method.early_stopping.patience")
    if cfg.method.name == "certified_exact":
        _certified(cfg)
    forget = cfg.data.forget
    if forget.indices_file is None and forget.size is not None:
        _positive_int(forget.size, "data.forget.size")
