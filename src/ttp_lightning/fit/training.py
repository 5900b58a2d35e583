"""Builds Trainers from the `trainer` config group and fits a module, timing the fit."""

import re
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import NamedTuple

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar

from ttp_lightning.config.build import Part
from ttp_lightning.config.schema import MainSchema, PerformanceSchema, PretrainSchema, plain
from ttp_lightning.fit.callbacks import FiniteGuard, Performance, StepTimer, extra_callbacks
from ttp_lightning.fit.checkpointing import (
    RandomState,
    SignedCheckpointIO,
    WallClock,
    epoch_checkpoint,
    resume_from,
)
from ttp_lightning.fit.interrupts import fitting
from ttp_lightning.fit.progress import progress_callbacks

# FitSettings fields that take no part in any fit's numbers, each with why; every other field is in the keys of the
# fits it reaches (A(D)'s cache entry and its checkpoints, the method's checkpoints: FitSettings.identity)
NOT_IN_RESULTS = {
    "cache_dir": "where the cache and the checkpoints are kept, not what they hold",
    "checkpoint_every_n_epochs": "how often a fit saves; a fit resumed from any epoch equals one never stopped "
                                 "(tests/test_resume.py)",
    "resume": "whether a saved fit is picked up, not what it holds",
    "progress_bar_refresh_rate": "the console only",
}
# `trainer` values (Lightning's Trainer arguments) that take no part in a fit's numbers, each with why; every other
# one, set in the trainer group or added with +trainer.KEY=VALUE, is in the keys
TRAINER_NOT_IN_RESULTS = {
    "enable_progress_bar": "the console only (a bar or a line per epoch)",
    "enable_model_summary": "the console only",
    "log_every_n_steps": "how often the logger writes, not what is trained",
    "enable_checkpointing": "set by each fit itself (Lightning's checkpoints are its resume files)",
    "default_root_dir": "set by each fit itself",
    "logger": "set by the run itself",
}


@dataclass(frozen=True)
class FitSettings:
    """The settings every fit reads, taken from the run's checked settings once: the `trainer`, `pretrain` and
    `callbacks` sections, checkpointing and resume, the progress bar, the speed switches (`performance`),
    what names A(D)'s cache entry (`model`, `seed`, `cache_dir`) and the gate's per-image threshold the fits
    count forget images against (`exposed_above`). A method's own settings are the method's (Method.settings).
    `trainer`, `model` and `callbacks` are what Hydra builds (config.build.Part: values and a factory)."""

    trainer: Part
    pretrain: PretrainSchema
    model: Part | None = None
    callbacks: dict[str, Part | None] | None = None
    seed: int = 0
    cache_dir: str = ".cache/ttp_lightning"
    checkpoint_every_n_epochs: int = 1
    resume: bool = True
    progress_bar_refresh_rate: int = 20
    performance: PerformanceSchema = field(default_factory=PerformanceSchema)  # channels_last, fused_optimizer, compile
    exposed_above: float | None = None  # release_gate.conf_dist_at_most: fits count the forget images above it

    @classmethod
    def of(cls, settings: MainSchema) -> "FitSettings":
        return cls(trainer=settings.trainer, pretrain=settings.pretrain, model=settings.model,
                   callbacks=settings.callbacks, seed=settings.seed,
                   cache_dir=str(settings.paths.cache_dir) if settings.paths else ".cache/ttp_lightning",
                   checkpoint_every_n_epochs=int(settings.checkpoint_every_n_epochs or 0),
                   resume=bool(settings.resume), progress_bar_refresh_rate=int(settings.progress_bar_refresh_rate),
                   performance=settings.performance,
                   exposed_above=float(settings.release_gate.conf_dist_at_most))

    def fused_policy(self) -> str:
        """performance.fused_optimizer as auto | true | false."""
        return _switch(self.performance, "fused_optimizer")

    def identity(self, leave_out: dict[str, str] | None = None) -> dict:
        """These settings as plain values for a cache or checkpoint key: every field and every `trainer` value,
        less the ones named (with a reason) in NOT_IN_RESULTS, TRAINER_NOT_IN_RESULTS and `leave_out` (fields a
        given fit does not read: {name: why})."""
        skipped = {**NOT_IN_RESULTS, **(leave_out or {})}
        values = {}
        for item in fields(self):
            if item.name in skipped:
                continue
            value = getattr(self, item.name)
            if item.name == "trainer":
                value = {key: v for key, v in plain(value).items() if key not in TRAINER_NOT_IN_RESULTS}
            elif item.name == "callbacks":
                value = {key: keyed_as(plain(part)) for key, part in (value or {}).items()}
            elif not isinstance(value, (int, float, str, bool, type(None))):
                value = plain(value)
            if item.name == "pretrain" and isinstance(value, dict):
                value = without_plain_certified(value)
            values[item.name] = value
        return values


