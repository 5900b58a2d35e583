"""Alg 1's typed settings (method=pareto, method=pareto_robust): the schema its YAML files name first in their
defaults lists (`- /schema@_here_: pareto`), registered by the package's `__init__`; early stopping's own."""

from dataclasses import dataclass, field
from typing import Any

from ttp_lightning.config.schema import (
    BatchNormMode,
    Criterion,
    Fallback,
    MethodSchema,
    Mode,
    Reduction,
    Select,
    TrainingSchema,
    Uniformity,
    check_cvar_fraction,
    check_reduction_temperature,
)
from ttp_lightning.core import checks
from ttp_lightning.core.errors import TTPUserError


@dataclass
class EarlyStoppingSchema:
    enabled: bool = True
    conf_dist_below: float | None = 0.1
    criterion: Criterion = Criterion["worst"]
    select: Select = Select["conf_dist"]
    retain_acc_at_least: float = 0.0
    retain_acc_drop_at_most: float | None = 0.01
    patience: int | None = 20
    fallback: Fallback = Fallback["pareto"]
    retain_holdout: float = 0.0

    def __post_init__(self) -> None:
        key = "method.early_stopping"
        holdout = checks.number(self.retain_holdout, f"{key}.retain_holdout")
        if not 0.0 <= holdout <= 0.5:
            raise TTPUserError(f"{key}.retain_holdout={self.retain_holdout} is not allowed; choose a fraction of the "
                               "retain set in [0, 0.5] (0: the retain rule on the images finetuning trains on)")
        if self.conf_dist_below is not None:
            checks.positive(self.conf_dist_below, f"{key}.conf_dist_below")
        checks.unit_interval(checks.number(self.retain_acc_at_least, f"{key}.retain_acc_at_least"),
                          f"{key}.retain_acc_at_least")
        if self.retain_acc_drop_at_most is not None:
            checks.unit_interval(checks.number(self.retain_acc_drop_at_most, f"{key}.retain_acc_drop_at_most"),
                              f"{key}.retain_acc_drop_at_most")
        if self.patience is not None:
            checks.positive_int(self.patience, f"{key}.patience")


@dataclass
class ParetoSchema(MethodSchema, TrainingSchema):
    """Alg 1 (method=pareto); `adversarial` is robust Alg 1's (method=pareto_robust, checked by its method)."""

    theta: float = 0.75
    mode: Mode = Mode["minibatch"]
    gradient_surgery: bool = False
    uniformity: Uniformity = Uniformity["kl"]
    forget_temperature: float = 1.0
    epochs: int = 100
    chunk_size: int = 8192
    joint_forward: bool = False
    forget_reduction: Reduction = Reduction["mean"]
    forget_cvar_fraction: float = 0.2
    forget_reduction_temperature: float | None = None
    forget_batchnorm: BatchNormMode = BatchNormMode["train"]
    retain_batchnorm: BatchNormMode = BatchNormMode["train"]
    lr_backoffs: int = 2
    lr_warmup: Any = 0      # linear warm-up steps after each optimizer start (int >= 0), or auto (fit/alg1_callbacks.warmup_steps)
    early_stopping: EarlyStoppingSchema = field(default_factory=EarlyStoppingSchema)
    adversarial: Any = None

    def __post_init__(self) -> None:
        TrainingSchema.__post_init__(self)
        checks.unit_interval(checks.number(self.theta, "method.theta"), "method.theta")
        checks.at_least_zero(self.lr_backoffs, "method.lr_backoffs")
        checks.auto_or(self.lr_warmup, "method.lr_warmup", checks.whole_number)
        check_cvar_fraction(self.forget_cvar_fraction)
        check_reduction_temperature(self.forget_reduction, self.forget_reduction_temperature)
        checks.positive(self.forget_temperature, "method.forget_temperature")
        checks.positive_int(self.epochs, "method.epochs")
        checks.positive_int(self.chunk_size, "method.chunk_size")
