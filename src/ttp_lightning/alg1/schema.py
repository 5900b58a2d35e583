"""Alg 1's typed settings (method=pareto, method=pareto_robust), each checking itself where it is made: the
schema its YAML files name first in their defaults lists (`- /schema@_here_: pareto`, registered by the
package's `__init__`), its early stopping's, and robust Alg 1's attack settings (`method.adversarial`).
No torch here: the CLI checks settings before torch loads."""

from dataclasses import dataclass, field, replace
from typing import Any

from ttp_lightning.config.schema import (
    AttackObjective,
    BatchNormMode,
    BoundKind,
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

OBJECTIVE_NAMES = list(AttackObjective)  # the attacker's objectives (attacks/objectives.OBJECTIVES)
BOUND_NAMES = list(BoundKind)  # the bound term's bounds (bounds/uniformity.BOUNDS)
# radius_rule=retain: the training radius is train_gamma times one of these (the first is the start)
RADIUS_RUNGS = (1.0, 0.5, 0.25, 0.125, 0.0)
INNER_STARTS = ("random", "persistent")  # where each visit's inner attack starts (AdversarialSettings.inner_start)
INTERVAL_FOCUS = ("all", "unproven")  # which forget images the bound term B covers (AdversarialSettings)
PLAIN = "pareto"  # conf/method/pareto.yaml's name: Alg 1 without attacks


@dataclass(frozen=True)
class AdversarialSettings:
    gamma: float = 8.0                 # L-inf radius in units of 1/255 that early stopping attacks at
    train_gamma: float | None = None   # the inner attack's radius (None: train_margin x gamma)
    train_margin: float = 1.0          # train_gamma None: train at this multiple of gamma (above 1: a margin)
    steps: int = 10
    step_size: float = 0.25            # per step, as a fraction of the training radius
    inner_start: str = "random"        # each visit of a forget image starts from a uniform random point of the
                                       # ball | persistent: from the point its previous visit ended at
    objectives: tuple[str, ...] = ("max_softmax", "ce_pretrained", "targeted")  # one drawn per training step
    surrogate_betas: tuple[float | None, ...] = (10.0, 1.0)  # one drawn per step; None: exact gradients
    clean_weight: float = 0.5          # L_K = w L_K(clean) + (1 - w) L_K(attacked) + interval_weight B(clean)
    interval_weight: float | str = 0.0  # B: the interval bound on KL(u || p) over its ball (auto: set
                                        # for the network by alg1.method.resolve_interval_weight)
    interval_ramp_epochs: int = 10     # B's radius grows linearly to its full one over these epochs
    interval_gamma: float | None = None  # B's radius in 1/255 (None: the training radius, moved by the radius
                                         # rule); pareto_robust.yaml sets gamma, the ball proofs are judged on
    interval_focus: str = "all"        # B on every forget image of each batch | unproven: every step, on the
                                       # images the last validation epoch's bound did not prove at gamma
    bound_term: str = "interval"       # B by interval bounds, or linear (CROWN-IBP: tighter, about 2x the cost)
    radius_rule: str = "fixed"         # retain: the training radius steps down a rung of RADIUS_RUNGS after an
                                       # epoch that breaks the retain rule and up one after an epoch that keeps it
    radius_start: str = "top"          # radius_rule=retain's first rung: top (train_gamma) | bottom (the clean
                                       # images, climbing a rung after each epoch that keeps the retain rule)
    rounds: int = 1                    # at most this many cosine cycles of `epochs`: another begins while the
                                       # epoch kept leaves an image exposed at gamma, trained below it, or (bound
                                       # term on) not proven there, the bound term then on every unproven image
    later_weight_decay: float = 0.0    # the optimizer's weight decay from the second round on (the first
                                       # keeps the method's own): rounds 2+ train the whole forget set for the
                                       # bound at the full radius, and regularising them keeps held-out accuracy
    later_lr_scale: float = 1.0        # each later round's cosine cycle starts at the previous one's top rate
                                       # times this (a warm restart with a decaying peak; 1: the same top)
    visits_per_round: int | None = None  # a cycle is at most `epochs` long and visits each forget image at most
                                         # this many times (None: `epochs` alone)
    replay: int = 0                    # every training step's forget batch also holds up to this many forget
                                       # images the last epoch's attack left above the release threshold, the
                                       # worst first (0: off)
    eval_steps: int = 20
    eval_restarts: int = 1
    eval_objectives: tuple[str, ...] = field(default=("max_softmax", "ce_pretrained", "targeted"))
    eval_surrogate_betas: tuple[float | None, ...] = (10.0, 1.0)
    eval_chunk_size: int = 512
    judge_steps: int = 0               # re-attack with the judge's APGD (0: the attack above alone) ...
    judge_restarts: int = 2
    judge_objectives: tuple[str, ...] = field(default=("logsumexp", "max_softmax", "ce_pretrained", "targeted"))
    judge_surrogate_betas: tuple[float | None, ...] = (None, 10.0, 1.0)
    seed: int = 0

    def __post_init__(self) -> None:
        """Every value checked where it is made (dataclasses.replace checks again)."""
        self._check_training_attack()
        self._check_stopping_attacks()

    def _check_training_attack(self) -> None:
        """The inner attack, the bound term and the radius rule."""
        checks.positive(self.gamma, "method.adversarial.gamma")
        if self.train_gamma is not None:
            checks.positive(self.train_gamma, "method.adversarial.train_gamma")
        checks.positive(self.train_margin, "method.adversarial.train_margin")
        if self.steps != 0:
            checks.positive_int(self.steps, "method.adversarial.steps")
        checks.whole_number(self.replay, "method.adversarial.replay")
        checks.positive_int(self.rounds, "method.adversarial.rounds")
        checks.at_least_zero(self.later_weight_decay, "method.adversarial.later_weight_decay")
        if not 0.0 < checks.number(self.later_lr_scale, "method.adversarial.later_lr_scale") <= 1.0:
            raise TTPUserError(f"method.adversarial.later_lr_scale={self.later_lr_scale} is not allowed; choose a "
                               "value in (0, 1]")
        if self.visits_per_round is not None:
            checks.positive_int(self.visits_per_round, "method.adversarial.visits_per_round")
        if self.interval_ramp_epochs is not None and self.interval_ramp_epochs != 0:
            checks.positive_int(self.interval_ramp_epochs, "method.adversarial.interval_ramp_epochs")
        checks.positive(self.step_size, "method.adversarial.step_size")
        if self.interval_gamma is not None:
            checks.positive(self.interval_gamma, "method.adversarial.interval_gamma")
        if not self.objectives:
            raise TTPUserError("method.adversarial.objectives=[] is not allowed; list at least one of: "
                               + ", ".join(OBJECTIVE_NAMES))
        for objective in self.objectives:
            checks.choice(objective, "method.adversarial.objectives", OBJECTIVE_NAMES)
        checks.choice(self.radius_rule, "method.adversarial.radius_rule", ["fixed", "retain"])
        checks.choice(self.radius_start, "method.adversarial.radius_start", ["top", "bottom"])
        checks.choice(self.inner_start, "method.adversarial.inner_start", list(INNER_STARTS))
        checks.choice(self.bound_term, "method.adversarial.bound_term", BOUND_NAMES)
        checks.choice(self.interval_focus, "method.adversarial.interval_focus", list(INTERVAL_FOCUS))
        if not self.surrogate_betas:
            raise TTPUserError("method.adversarial.surrogate_betas=[] is not allowed; list at least one beta > 0 or null")
        for key in ("surrogate_betas", "eval_surrogate_betas", "judge_surrogate_betas"):
            for beta in getattr(self, key):
                if beta is not None:
                    checks.positive(beta, f"method.adversarial.{key}")
        if self.interval_weight != "auto" and \
                checks.number(self.interval_weight, "method.adversarial.interval_weight") < 0:
            raise TTPUserError(f"method.adversarial.interval_weight={self.interval_weight} is not allowed; "
                               "choose auto or a value >= 0 (0: off)")
        clean_weight = checks.number(self.clean_weight, "method.adversarial.clean_weight")
        if not 0.0 <= clean_weight < 1.0:
            raise TTPUserError(f"method.adversarial.clean_weight={clean_weight} is not allowed; choose a value in [0, 1)")

    def _check_stopping_attacks(self) -> None:
        """Early stopping's attack and the judge's re-attack."""
        checks.positive_int(self.eval_steps, "method.adversarial.eval_steps")
        checks.positive_int(self.eval_restarts, "method.adversarial.eval_restarts")
        checks.positive_int(self.eval_chunk_size, "method.adversarial.eval_chunk_size")
        for objective in self.eval_objectives:
            checks.choice(objective, "method.adversarial.eval_objectives", OBJECTIVE_NAMES)
        if self.judge_steps != 0:
            checks.positive_int(self.judge_steps, "method.adversarial.judge_steps")
            checks.positive_int(self.judge_restarts, "method.adversarial.judge_restarts")
            for objective in self.judge_objectives:
                checks.choice(objective, "method.adversarial.judge_objectives", OBJECTIVE_NAMES)
            if not self.judge_objectives or not self.judge_surrogate_betas:
                raise TTPUserError("method.adversarial.judge_objectives and judge_surrogate_betas must not be empty "
                                   "while judge_steps > 0")

    @property
    def radius(self) -> float:
        return self.gamma / 255.0

    @property
    def training_gamma(self) -> float:
        """The training radius in units of 1/255, before the radius rule: train_gamma, or train_margin x gamma."""
        return self.train_margin * self.gamma if self.train_gamma is None else self.train_gamma

    @property
    def train_radius(self) -> float:
        return self.training_gamma / 255.0

    @classmethod
    def from_config(cls, cfg) -> "AdversarialSettings":
        values = {key: cfg[key] for key in cls.__dataclass_fields__ if key in cfg}
        for key in ("objectives", "surrogate_betas", "eval_objectives", "eval_surrogate_betas", "judge_objectives",
                    "judge_surrogate_betas"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)

    def judge(self) -> "AdversarialSettings | None":
        """The judge's attack as early stopping's (judge_* as eval_*); None with judge_steps 0."""
        if not self.judge_steps:
            return None
        return replace(self, eval_steps=self.judge_steps, eval_restarts=self.judge_restarts,
                       eval_objectives=self.judge_objectives, eval_surrogate_betas=self.judge_surrogate_betas)


def adversarial_settings(values) -> AdversarialSettings:
    """`method.adversarial` (a mapping) as robust Alg 1's settings; a key that is not one of them is one line."""
    unknown = sorted(str(key) for key in values if key not in AdversarialSettings.__dataclass_fields__)
    if unknown:
        raise TTPUserError(f"method.adversarial.{unknown[0]} is not a setting of robust Alg 1; allowed: "
                           f"{', '.join(AdversarialSettings.__dataclass_fields__)}")
    return AdversarialSettings.from_config(values)


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
    retain_holdout: Any = "auto"  # a fraction of the retain set, auto or val (alg1/method.retain_parts)

    def __post_init__(self) -> None:
        key = "method.early_stopping"
        holdout = self.retain_holdout
        if holdout not in ("auto", "val") and (isinstance(holdout, (str, bool)) or holdout is None
                                               or not 0.0 <= checks.number(holdout, f"{key}.retain_holdout") <= 0.5):
            raise TTPUserError(f"{key}.retain_holdout={self.retain_holdout} is not allowed; choose auto, val or a "
                               "fraction of the retain set in [0, 0.5] (0: the retain rule on the images "
                               "finetuning trains on)")
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
    """Alg 1 (method=pareto); `adversarial` is robust Alg 1's (method=pareto_robust: a mapping, checked here as
    AdversarialSettings, which `robust()` returns)."""

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
    lr_warmup: Any = 0      # linear warm-up steps after each optimizer start (int >= 0), or auto (alg1/callbacks.warmup_steps)
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
        self._check_combinations(self.robust())  # robust Alg 1's settings check themselves as they are made

    def robust(self) -> AdversarialSettings | None:
        """Robust Alg 1's attack settings (None: plain Alg 1)."""
        return adversarial_settings(self.adversarial) if self.adversarial else None

    def _check_combinations(self, robust: AdversarialSettings | None) -> None:
        """Settings that are allowed alone and not together (`robust`: the parsed `adversarial`)."""
        batchnorm = {"forget_batchnorm": self.forget_batchnorm, "retain_batchnorm": self.retain_batchnorm}
        if self.joint_forward and (self.adversarial or self.mode != "minibatch" or "eval" in batchnorm.values()):
            raise TTPUserError(f"method.joint_forward=true is not allowed with method={self.name} "
                               f"mode={self.mode} forget_batchnorm={batchnorm['forget_batchnorm']} "
                               f"retain_batchnorm={batchnorm['retain_batchnorm']}; it joins plain Alg 1's minibatch "
                               "forward passes (both batchnorm settings train) only")
        if self.adversarial and self.name == PLAIN:
            raise TTPUserError(f"method.adversarial={dict(self.adversarial)} is not allowed with method={PLAIN}, plain "
                               "Alg 1 (an experiment file written for robust Alg 1 sets it); choose "
                               "method=pareto_robust, or add method.adversarial=null for plain Alg 1")
        if robust is not None and robust.radius_rule == "retain" and not self.early_stopping.enabled:
            raise TTPUserError("method.adversarial.radius_rule=retain is not allowed with "
                               "method.early_stopping.enabled=false; the radius follows the early-stopping retain "
                               "rule (choose radius_rule=fixed)")
        stopping = self.early_stopping
        if robust is not None and robust.rounds > 1 and (not stopping.enabled or str(stopping.select) != "proven"):
            raise TTPUserError(f"method.adversarial.rounds={robust.rounds} is not allowed with "
                               f"method.early_stopping.enabled={str(stopping.enabled).lower()} select={stopping.select}; "
                               "a round ends on the epoch early_stopping.select=proven keeps (or choose rounds=1)")
        attacked = [f"early_stopping.{key}={getattr(stopping, key)}" for key in ("criterion", "select")
                    if "attacked" in str(getattr(stopping, key))
                    or str(getattr(stopping, key)) in ("robust_conf_dist", "proven")]
        if attacked and not self.adversarial:
            raise TTPUserError(f"method.{attacked[0]} is not allowed with method={self.name}; the attacked "
                               "forget CD is measured during training by method=pareto_robust only")
