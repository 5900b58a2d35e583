"""The certified learners' typed settings (Algs 2-4: conf/certified_defaults.yaml and certified_*.yaml),
registered by the package's `__init__` as schema `certified`."""

from dataclasses import dataclass, field
from typing import Any

from ttp_lightning.certified.maths.theta_rule import check_ladder
from ttp_lightning.config.schema import (
    Algorithm,
    Bound,
    Layers,
    MethodSchema,
    Mode,
    Release,
    TrainingSchema,
    Uniformity,
    check_cvar_fraction,
    check_reduction_temperature,
)
from ttp_lightning.core import checks
from ttp_lightning.core.errors import TTPUserError


@dataclass
class CertifiedSchema(MethodSchema, TrainingSchema):
    """Algs 2-4 (conf/certified_defaults.yaml and certified_*.yaml); the estimator's settings for Algs 3-4."""

    algorithm: Algorithm = Algorithm["alg2_exact_newton"]
    bound: Bound = Bound["residual"]
    layers: Layers = Layers["all"]
    solver_tolerance: float = 1.0e-10
    max_newton: int = 100
    max_cg: int = 2000
    theta: Any = 0.75  # in (0, 1), or auto (bound=residual: certified.maths.theta_rule over theta_ladder)
    theta_ladder: list[float] = field(default_factory=lambda: [0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875])
    theta_refine_steps: int = 3
    theta_retain_drop_at_most: float = 0.01
    uniformity: Uniformity = Uniformity["reverse_kl"]
    forget_temperature: float = 1.0
    lam: Any = 1.0e-4
    lam_min: float = 0.0
    lanczos_iterations: int = 30
    spectrum_margin: float = 0.1
    hessian_lipschitz_forget: float = 1.0
    hessian_lipschitz_retain: float = 1.0
    grad_lipschitz_forget: float = 1.0
    grad_lipschitz_retain: float = 1.0
    epsilon: float = 1.0
    delta: float = 1.0e-5
    sigma: float | None = None
    vacuous_above: float = 10.0
    max_exact_params: int = 20000
    warmup_epochs: int = 0
    mode: Mode = Mode["fullbatch"]
    gradient_surgery: bool = False
    chunk_size: int = 8192
    scale: float | None = None
    scale_margin: float = 1.2
    depth: Any = "auto"
    repeats: int = 1
    sample_size: int = 1
    estimator_seed: int = 0
    max_residual: float = 0.5
    compare_exact: bool = False
    release: Release = Release["each"]
    forget_reduction_temperature: Any = None  # a number > 0, or auto (certified.maths.reductions.temperature_rule)

    def __post_init__(self) -> None:
        TrainingSchema.__post_init__(self)
        checks.auto_or(self.theta, "method.theta",
                       lambda value, key: checks.unit_interval(checks.number(value, key), key, closed=False))
        self._check_theta_rule()
        for key in ("epsilon", "hessian_lipschitz_forget", "hessian_lipschitz_retain", "grad_lipschitz_forget",
                    "grad_lipschitz_retain", "vacuous_above", "forget_temperature", "scale_margin", "max_residual",
                    "solver_tolerance"):
            checks.positive(getattr(self, key), f"method.{key}")
        checks.auto_or(self.lam, "method.lam", checks.positive)
        checks.fraction(self.delta, "method.delta")
        if self.sigma is not None:
            checks.positive(self.sigma, "method.sigma")
        if self.scale is not None:
            checks.positive(self.scale, "method.scale")
        for key in ("lanczos_iterations", "max_exact_params", "chunk_size", "repeats", "sample_size", "max_newton",
                    "max_cg"):
            checks.positive_int(getattr(self, key), f"method.{key}")
        checks.at_least_zero(self.spectrum_margin, "method.spectrum_margin")
        checks.at_least_zero(self.warmup_epochs, "method.warmup_epochs")
        checks.auto_or(self.depth, "method.depth", checks.positive_int)
        self._check_reduction()

    def _check_theta_rule(self) -> None:
        """theta=auto solves M_theta(D) at each theta it probes: the residual bound's solver."""
        problems = check_ladder(list(self.theta_ladder), self.theta_refine_steps)
        if problems:
            raise TTPUserError(f"method.theta_ladder={list(self.theta_ladder)}, method.theta_refine_steps="
                               f"{self.theta_refine_steps} are not allowed: {'; '.join(problems)}")
        checks.unit_interval(checks.number(self.theta_retain_drop_at_most, "method.theta_retain_drop_at_most"),
                             "method.theta_retain_drop_at_most")
        if self.theta == "auto" and self.bound != "residual":
            raise TTPUserError(f"method.theta=auto is not allowed with method.bound={self.bound} (the rule solves the "
                               "exact optimum at each theta it probes); choose a theta in (0, 1), or "
                               "method.bound=residual")
        if self.theta == "auto" and self.warmup_epochs:
            raise TTPUserError(f"method.warmup_epochs={self.warmup_epochs} is not allowed with method.theta=auto (the "
                               "Alg 1 warm-up's objective needs theta before the rule chooses it); use 0, or a theta "
                               "in (0, 1)")

    def _check_reduction(self) -> None:
        """The residual bound takes a convex, smooth reduction of the forget losses; the paper's bound the mean."""
        reduction = str(self.forget_reduction or "mean")
        if self.bound == "paper" and reduction != "mean":
            raise TTPUserError(f"method.forget_reduction={reduction} is not allowed with method.bound=paper (its Delta "
                               "is for the mean forget loss); choose mean, or method.bound=residual")
        if reduction == "max":
            raise TTPUserError("method.forget_reduction=max is not allowed with the residual bound (not differentiable "
                               "where two images tie, so its gradient does not vanish at the optimum); choose one of: "
                               "mean, smoothmax, cvar (smoothed)")
        check_reduction_temperature(reduction, self.forget_reduction_temperature, ("smoothmax", "cvar"), auto=True)
        if reduction == "cvar":
            check_cvar_fraction(self.forget_cvar_fraction)
