"""Typed config schemas: dataclasses registered in Hydra's ConfigStore (group `schema`), which the YAML files
name first in their defaults lists. Composition then checks every value's type and every closed choice
(the enums: a wrong value fails with the allowed ones listed, in one `error:` line before any work); the
ranges are checked in `__post_init__`, which runs when `validate_config` turns the composed sections into
these objects (`OmegaConf.to_object`). Settings whose meaning depends on other settings stay in
run/validation.py and the methods' `check`.

Values typed `Any` hold either a word or a number (`lam: auto | float`) or a `_partial_` config.
"""

import copy
import re
from dataclasses import dataclass, field, fields, is_dataclass
from enum import StrEnum
from typing import Any, ClassVar

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ttp_lightning.config.build import Part
from ttp_lightning.core import checks
from ttp_lightning.core.errors import TTPUserError

# Closed choices. Member names are the YAML words (OmegaConf matches by name); StrEnum members are also equal
# to those strings, so code comparing with "fullbatch" and JSON dumps of the config are unchanged.
Projection = StrEnum("Projection", [("global", "global"), ("per_tensor", "per_tensor")])
Mode = StrEnum("Mode", [("minibatch", "minibatch"), ("fullbatch", "fullbatch")])
Uniformity = StrEnum("Uniformity", [("kl", "kl"), ("reverse_kl", "reverse_kl"), ("square", "square")])
Fallback = StrEnum("Fallback", [("pareto", "pareto"), ("last", "last")])
BatchNormMode = StrEnum("BatchNormMode", [("train", "train"), ("eval", "eval")])
Reduction = StrEnum("Reduction", [(n, n) for n in ("mean", "max", "cvar", "smoothmax")])
Select = StrEnum("Select", [(n, n) for n in ("conf_dist", "robust_conf_dist", "proven", "retain_acc")])
Criterion = StrEnum("Criterion", [(n, n) for n in ("worst", "mean", "worst_attacked", "mean_attacked")])
Split = StrEnum("Split", [("official", "official"), ("paper", "paper")])
ForgetSource = StrEnum("ForgetSource", [("train", "train"), ("test", "test"), ("mixed", "mixed")])
NearCopies = StrEnum("NearCopies", [(n, n) for n in ("refuse", "match", "outside")])
Augment = StrEnum("Augment", [("none", "none"), ("crop_flip", "crop_flip")])
Algorithm = StrEnum("Algorithm", [(n, n) for n in ("alg2_exact_newton", "alg3_hessian_estimator", "alg4_online")])
Release = StrEnum("Release", [("each", "each"), ("final", "final")])
Bound = StrEnum("Bound", [(n, n) for n in ("residual", "paper")])
Layers = StrEnum("Layers", [(n, n) for n in ("all", "last")])
GateKind = StrEnum("GateKind", [(n, n) for n in ("clean", "attacked", "proven")])
BoundKind = StrEnum("BoundKind", [(n, n) for n in ("linear", "interval")])
ProofBound = StrEnum("ProofBound", [(n, n) for n in ("auto", "linear", "interval")])  # bounds.kind (auto: bounds/choice.py)
Intermediate = StrEnum("Intermediate", [(n, n) for n in ("auto", "crown", "ibp")])
AttackObjective = StrEnum("AttackObjective", [(n, n) for n in ("logsumexp", "max_softmax", "ce_pretrained",
                                                                "targeted")])


@dataclass
class TrainingSchema:
    """What a training section (pretrain, or a method that trains) shares."""

    key: ClassVar[str] = "method"
    lr: float = 0.01
    weight_decay: float = 0.0
    momentum: float = 0.9
    optimizer: Any = None   # a _partial_ config from conf/optimizer
    schedule: Any = None    # a _partial_ config from conf/schedule (empty: constant)

    def __post_init__(self) -> None:
        checks.positive(self.lr, f"{self.key}.lr")
        checks.at_least_zero(self.weight_decay, f"{self.key}.weight_decay")
        checks.at_least_zero(self.momentum, f"{self.key}.momentum")