def without_plain_certified(pretrain: dict) -> dict:
    """`pretrain` less `certified` where it is off (gamma 0: plain ERM), so that the keys of every A(D) written
    before certified pretraining existed still match; on, every one of its settings is in the key."""
    certified = pretrain.get("certified")
    if isinstance(certified, dict) and not certified.get("gamma"):
        return {key: value for key, value in pretrain.items() if key != "certified"}
    return pretrain


def keyed_as(part):
    """A callback's config as keys hash it: a class that moved to another module is named where it lived when keys
    were first written (KEYED_AS), so that caches and checkpoints made before the move are still found."""
    if isinstance(part, dict) and part.get("_target_") in KEYED_AS:
        return {**part, "_target_": KEYED_AS[part["_target_"]]}
    return part


# {where a class is: where it was when the keys were first written} (issue 60 gathered Alg 1 into alg1/)
KEYED_AS = {"ttp_lightning.alg1.callbacks.ConstrainedBestModel": "ttp_lightning.fit.alg1_callbacks.ConstrainedBestModel"}


@dataclass
class FitJournal:
    """What the run's fits record as they go, the one part of the context that changes: their checkpoint
    folders (deleted once the results are written), the epoch each resumed stage resumed after, and each fit's
    speed (a StepTimer's summary: steps, images, seconds)."""

    checkpoint_dirs: list = field(default_factory=list)
    resumed: dict = field(default_factory=dict)
    speed: dict = field(default_factory=dict)


@dataclass(frozen=True)
class RunContext:
    """What the stages share that is not a setting of theirs (the pipeline alone holds the whole config): the
    fits' settings, the logger (or False), where outputs go, the run's identity (name, sweep group, swept
    values), the key of the method's fits once A(D) is known, and the journal the fits write to."""

    fit_settings: FitSettings
    logger: object = False
    output_dir: str = "."
    identity: dict = field(default_factory=dict)
    run_key: str | None = None  # hashes what determines the method's fits (keyed() once A(D) is known)
    journal: FitJournal = field(default_factory=FitJournal)

    @classmethod
    def of(cls, settings: MainSchema, logger: object = False, output_dir: str = ".",
           identity: dict | None = None) -> "RunContext":
        return cls(fit_settings=FitSettings.of(settings), logger=logger, output_dir=output_dir,
                   identity=dict(identity or {}))

    def keyed(self, run_key: str) -> "RunContext":
        """The same context (the same journal) with the method's fits keyed by `run_key`."""
        return replace(self, run_key=run_key)

    def key_for(self, label: str) -> str | None:
        """The checkpoint key of one of the method's fits."""
        return None if self.run_key is None else f"{self.run_key}_{label}"


def _switch(performance: PerformanceSchema, key: str) -> str:
    return str(getattr(performance, key)).lower()


SMALL_MODEL_MACS = 1_000_000  # multiply-accumulates per image below which one intra-op thread is as fast


