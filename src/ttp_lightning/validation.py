"""Checks config values before any work starts, so bad input fails in one line with nothing written."""

import math

from omegaconf import DictConfig

from ttp_lightning.errors import TTPUserError
from ttp_lightning.methods.certified.newton import resolve_lam
from ttp_lightning.modules.optim import OPTIMIZERS, PROJECTIONS, SCHEDULES
from ttp_lightning.modules.pareto import MODES
from ttp_lightning.objectives import UNIFORMITY_LOSSES


def _number(value, key: str):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TTPUserError(f"{key}={value!r} is not a number")
    if math.isnan(value):
        raise TTPUserError(f"{key}=nan is not allowed; choose a number")
    return value


def _positive_int(value, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TTPUserError(f"{key}={value!r} is not allowed; choose a positive integer")


def _positive(value, key: str) -> None:
    if not 0 < _number(value, key) < float("inf"):
        raise TTPUserError(f"{key}={value} is not allowed; choose a finite value > 0")


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


def _auto_or(value, key: str, check) -> None:
    if value != "auto":
        check(value, key)


def _fraction(value, key: str) -> None:
    if not 0.0 < _number(value, key) < 1.0:
        raise TTPUserError(f"{key}={value} is not allowed; choose a value in (0, 1)")


def _certified(cfg: DictConfig) -> None:
    method = cfg.method
    if cfg.pretrain.norm_bound is None:
        raise TTPUserError(f"method={method.name} needs pretrain.norm_bound (C, the weight-norm bound); e.g. 10")
    theta = _number(method.theta, "method.theta")
    if not 0.0 < theta < 1.0:
        raise TTPUserError(f"method.theta={theta} is not allowed for a certified method; choose a value in (0, 1)")
    for key in ("epsilon", "hessian_lipschitz_forget", "hessian_lipschitz_retain", "grad_lipschitz_forget",
                "grad_lipschitz_retain"):
        _positive(method[key], f"method.{key}")
    _auto_or(method.lam, "method.lam", _positive)
    lam = resolve_lam(method)
    if lam + _number(method.lam_min, "method.lam_min") <= 0:
        raise TTPUserError(f"method.lam_min={method.lam_min} is not allowed with lambda={lam}; "
                           f"lambda + lambda_min must be > 0")
    _fraction(method.delta, "method.delta")
    if method.sigma is not None:
        _positive(method.sigma, "method.sigma")
    _positive(method.vacuous_above, "method.vacuous_above")
    _positive_int(method.lanczos_iterations, "method.lanczos_iterations")
    if _number(method.spectrum_margin, "method.spectrum_margin") < 0:
        raise TTPUserError(f"method.spectrum_margin={method.spectrum_margin} is not allowed; choose a value >= 0")
    _uniformity(method)
    _positive_int(method.max_exact_params, "method.max_exact_params")
    _positive_int(method.chunk_size, "method.chunk_size")
    if method.warmup_epochs:
        _optim({**method, "epochs": method.warmup_epochs}, "method")
        _choice(method.mode, "method.mode", MODES)
    if method.name in ("certified_lissa", "certified_online"):
        _estimator(method)
    if method.name == "certified_online":
        if method.warmup_epochs:
            raise TTPUserError(f"method.warmup_epochs={method.warmup_epochs} is not allowed for certified_online "
                               f"(the online algorithm starts from A(D)); use 0")
        _choice(method.release, "method.release", ("each", "final"))
        if not cfg.data.forget.requests:
            raise TTPUserError("method=certified_online needs data.forget.requests, a list of sizes or index "
                               "files, e.g. data.forget.requests=[50,50]")


def _estimator(method: DictConfig) -> None:
    if method.scale is not None:
        _positive(method.scale, "method.scale")
    _positive(method.scale_margin, "method.scale_margin")
    _auto_or(method.depth, "method.depth", _positive_int)
    _positive_int(method.repeats, "method.repeats")
    _positive_int(method.sample_size, "method.sample_size")
    _fraction(method.rho, "method.rho")
    _auto_or(method.zeta_min, "method.zeta_min", _positive)
    _positive(method.max_residual, "method.max_residual")


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


def _adversarial(adversarial: DictConfig) -> None:
    from ttp_lightning.attacks import OBJECTIVES

    _positive(adversarial.gamma, "method.adversarial.gamma")
    if adversarial.train_gamma is not None:
        _positive(adversarial.train_gamma, "method.adversarial.train_gamma")
    _positive_int(adversarial.steps, "method.adversarial.steps")
    _positive(adversarial.step_size, "method.adversarial.step_size")
    _choice(adversarial.objective, "method.adversarial.objective", list(OBJECTIVES))
    if not adversarial.surrogate_betas:
        raise TTPUserError("method.adversarial.surrogate_betas=[] is not allowed; list at least one beta > 0 or null")
    for beta in adversarial.surrogate_betas:
        if beta is not None:
            _positive(beta, "method.adversarial.surrogate_betas")
    clean_weight = _number(adversarial.clean_weight, "method.adversarial.clean_weight")
    if not 0.0 <= clean_weight < 1.0:
        raise TTPUserError(f"method.adversarial.clean_weight={clean_weight} is not allowed; choose a value in [0, 1)")
    _positive_int(adversarial.eval_steps, "method.adversarial.eval_steps")
    _positive_int(adversarial.eval_restarts, "method.adversarial.eval_restarts")
    _positive_int(adversarial.eval_chunk_size, "method.adversarial.eval_chunk_size")
    for objective in adversarial.eval_objectives:
        _choice(objective, "method.adversarial.eval_objectives", list(OBJECTIVES))
    for beta in adversarial.eval_surrogate_betas:
        if beta is not None:
            _positive(beta, "method.adversarial.eval_surrogate_betas")


def _accelerator(trainer: DictConfig) -> None:
    """A GPU trainer on a machine without one fails here in one line instead of deep inside Lightning."""
    import torch

    if str(trainer.get("accelerator", "cpu")) in ("gpu", "cuda") and not torch.cuda.is_available():
        raise TTPUserError(f"trainer.accelerator={trainer.accelerator} needs a CUDA GPU and this machine has none "
                           "(torch.cuda.is_available() is False); use trainer=cpu, or trainer=ddp_sim for two "
                           "CPU processes")


def validate_config(cfg: DictConfig, methods) -> None:
    """Raise TTPUserError naming the first bad value and what is allowed."""
    _accelerator(cfg.trainer)
    threads = cfg.get("threads", "auto")
    if threads != "auto" and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise TTPUserError(f"threads={threads!r} is not allowed; choose auto or a positive integer")
    _choice(cfg.method.name, "method.name", list(methods))
    _positive_int(cfg.progress_bar_refresh_rate, "progress_bar_refresh_rate")
    _optim(cfg.pretrain, "pretrain")
    if cfg.pretrain.norm_bound is not None:
        _positive(cfg.pretrain.norm_bound, "pretrain.norm_bound")
    _choice(cfg.pretrain.projection, "pretrain.projection", PROJECTIONS)
    if cfg.data.forget.source != "train":
        _positive_int(cfg.pretrain.absorb_epochs, "pretrain.absorb_epochs")
    if cfg.attacks.enabled:
        _attacks(cfg.attacks)
    if cfg.method.name in ("pareto", "pareto_robust"):
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
        _choice(stopping.get("fallback", "last"), "method.early_stopping.fallback", ("pareto", "last"))
        if stopping.get("retain_acc_drop_at_most") is not None:
            _fraction(stopping.retain_acc_drop_at_most, "method.early_stopping.retain_acc_drop_at_most")
    if cfg.method.name == "pareto_robust":
        _adversarial(cfg.method.adversarial)
    if cfg.method.name.startswith("certified_"):
        _certified(cfg)
    if cfg.method.name == "synthetic":
        _positive_int(cfg.method.k, "method.k")
        _positive(cfg.method.radius, "method.radius")
    if cfg.method.name == "gaussian_uniform":
        _positive(cfg.method.noise_variance, "method.noise_variance")
    if cfg.method.name == "labeldp":
        _positive(cfg.method.epsilon, "method.epsilon")
        _fraction(cfg.method.stage_fraction, "method.stage_fraction")
        _positive(cfg.method.temperature, "method.temperature")
        if _number(cfg.method.mixup_alpha, "method.mixup_alpha") < 0:
            raise TTPUserError(f"method.mixup_alpha={cfg.method.mixup_alpha} is not allowed; choose a value >= 0")
    forget = cfg.data.forget
    if forget.indices_file is None and forget.size is not None:
        _positive_int(forget.size, "data.forget.size")