Init = StrEnum("Init", [(n, n) for n in ("ibp", "default")])


@dataclass
class CertifiedPretrainSchema:
    """conf/main.yaml `pretrain.certified`: A(D) trained for an interval bound (IBP training with Shi et al.
    2021's initialisation, warm-up and regularisers; models/certified_erm.py). gamma 0: plain ERM."""

    gamma: float = 0.0          # the L-inf radius trained for, in 1/255 of [0, 1] pixels (0: off)
    robust_weight: float = 0.5  # the bound's cross entropy's weight; 1 - it on the clean cross entropy
    warmup_epochs: Any = "auto"  # epochs of plain cross entropy first | auto (models.certified_erm.phases)
    ramp_epochs: Any = "auto"    # epochs over which the radius grows to gamma | auto
    regulariser: float = 0.5    # Shi's warm-up regularisers' weight lambda (fading as the radius grows)
    tolerance: float = 0.5      # their tolerance tau
    init: Init = Init["ibp"]    # ibp: Shi's initialisation of every weight but the last | default: PyTorch's

    def __post_init__(self) -> None:
        checks.at_least_zero(self.gamma, "pretrain.certified.gamma")
        checks.unit_interval(checks.number(self.robust_weight, "pretrain.certified.robust_weight"),
                             "pretrain.certified.robust_weight")
        for key in ("warmup_epochs", "ramp_epochs"):
            checks.auto_or(getattr(self, key), f"pretrain.certified.{key}", checks.whole_number)
        checks.at_least_zero(self.regulariser, "pretrain.certified.regulariser")
        checks.positive(self.tolerance, "pretrain.certified.tolerance")

    @property
    def enabled(self) -> bool:
        return self.gamma > 0


@dataclass
class PretrainSchema(TrainingSchema):
    key: ClassVar[str] = "pretrain"
    epochs: int = 40
    norm_bound: float | None = None
    projection: Projection = Projection["global"]
    use_cache: bool = True
    absorb_epochs: int = 5
    certified: CertifiedPretrainSchema = field(default_factory=CertifiedPretrainSchema)

    def __post_init__(self) -> None:
        super().__post_init__()
        checks.positive_int(self.epochs, "pretrain.epochs")
        if self.norm_bound is not None:
            checks.positive(self.norm_bound, "pretrain.norm_bound")
        checks.at_least_zero(self.absorb_epochs, "pretrain.absorb_epochs")
        explicit = [int(v) for v in (self.certified.warmup_epochs, self.certified.ramp_epochs) if v != "auto"]
        if self.certified.enabled and sum(explicit) > self.epochs:
            raise TTPUserError(f"pretrain.certified: warmup_epochs + ramp_epochs = {sum(explicit)} is more than "
                               f"pretrain.epochs={self.epochs}; choose at most {self.epochs} in all")


@dataclass
class PerformanceSchema:
    """Speed settings of the fits; `auto` is on on a GPU only."""

    channels_last: Any = "auto"
    fused_optimizer: Any = "auto"
    compile: bool = False
    data_on_device: Any = "auto"
    flush_denormals: bool = True

    def __post_init__(self) -> None:
        for key in ("channels_last", "fused_optimizer", "data_on_device"):
            if str(getattr(self, key)).lower() not in ("auto", "true", "false"):
                raise TTPUserError(f"performance.{key}={getattr(self, key)!r} is not allowed; choose auto, true "
                                   "or false")


