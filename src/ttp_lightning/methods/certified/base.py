"""The base of the certified learners (Algs 2-4, one subclass each in exact.py, lissa.py, online.py): their
settings checks, and the one procedure they share (common.py) with `algorithm` choosing the Newton step."""

from omegaconf import DictConfig
from torch import nn

from ttp_lightning import checks
from ttp_lightning.certify.certificate import ESTIMATOR, EXACT, ONLINE
from ttp_lightning.errors import TTPUserError
from ttp_lightning.methods.base import Method
from ttp_lightning.methods.certified.newton import resolve_lam
from ttp_lightning.methods.output import MethodOutput
from ttp_lightning.modules.pareto import MODES


class Certified(Method):
    """A certified learner; `algorithm` picks how the Newton step is solved."""

    algorithm = EXACT

    def check(self, cfg: DictConfig) -> None:
        check_certified(cfg, estimator=self.algorithm in (ESTIMATOR, ONLINE), online=self.algorithm == ONLINE)

    def run(self, ctx, pretrained: nn.Module, datamodule, make_net) -> MethodOutput:
        from ttp_lightning.methods.certified.common import run_certified

        return run_certified(ctx, pretrained, datamodule, self.algorithm)


def check_certified(cfg: DictConfig, estimator: bool, online: bool) -> None:
    """The settings of Algs 2-4 (`estimator`: Algs 3-4's stochastic inverse-Hessian estimator; `online`: Alg 4)."""
    method = cfg.method
    if cfg.pretrain.norm_bound is None:
        raise TTPUserError(f"method={method.name} needs pretrain.norm_bound (C, the weight-norm bound); e.g. 10")
    theta = checks.number(method.theta, "method.theta")
    if not 0.0 < theta < 1.0:
        raise TTPUserError(f"method.theta={theta} is not allowed for a certified method; choose a value in (0, 1)")
    for key in ("epsilon", "hessian_lipschitz_forget", "hessian_lipschitz_retain", "grad_lipschitz_forget",
                "grad_lipschitz_retain"):
        checks.positive(method[key], f"method.{key}")
    checks.auto_or(method.lam, "method.lam", checks.positive)
    lam = resolve_lam(method)
    if lam + checks.number(method.lam_min, "method.lam_min") <= 0:
        raise TTPUserError(f"method.lam_min={method.lam_min} is not allowed with lambda={lam}; "
                           f"lambda + lambda_min must be > 0")
    checks.fraction(method.delta, "method.delta")
    if method.sigma is not None:
        checks.positive(method.sigma, "method.sigma")
    checks.positive(method.vacuous_above, "method.vacuous_above")
    checks.positive_int(method.lanczos_iterations, "method.lanczos_iterations")
    if checks.number(method.spectrum_margin, "method.spectrum_margin") < 0:
        raise TTPUserError(f"method.spectrum_margin={method.spectrum_margin} is not allowed; choose a value >= 0")
    checks.uniformity(method)
    checks.positive_int(method.max_exact_params, "method.max_exact_params")
    checks.positive_int(method.chunk_size, "method.chunk_size")
    if method.warmup_epochs:
        checks.optim({**method, "epochs": method.warmup_epochs}, "method")
        checks.choice(method.mode, "method.mode", MODES)
    if estimator:
        check_estimator(method)
    if online:
        if method.warmup_epochs:
            raise TTPUserError(f"method.warmup_epochs={method.warmup_epochs} is not allowed for certified_online "
                               f"(the online algorithm starts from A(D)); use 0")
        checks.choice(method.release, "method.release", ("each", "final"))
        if not cfg.data.forget.requests:
            raise TTPUserError("method=certified_online needs data.forget.requests, a list of sizes or index "
                               "files, e.g. data.forget.requests=[50,50]")


def check_estimator(method: DictConfig) -> None:
    if method.scale is not None:
        checks.positive(method.scale, "method.scale")
    checks.positive(method.scale_margin, "method.scale_margin")
    checks.auto_or(method.depth, "method.depth", checks.positive_int)
    checks.positive_int(method.repeats, "method.repeats")
    checks.positive_int(method.sample_size, "method.sample_size")
    checks.fraction(method.rho, "method.rho")
    checks.auto_or(method.zeta_min, "method.zeta_min", checks.positive)
    checks.positive(method.max_residual, "method.max_residual")