def multiply_accumulates(net, channels: int, image_size: int) -> int:
    """Multiply-accumulates of one image's forward pass through the Linear and Conv2d layers of `net`."""
    import torch
    from torch import nn

    total = 0

    def count(module, inputs, output):
        nonlocal total
        if isinstance(module, nn.Linear):
            total += output.numel() * module.in_features
        elif isinstance(module, nn.Conv2d):
            total += output.numel() * module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]

    hooks = [m.register_forward_hook(count) for m in net.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    training = net.training
    try:
        net.eval()
        with torch.no_grad():
            net(torch.zeros(1, channels, image_size, image_size, device=next(net.parameters()).device))
    finally:
        net.train(training)
        for hook in hooks:
            hook.remove()
    return total


def choose_threads(cfg: MainSchema, macs: int | None = None) -> int:
    """Intra-op threads for this process: `threads` when an integer; with `auto`, OMP_NUM_THREADS when set,
    else 1 for a model under SMALL_MODEL_MACS per image (`macs`: its matrix products are too small to gain
    from more threads, and a second job beside it then runs at full speed), else the CPU cores shared evenly
    by the processes this run starts on this machine. Measured on 2 cores (docs/paper.md, Speed): the default
    digits MLP job takes 11.8 s with 1 thread and 11.4 s with 2 alone, but 43 s with 2 threads each when
    two jobs run together and 11.8 s with 1; ResNet8 on digits trains 1.8x faster with 2 threads than 1."""
    import os

    import torch

    if cfg.threads != "auto":
        threads = int(cfg.threads)
    elif os.environ.get("OMP_NUM_THREADS", "").isdigit():
        threads = int(os.environ["OMP_NUM_THREADS"])
    elif macs is not None and macs < SMALL_MODEL_MACS:
        threads = 1
    else:
        trainer = cfg.trainer
        on_cpu = str(trainer.get("accelerator", "cpu")) == "cpu"
        devices = trainer.get("devices", 1)
        processes = int(devices) if on_cpu and "ddp" in str(trainer.get("strategy", "")) and \
            str(devices).isdigit() else 1
        threads = max(1, (os.cpu_count() or 1) // max(processes, 1))
    torch.set_num_threads(max(1, threads))
    return torch.get_num_threads()


@contextmanager
def denormals_flushed(on: bool):
    """performance.flush_denormals: inside the block the CPU flushes subnormal floats to zero (x86's FTZ and DAZ,
    set by torch for this thread), and restores IEEE gradual underflow after. Intra-op worker threads take the
    mode when they start and keep it: one started before the block keeps gradual underflow (measured: half of
    a two-thread product of subnormals survived), so enter it before the run's first parallel operation.
    Training drifts into numbers below float32's smallest normal (1.2e-38), and each operation on one costs about
    a hundred normal ones: robust Alg 1 on the letters stand-in took 8-16 s an epoch from round 2 instead of 1.4
    (docs/robust-budget.md). Only this process's own arithmetic changes, by less than 1.2e-38 an operation; the
    bounds model the released float32 network as IEEE arithmetic runs it, whichever mode its user is in
    (bounds/rounding.py). On a CPU without the switch (torch returns False) nothing changes."""
    import torch

    flushed = bool(on) and torch.set_flush_denormal(True)
    try:
        yield flushed
    finally:
        if flushed:
            torch.set_flush_denormal(False)


class TrainedBy(NamedTuple):
    """What trains a fit, for the one line a divergence ends in: the stage as that line names it, the config
    section whose learning rate to lower, and that rate."""

    stage: str
    section: str
    lr: float


def make_trainer(ctx: RunContext, max_epochs: int, callbacks: list | None = None,
                 trained_by: TrainedBy | None = None, root_dir: Path | None = None, guard: bool = True,
                 phase: str = "training") -> L.Trainer:
    """A Trainer from the `trainer` config group, logging to the run's logger; it stops with one error line
    when training diverges (`trained_by`: the stage and the setting named in that line; default pretraining
    with pretrain.lr). `root_dir` (default: the run's output folder) is where Lightning's SLURM requeue
    checkpoint goes; `guard=False` leaves out the divergence check (a fit with no learning rate)."""
    trained_by = trained_by or TrainedBy("pretraining", "pretrain", float(ctx.fit_settings.pretrain.lr))
    callbacks = [*(callbacks or []), *extra_callbacks(ctx.fit_settings.callbacks),
                 *([FiniteGuard(*trained_by)] if guard else []),
                 Performance(*(_switch(ctx.fit_settings.performance, key) for key in ("channels_last", "compile", "data_on_device")))]
    shown = progress_callbacks(phase, ctx.fit_settings.progress_bar_refresh_rate, bool(ctx.fit_settings.trainer.get("enable_progress_bar", True)))
    callbacks += shown
    bar = any(isinstance(c, TQDMProgressBar) for c in shown)  # a line per epoch is not Lightning's progress bar
    return ctx.fit_settings.trainer.build(max_epochs=max_epochs, logger=ctx.logger,
                                   callbacks=callbacks, enable_checkpointing=root_dir is not None,
                                   plugins=[SignedCheckpointIO()],
                                   default_root_dir=str(root_dir or ctx.output_dir), enable_progress_bar=bar)


def checkpoint_folder(ctx: RunContext, key: str, register: bool = True) -> Path:
    """Where the fit keyed `key` keeps its checkpoints (registered for deletion when the run ends)."""
    folder = Path(ctx.fit_settings.cache_dir).expanduser() / "checkpoints" / key
    if register:
        ctx.journal.checkpoint_dirs.append(folder)
    return folder


def fit(ctx: RunContext, module: L.LightningModule, max_epochs: int, stage: str, key: str | None = None,
        callbacks: list | None = None, trained_by: TrainedBy | None = None, guard: bool = True, **loaders) -> float:
    """trainer.fit of `module` for `max_epochs` and its wall-clock seconds. With a checkpoint `key`, the fit
    writes checkpoints every `checkpoint_every_n_epochs` epochs and resumes from the newest one a stopped
    run of the same key left (see fit/checkpointing.py); `stage` names it in the log. Its training speed (a
    StepTimer's summary: the one among `callbacks`, or one added) goes into ctx.journal.speed[stage]."""
    every = ctx.fit_settings.checkpoint_every_n_epochs
    folder = checkpoint_folder(ctx, key) if key is not None and every > 0 else None
    callbacks, ckpt_path, clock = list(callbacks or []), None, WallClock()
    if folder is not None:
        callbacks += [epoch_checkpoint(folder, every), RandomState(), clock]
        found = resume_from(folder, ctx.fit_settings.resume, stage)
        if found is not None:
            ckpt_path, ctx.journal.resumed[stage] = found.path, found.epochs_done
    timer = next((c for c in callbacks if isinstance(c, StepTimer)), None)
    if timer is None:
        timer = StepTimer()
        callbacks.append(timer)
    trainer = make_trainer(ctx, max_epochs, callbacks, trained_by, root_dir=folder, guard=guard, phase=stage)
    clock.start()
    set_phase = getattr(ctx.logger, "set_phase", None)  # a logger with a step axis per phase (our WandbLogger)
    if set_phase is not None:
        set_phase(phase_key(stage))
    try:
        with fitting():
            trainer.fit(module, ckpt_path=ckpt_path, weights_only=True, **loaders)
    finally:
        if set_phase is not None:
            set_phase(None)
    ctx.journal.speed[stage] = timer.summary()
    return clock.seconds()


PHASES = {"pretraining A(D)": "pretrain", "absorbing the outside forget instances": "absorb",
          "retraining A(D_r) (the relearning floor)": "floor", "Alg 1 finetuning": "alg1",
          "certified step": "certified"}


def phase_key(stage: str) -> str:
    """The short name a fit's metrics are logged under (`pretrain/train/loss`): PHASES, else the stage's words
    joined by underscores."""
    return PHASES.get(stage) or re.sub(r"[^a-z0-9]+", "_", stage.lower()).strip("_")