@dataclass
class BoundsSchema:
    """conf/main.yaml `bounds` (bounds/): how every forget image's proven CD and proven radius are bounded."""

    kind: ProofBound = ProofBound["auto"]
    intermediate: Intermediate = Intermediate["auto"]
    intermediate_budget: int = 4096
    slope_steps: int = 20
    radius_step: float = 0.25
    max_radius: float = 16.0
    seconds_per_image: float = 5.0

    def __post_init__(self) -> None:
        checks.positive(self.seconds_per_image, "bounds.seconds_per_image")
        checks.at_least_zero(self.intermediate_budget, "bounds.intermediate_budget")
        if self.slope_steps != 0:
            checks.positive_int(self.slope_steps, "bounds.slope_steps")
        checks.positive(self.radius_step, "bounds.radius_step")
        checks.positive(self.max_radius, "bounds.max_radius")
        if self.max_radius > 255 or self.radius_step > self.max_radius:
            raise TTPUserError(f"bounds.max_radius={self.max_radius:g} with bounds.radius_step={self.radius_step:g} "
                               "is not allowed; radii are in 1/255 of the pixel range, so choose 0 < radius_step <= "
                               "max_radius <= 255")
        if self.max_radius / self.radius_step > 4096:
            raise TTPUserError(f"bounds.max_radius={self.max_radius:g} with bounds.radius_step={self.radius_step:g} is "
                               "not allowed; the grid may hold at most 4096 radii")


@dataclass
class ReleaseGateSchema:
    """conf/main.yaml `release_gate` (assess/protection.py): the per-image threshold and the CDs that must meet it."""

    conf_dist_at_most: float = 0.1
    require: list[GateKind] | None = None  # None: the method's default (assess.protection.GateSettings.from_config)
    min_proven_radius: float | None = None  # every forget image proven at least this far (1/255); None: off

    def __post_init__(self) -> None:
        checks.unit_interval(checks.number(self.conf_dist_at_most, "release_gate.conf_dist_at_most"),
                          "release_gate.conf_dist_at_most")
        if self.min_proven_radius is not None:
            checks.positive(self.min_proven_radius, "release_gate.min_proven_radius")


@dataclass
class MainSchema:
    """The top level of conf/main.yaml (the groups are typed by their own schemas)."""

    experiment_name: str = "digits_mlp"
    data: Any = None
    model: Any = None  # settings_of: a config.build.Part (Hydra's schema check sees the YAML: Any)
    method: Any = None
    trainer: Any = None  # a Part
    logger: Any = None  # built by the run itself, at its start (reporting.run_logger.build_logger)
    paths: Any = None
    attacks: Any = None
    callbacks: Any = None  # {name: Part or None}
    seed: int = 42
    threads: Any = "auto"
    checkpoint_every_n_epochs: int = 1
    resume: bool = True
    state_dict: bool = False
    progress_bar_refresh_rate: int = 20
    required: list[str] = field(default_factory=list)
    license: str = "other"  # the release card's hub licence (release/card.front_matter)
    performance: PerformanceSchema = field(default_factory=PerformanceSchema)
    pretrain: PretrainSchema = field(default_factory=PretrainSchema)
    release_gate: ReleaseGateSchema = field(default_factory=ReleaseGateSchema)
    bounds: BoundsSchema = field(default_factory=BoundsSchema)

    def __post_init__(self) -> None:
        checks.auto_or(self.threads, "threads", checks.positive_int)
        checks.positive_int(self.progress_bar_refresh_rate, "progress_bar_refresh_rate")
        checks.at_least_zero(self.checkpoint_every_n_epochs, "checkpoint_every_n_epochs")
        if not re.fullmatch(r"[a-z0-9][a-z0-9.+-]{0,63}", str(self.license)):
            raise TTPUserError(f"license={self.license} is not allowed; choose a licence id of lower-case letters, "
                               "digits, '.', '+' and '-' (mit, apache-2.0, cc-by-4.0, ...) or other")


@dataclass
class ForgetSchema:
    size: int | None = 100
    seed: int = 0
    indices_file: str | None = None
    requests: Any = None
    source: ForgetSource = ForgetSource["train"]
    test_fraction: float = 0.5
    images: str | None = None
    near_copies: NearCopies = NearCopies["refuse"]

    def __post_init__(self) -> None:
        if self.indices_file is None and self.size is not None:
            checks.positive_int(self.size, "data.forget.size")
        checks.unit_interval(checks.number(self.test_fraction, "data.forget.test_fraction"), "data.forget.test_fraction")


@dataclass
class DataSchema:
    """conf/data_defaults.yaml, which every data set config starts from."""

    _target_: str = "ttp_lightning.data.TTPDataModule"
    name: str = "digits"
    loader: Any = None  # how the data set's files are read: a Source's config (data/sources.py)
    root: str = "data"
    download: bool = False
    split: Split = Split["official"]
    train_fraction: float = 0.7
    split_seed: int = 0
    forget: ForgetSchema = field(default_factory=ForgetSchema)
    batch_size: int = 128
    forget_batch_size: int = 10
    eval_batch_size: int = 1024
    augment: Augment = Augment["none"]
    normalize: bool = True
    max_train_size: int | None = None
    max_test_size: int | None = None
    num_workers: int = 0
    seed: int = 42
    mean: list[float] | None = None  # the model's input statistics when not the data's own (normalize=true)
    std: list[float] | None = None
    # for a loader that takes them (data=imagefolder's ImageFolderSource, whose YAML passes them on):
    image_size: int | None = None  # resize (shorter side) and centre-crop to N x N
    channels: int | None = None    # 1 or 3; null: from the images
    decoded_cache: str | None = None  # where decoded images are kept between runs

    def __post_init__(self) -> None:
        read = set(self.loader or {})  # the settings this data set's loader takes (data=imagefolder's: all three)
        if self.decoded_cache is not None and "decoded_cache" not in read:
            raise TTPUserError(f"data.decoded_cache is only for data=imagefolder; data set {self.name!r} is read "
                               "from its own files every run")
        for key in ("image_size", "channels"):
            if getattr(self, key) is not None and key not in read:
                raise TTPUserError(f"data.{key}={getattr(self, key)} is only for data=imagefolder; data set "
                                   f"{self.name!r} has its own image shape")
        if self.image_size is not None:
            checks.positive_int(self.image_size, "data.image_size")
        if self.channels not in (None, 1, 3):
            raise TTPUserError(f"data.channels={self.channels} is not allowed; choose 1, 3 or null (from the images)")
        fraction = checks.number(self.train_fraction, "data.train_fraction")
        if not 0.0 < fraction < 1.0:
            raise TTPUserError(f"data.train_fraction={fraction} is not allowed; choose a value in (0, 1)")
        for key in ("batch_size", "forget_batch_size", "eval_batch_size"):
            checks.positive_int(getattr(self, key), f"data.{key}")
        for key in ("max_train_size", "max_test_size"):
            if getattr(self, key) is not None:
                checks.positive_int(getattr(self, key), f"data.{key}")
        checks.at_least_zero(self.num_workers, "data.num_workers")


@dataclass
class MethodSchema:
    """Every method: the class Hydra builds, the name its results are filed under, and the Alg 1 settings an
    experiment may set for whichever method it is combined with (`experiment=mnist_mlp method=retrain`):
    typed, but null and unused for a method that does not train by Alg 1."""

    _target_: str = "???"
    name: str = "???"
    label: str | None = None  # how tables, figures and the model card name it (null: its name)
    theta: float | None = None
    mode: Mode | None = None
    gradient_surgery: bool | None = None
    joint_forward: bool | None = None
    uniformity: Uniformity | None = None
    forget_temperature: float | None = None
    epochs: int | None = None
    lr: float | None = None
    weight_decay: float | None = None
    momentum: float | None = None
    chunk_size: int | None = None
    forget_reduction: Reduction | None = None
    forget_cvar_fraction: float | None = None
    forget_reduction_temperature: float | None = None
    forget_batchnorm: BatchNormMode | None = None
    retain_batchnorm: BatchNormMode | None = None
    lr_backoffs: int | None = None
    early_stopping: Any = None
    optimizer: Any = None
    schedule: Any = None


def check_reduction_temperature(reduction, temperature, needs=("smoothmax",), auto: bool = False) -> None:
    """The reductions in `needs` take a temperature > 0 (at T <= 0 a smooth maximum is a smooth minimum, or
    undefined); `auto` also allows the certified learners' rule."""
    if temperature is None:
        if str(reduction) in needs:
            raise TTPUserError(f"method.forget_reduction={reduction} needs method.forget_reduction_temperature; "
                               f"choose {'auto or ' if auto else ''}a number > 0 (in the loss's units, nats: lower "
                               "is closer to the largest loss)")
    elif auto:
        checks.auto_or(temperature, "method.forget_reduction_temperature", checks.positive)
    else:
        checks.positive(temperature, "method.forget_reduction_temperature")


def check_cvar_fraction(fraction) -> None:
    fraction = checks.number(fraction, "method.forget_cvar_fraction")
    if not 0.0 < fraction <= 1.0:
        raise TTPUserError(f"method.forget_cvar_fraction={fraction} is not allowed; choose a value in (0, 1]")


@dataclass
class RelearnSchema:
    """attacks.relearn: finetuning the released model on public data to restore its forget predictions, from
    each source in `data` at each learning rate in `lrs`; the worst case over them is reported."""

    enabled: bool = True
    steps: list[int] = field(default_factory=lambda: [1, 10, 100, 1000])
    lrs: list[float] = field(default_factory=lambda: [1.0e-4, 1.0e-3, 1.0e-2])
    data: list[str] = field(default_factory=lambda: ["test", "retain"])
    retain_size: int | None = 1000
    batch_size: int = 128
    floor: bool = True  # also relearn A(D_r), retrained without the forget images (cached like A(D))

    def __post_init__(self) -> None:
        for key in ("steps", "lrs", "data"):
            if not getattr(self, key):
                raise TTPUserError(f"attacks.relearn.{key}=[] is not allowed; list at least one")
        for steps in self.steps:
            checks.positive_int(steps, "attacks.relearn.steps")
        for lr in self.lrs:
            checks.positive(lr, "attacks.relearn.lrs")
        for source in self.data:
            checks.choice(source, "attacks.relearn.data", list(RELEARN_DATA))
        if self.retain_size is not None:
            checks.positive_int(self.retain_size, "attacks.relearn.retain_size")
        checks.positive_int(self.batch_size, "attacks.relearn.batch_size")


RELEARN_DATA = ("test", "retain")  # the relearning attacker's labelled images: the test split | a retain subset


@dataclass
class AttacksSchema:
    """conf/attacks (the attack evaluation of every stage's model on the forget set)."""

    enabled: bool = True
    suite: dict[str, Any] = field(default_factory=dict)  # name -> an attack's config (conf/attack), or null
    gammas: list[float] = field(default_factory=lambda: [1.0, 2.0, 5.0, 8.0])
    robust_gamma: float = 8.0
    surrogate_betas: list[float | None] = field(default_factory=lambda: [None, 10.0, 1.0])
    apgd_steps: int = 100
    restarts: int = 2
    objectives: list[AttackObjective] = field(default_factory=lambda: list(AttackObjective))
    eot_samples: int = 16
    unbounded_check: bool = True
    chunk_size: int = 512
    alpha: float = 1.0e-4
    pgd_steps: int = 50
    pgd_step_size: float = 1.0e-3
    relu_gradient_beta: float | None = 10.0
    seed: int = 0
    relearn: RelearnSchema = field(default_factory=RelearnSchema)

    def __post_init__(self) -> None:
        if not self.enabled:
            return
        if not any(settings is not None for settings in self.suite.values()):
            raise TTPUserError("attacks.suite has no attack; add one, e.g. +attacks/suite@attacks.suite.apgd=apgd, or set "
                               "attacks.enabled=false")
        for name, settings in self.suite.items():
            if settings is not None and not (isinstance(settings, dict) and settings.get("_target_")):
                raise TTPUserError(f"attacks.suite.{name}={settings!r} is not allowed; give an attack's config "
                                   "(conf/attacks/suite/<name>.yaml: `_target_: <module>.<Attack subclass>`) or null")
        for gamma in self.gammas:
            checks.positive(gamma, "attacks.gammas")
        checks.at_least_zero(self.alpha, "attacks.alpha")
        checks.positive(self.pgd_step_size, "attacks.pgd_step_size")
        if self.relu_gradient_beta is not None:
            checks.positive(self.relu_gradient_beta, "attacks.relu_gradient_beta")
        for key in ("pgd_steps", "apgd_steps", "restarts", "eot_samples", "chunk_size"):
            checks.positive_int(getattr(self, key), f"attacks.{key}")
        if not self.surrogate_betas:
            raise TTPUserError("attacks.surrogate_betas=[] is not allowed; list at least one beta > 0 or null (exact)")
        for beta in self.surrogate_betas:
            if beta is not None:
                checks.positive(beta, "attacks.surrogate_betas")
        if not self.objectives:
            raise TTPUserError("attacks.objectives=[] is not allowed; choose at least one of: "
                               + ", ".join(AttackObjective))
        if float(self.robust_gamma) not in [float(g) for g in self.gammas]:
            raise TTPUserError(f"attacks.robust_gamma={self.robust_gamma:g} is not allowed; choose one of "
                               f"attacks.gammas: {', '.join(f'{float(g):g}' for g in self.gammas)}")


SCHEMAS = {"main": MainSchema, "attacks": AttacksSchema, "data": DataSchema, "method": MethodSchema}  # the methods'
# own schemas live beside them (alg1/schema.py, certified/schema.py, methods/baselines/schemas.py)


def register(method_schemas: dict[str, type]) -> None:
    """Store these schemas and `method_schemas` (a method's name -> its schema) as group `schema` (YAML files
    name them: `- /schema@_here_: pareto`)."""
    store = ConfigStore.instance()
    for name, node in {**SCHEMAS, **method_schemas}.items():
        store.store(group="schema", name=name, node=node)


def as_schema(schema: type, values, key: str):
    """`values` (a typed section, a plain mapping or None) as `schema`'s object: closed choices coerced to
    their enums and checked, every range checked (__post_init__); a bad value is one line naming it."""
    try:
        node = OmegaConf.merge(OmegaConf.structured(schema), values if values is not None else {})
    except OmegaConfBaseException as exc:
        where = f"{key}.{exc.full_key}" if getattr(exc, "full_key", None) else key
        raise TTPUserError(f"{where}: {str(exc).splitlines()[0]}") from None
    return typed(node, key)


def plain(value):
    """A section (a schema object, a config or a mapping) as plain, resolved dicts and lists, the enums kept:
    what hashes and JSON records take."""
    if value is None:
        return None
    if isinstance(value, Part):
        return copy.deepcopy(value.values)
    node = OmegaConf.structured(value) if is_dataclass(value) else value
    return OmegaConf.to_container(OmegaConf.create(node) if isinstance(node, (dict, list)) else node, resolve=True)


def settings_of(cfg) -> MainSchema:
    """The composed config as one MainSchema object, every value checked once: each typed section (data, the
    method, attacks, pretrain, performance, release_gate) becomes its schema's object (its ranges checked in
    `__post_init__`), the top level's own values are checked by MainSchema, the sections Hydra builds for the
    stages (trainer, model, callbacks) become factories (config.build.Part), and `paths` and `logger` stay
    configs (the run builds its logger at once, from the composed config)."""
    values = {}
    for item in fields(MainSchema):
        if item.name in cfg:
            node = cfg[item.name]
            values[item.name] = _part(node, item.name) if item.name in PARTS else \
                typed(node, item.name) if OmegaConf.is_config(node) else node
    return MainSchema(**values)


PARTS = ("trainer", "model", "callbacks")  # built by Hydra: config.build.Part (callbacks: one per entry)


def _part(node, key: str):
    """A section Hydra builds as a config.build.Part (its plain values and a factory); `callbacks` as {name: Part
    or None}."""
    if key != "callbacks" or node is None:
        return Part.of(node)
    return {str(name): Part.of(entry) for name, entry in node.items()}


def typed(section, key: str):
    """The section as its schema's object (running the range checks); the section itself when untyped.
    OmegaConf's own errors (which only a section edited after composition can raise) become one line."""
    if section is None or OmegaConf.get_type(section) in (dict, None):
        return section
    try:
        return OmegaConf.to_object(section)
    except OmegaConfBaseException as exc:
        raise TTPUserError(f"{key}: {str(exc).splitlines()[0]}") from None


