"""Alg 1's callbacks: the paper's constrained early stopping (`callbacks.best_model`), the learning-rate warm-up
and back-off, and the training radius that follows the retain rule; and reading Alg 1's entries of the
`callbacks` config group back. The generic callbacks: fit/callbacks.py."""

import logging
import math
from collections.abc import Callable, Mapping

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from ttp_lightning.config.build import Part
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.fit.callbacks import METHOD_CALLBACKS

log = logging.getLogger(__name__)


def cpu_state(module: L.LightningModule) -> dict:
    """A copy of the module's state_dict on the CPU (weights to restore later, unaffected by further training)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}


class ConstrainedBestModel(Callback):
    """App. "Hyperparameter Details": an epoch qualifies when the forget confidence distance (`conf_dist_key`:
    the mean, or the worst image's) is below `conf_dist_below` and the retain accuracy is at least
    `retain_acc_at_least`; keep the qualifying weights with the lowest `rank_key` (default: the same
    distance; with `rank_higher_is_better`, the highest, e.g. the retain accuracy), or the lowest tuple `rank`
    (a function of the logged metrics) returns, restore them when training ends. Training runs to the
    last epoch unless `patience` epochs pass without a better qualifying epoch. When no epoch qualifies,
    the last weights stay and `constraint_met` is False.

    Acts in `on_validation_end`, after the module's `on_validation_epoch_end` has logged the metrics.
    """

    def __init__(self, conf_dist_below: float = math.inf, retain_acc_at_least: float = 0.0,
                 patience: int | None = None, conf_dist_key: str = "val/forget_conf_dist",
                 retain_acc_key: str = "val/retain_acc", fallback: str = "last", rank_key: str | None = None,
                 rank_higher_is_better: bool = False, mean_conf_dist_key: str | None = None,
                 rank: Callable[[Mapping[str, float]], tuple[float, ...]] | None = None, rank_rule: str | None = None):
        self.conf_dist_below, self.retain_acc_at_least, self.patience = conf_dist_below, retain_acc_at_least, patience
        self.conf_dist_key, self.retain_acc_key, self.fallback = conf_dist_key, retain_acc_key, fallback
        self.rank_key, self.rank_higher_is_better = rank_key or conf_dist_key, rank_higher_is_better
        self.rank, self.rank_rule = rank, rank_rule  # rank_rule: the rank in words, for the summary
        self.mean_conf_dist_key = mean_conf_dist_key or conf_dist_key  # the Pareto fallback's forget CD
        self.fallback_score: float | None = None
        self.fallback_epoch: int | None = None
        self.fallback_state: dict | None = None
        self.best_rank: float | None = None
        self.best_epoch: int | None = None
        self.best_state: dict | None = None
        self.last_epoch = 0
        self._stale_epochs = 0
        self.stopped = False

    _STATE = ("fallback_score", "fallback_epoch", "fallback_state", "best_rank", "best_epoch", "best_state",
              "last_epoch", "_stale_epochs", "stopped")

    def state_dict(self) -> dict:
        """The record so far, saved in checkpoints so a resumed fit keeps the same epoch."""
        return {name: getattr(self, name) for name in self._STATE}

    def load_state_dict(self, state_dict: dict) -> None:
        for name in self._STATE:
            setattr(self, name, state_dict[name])
        if isinstance(self.best_rank, (int, float)):  # a checkpoint from before ranks were tuples
            self.best_rank = [float(self.best_rank)]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.stopped:  # resumed from the checkpoint of the epoch at which patience ran out
            trainer.should_stop = True

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metrics = trainer.callback_metrics
        retain_acc = float(metrics[self.retain_acc_key])
        criterion, conf_dist = float(metrics[self.conf_dist_key]), float(metrics[self.mean_conf_dist_key])
        rank = self._rank(metrics)  # lower is better
        self.last_epoch = trainer.current_epoch + 1
        qualifies = criterion < self.conf_dist_below and retain_acc >= self.retain_acc_at_least
        score = retain_acc - conf_dist
        if self.fallback == "pareto" and self.best_epoch is None and \
                (self.fallback_score is None or score > self.fallback_score):
            self.fallback_score, self.fallback_epoch = score, self.last_epoch
            self.fallback_state = cpu_state(pl_module)
        if qualifies and (self.best_rank is None or rank < tuple(self.best_rank)):
            self.best_rank, self.best_epoch = list(rank), self.last_epoch
            self.best_state = cpu_state(pl_module)
            self._stale_epochs = 0
        elif self.best_epoch is not None:
            self._stale_epochs += 1
            if self.patience is not None and self._stale_epochs >= self.patience:
                trainer.should_stop = self.stopped = True

    def could_qualify(self, value: Callable[[str], float | None]) -> bool:
        """Whether this epoch can still qualify, from what is known before its attacks (`value(key)`: the
        epoch's metric, None where not yet known): False once its retain accuracy is below tau_r or its clean
        criterion at or above tau_c (NaN fails both), where no attack result can make it the kept epoch."""
        retain, criterion = value(self.retain_acc_key), value(self.conf_dist_key)
        return not ((retain is not None and not retain >= self.retain_acc_at_least)
                    or (criterion is not None and not criterion < self.conf_dist_below))

    def kept_rank(self) -> tuple[float, ...] | None:
        """The rank of the qualifying epoch kept so far (lower is better); None before one qualifies."""
        return tuple(self.best_rank) if self.best_epoch is not None else None

    def _rank(self, metrics: Mapping) -> tuple[float, ...]:
        if self.rank is not None:
            return tuple(float(value) for value in self.rank({k: float(v) for k, v in metrics.items()}))
        return (float(metrics[self.rank_key]) * (-1 if self.rank_higher_is_better else 1),)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.best_state is not None:
            pl_module.load_state_dict(self.best_state)
        elif self.fallback_state is not None:
            pl_module.load_state_dict(self.fallback_state)

    def summary(self) -> dict:
        """best_epoch, constraint_met and selection_rule: which rule chose the kept epoch."""
        if self.best_epoch is not None:
            return {"best_epoch": self.best_epoch, "constraint_met": True,
                    "selection_rule": (self.rank_rule or ("highest retain accuracy" if self.rank_higher_is_better
                                                          else "lowest forget CD"))
                    + " among the epochs meeting the thresholds"}
        if self.fallback_epoch is not None:
            return {"best_epoch": self.fallback_epoch, "constraint_met": False,
                    "selection_rule": "no epoch met the thresholds: fallback to the highest retain accuracy minus "
                                      "forget CD (a Pareto-optimal epoch)"}
        return {"best_epoch": self.last_epoch, "constraint_met": False,
                "selection_rule": "no epoch met the thresholds: the last epoch"}


def warmup_steps(setting, optimizer: torch.optim.Optimizer, fit_steps: int) -> int:
    """The linear warm-up's length: `setting` steps (an int >= 0), or `auto`: 2 / (1 - beta2) steps for an
    optimizer with Adam's betas (the untuned rule of Ma & Yarats 2021: the horizon of Adam's second-moment
    average, 2,000 steps at beta2 0.999), at most a tenth of the fit's `fit_steps`; no warm-up for the others."""
    if setting != "auto":
        return int(setting)
    betas = optimizer.defaults.get("betas")
    if not betas:
        return 0
    return round(min(2.0 / (1.0 - float(betas[1])), max(0, fit_steps) / 10))


class LrWarmup(Callback):
    """Linear learning-rate warm-up over the first steps after each optimizer start: step t of `steps`
    (counted from the fit's first step, and again from an LrBackoff restart, whose fresh Adam state takes the
    same first steps) runs at (t + 1) / steps of the scheduled rate, which is put back after the step, so the
    epoch schedule, LrBackoff and checkpoints see the rate they set. Why: Adam's first updates move every weight
    by about the learning rate whatever its gradient (the second-moment average has seen few steps), and robust
    Alg 1's first epoch at the full rate cost a BatchNorm ResNet8 on MNIST and the noisy-MNIST MLP half their
    retain accuracy. `setting`: steps (int) or `auto` (warmup_steps)."""

    def __init__(self, setting="auto", cycles: int = 1):
        self.setting, self.cycles = setting, cycles  # cycles: the fit is this many schedule cycles (Rounds)
        self.steps = 0
        self.origin: int | None = None  # the global step the optimizer (re)started at
        self.scheduled: list[list[float]] | None = None

    def state_dict(self) -> dict:
        return {"origin": self.origin}

    def load_state_dict(self, state_dict: dict) -> None:
        self.origin = state_dict["origin"]

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        fit_steps = trainer.estimated_stepping_batches
        fit_steps = int(fit_steps) // self.cycles if math.isfinite(fit_steps) else 0
        self.steps = warmup_steps(self.setting, trainer.optimizers[0], fit_steps) if trainer.optimizers else 0

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if self.steps <= 0:
            return
        if self.origin is None or not any(len(opt.state) for opt in trainer.optimizers):
            self.origin = trainer.global_step  # a fresh optimizer state: the fit's start or an LrBackoff restart
        done = trainer.global_step - self.origin
        if done >= self.steps:
            return
        self.scheduled = [[group["lr"] for group in opt.param_groups] for opt in trainer.optimizers]
        for opt in trainer.optimizers:
            for group in opt.param_groups:
                group["lr"] = group["lr"] * (done + 1) / self.steps

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        if self.scheduled is None:
            return
        for opt, rates in zip(trainer.optimizers, self.scheduled):
            for group, lr in zip(opt.param_groups, rates):
                group["lr"] = lr
        self.scheduled = None


class LrBackoff(Callback):
    """A learning rate the model cannot take: when an epoch ends with the retain accuracy below `floor` (the
    pipeline sets it halfway between the retain rule's threshold and chance, 1/K: the model lost more than half
    of its accuracy above chance), the fit goes back to its starting weights with the learning rate divided by
    `factor` and a fresh optimizer state, at most `max_backoffs` times. Adam at 1e-2, a training rate, did this
    to a BatchNorm ResNet8 finetuned on digits (retain accuracy 0.99 -> 0.46 in the first epoch) and fits
    1e-3; an MLP at 1e-2 dips far less (lowest epoch 0.65 on digits) and keeps its rate. `backoffs` records each
    (epoch, new learning rate). `retain_key`: the logged retain accuracy it reads (the held-out slice's under
    early_stopping.retain_holdout)."""

    def __init__(self, floor: float, max_backoffs: int = 2, factor: float = 10.0,
                 retain_key: str = "val/retain_acc"):
        self.floor, self.max_backoffs, self.factor = floor, max_backoffs, factor
        self.retain_key = retain_key
        self.backoffs: list[dict] = []
        self.start_state: dict | None = None

    def state_dict(self) -> dict:
        return {"backoffs": self.backoffs, "start_state": self.start_state}

    def load_state_dict(self, state_dict: dict) -> None:
        self.backoffs, self.start_state = list(state_dict["backoffs"]), state_dict["start_state"]

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.start_state is None:  # a resumed fit keeps the state of its own start
            self.start_state = cpu_state(pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        retain = trainer.callback_metrics.get(self.retain_key)
        if trainer.sanity_checking or retain is None or float(retain) >= self.floor \
                or len(self.backoffs) >= self.max_backoffs:
            return
        pl_module.load_state_dict(self.start_state)
        for optimizer in trainer.optimizers:
            optimizer.state.clear()
            for group in optimizer.param_groups:
                group["lr"] /= self.factor
                if "initial_lr" in group:
                    group["initial_lr"] /= self.factor
        for config in trainer.lr_scheduler_configs:
            config.scheduler.base_lrs = [lr / self.factor for lr in config.scheduler.base_lrs]
        new_lr = trainer.optimizers[0].param_groups[0]["lr"]
        self.backoffs.append({"epoch": trainer.current_epoch + 1, "retain_acc": round(float(retain), 6),
                              "lr": new_lr})
        if trainer.global_rank == 0:
            log.warning("epoch %d: retain accuracy %.4f fell below %.4f (half the accuracy above chance is lost): "
                        "back to the starting weights with learning rate %.3g", trainer.current_epoch + 1,
                        float(retain), self.floor, new_lr)


class RadiusFromRetainRule(Callback):
    """Robust Alg 1's training radius chosen by the retain rule (adversarial.radius_rule=retain): after an epoch
    whose retain accuracy is below `threshold` (tau_r, the early-stopping rule) the training radius (the inner
    attack's, and the interval term's before its ramp) steps down one rung of `rungs` (fractions of the full
    training radius, largest first), after one that keeps it, up one. The radius is then the largest the model
    can be made uniform at without breaking the retain rule: on an MLP that is the full radius; a BatchNorm
    ResNet that cannot keep its accuracy with a uniform ball around each image goes down to the clean images
    (radius 0), where the retain rule can hold, instead of ending without a qualifying epoch. `rung` is saved in checkpoints; `retain_key` is the logged retain accuracy it reads;
    `start="bottom"` begins at the last rung (the clean images) and climbs, a curriculum instead of the full
    ball from the first step. `held` (set by Rounds after a round the rule spent below the promised radius) pins
    the full radius: the promise is held, never fallen back from, so the run releases at it or measures its
    price there (assess/frontier.py). A held radius is reached by a linear ramp over `ramp` epochs, as certified
    training ramps its radius (Gowal et al. 2018; CROWN-IBP over about 30 % of training): on the letters stand-in
    the full 12/255 at once, from weights trained on the clean images, took the retain accuracy from 81 to 22 %
    in one epoch."""

    def __init__(self, threshold: float, rungs: tuple[float, ...], retain_key: str = "val/retain_acc",
                 start: str = "top"):
        self.threshold, self.rungs, self.retain_key = threshold, tuple(rungs), retain_key
        self.rung = 0 if start == "top" else len(self.rungs) - 1  # bottom: from the clean images up
        self.held, self.held_epochs, self.ramp = False, 0, 1

    def state_dict(self) -> dict:
        return {"rung": self.rung, "held": self.held, "held_epochs": self.held_epochs, "ramp": self.ramp}

    def load_state_dict(self, state_dict: dict) -> None:
        self.rung, self.held = int(state_dict["rung"]), bool(state_dict.get("held", False))
        self.held_epochs, self.ramp = int(state_dict.get("held_epochs", 0)), int(state_dict.get("ramp", 1))

    def hold(self, pl_module: L.LightningModule, ramp: int = 1) -> None:
        """From now on the full training radius (rung 0), whatever the accuracy, reached by a linear ramp over
        `ramp` epochs (the first at 1 / ramp of it)."""
        self.held, self.rung, self.held_epochs, self.ramp = True, 0, 0, max(1, int(ramp))
        pl_module.radius_scale = self.scale()

    def scale(self) -> float:
        """The training radius's fraction this epoch: the rung's, or on a held radius the ramp's."""
        if not self.held:
            return self.rungs[self.rung]
        return self.rungs[0] * min(1.0, (self.held_epochs + 1) / self.ramp)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.radius_scale = self.scale()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        retain = trainer.callback_metrics.get(self.retain_key)
        if trainer.sanity_checking or retain is None:
            return
        if self.held:
            self.held_epochs += 1
        else:
            step = 1 if float(retain) < self.threshold else -1
            self.rung = min(max(self.rung + step, 0), len(self.rungs) - 1)
        pl_module.radius_scale = self.scale()


def goal_met(rank: tuple[float, ...] | None, bound_on: bool) -> bool:
    """Whether the epoch kept so far (`rank`: select=proven's (below radius, exposed, unproven, ...), None before
    one qualifies) meets what robust Alg 1 works toward: trained at the radius judged, no forget image exposed at
    gamma under early stopping's attack and the judge's, and, where the bound term is on (`bound_on`), every
    image proven at gamma by the interval bound. NaN never meets it."""
    if rank is None:
        return False
    below, exposed, unproven = (float(value) for value in rank[:3])
    return below == 0 and exposed == 0 and (not bound_on or unproven == 0)


class Rounds(Callback):
    """Robust Alg 1's controller over how long it trains (adversarial.rounds): the fit is up to `rounds` cosine
    cycles of `cycle` epochs each. At the end of a cycle, when the epoch kept (`kept_rank`, early stopping's)
    meets goal_met the fit stops; otherwise the next cycle begins from the current weights with the schedule
    restarted at its starting rate (and LrWarmup's warm-up again) and the bound term on every image the last
    validation epoch left unproven (the module's `round`). The first cycle is the single fit of rounds=1, so a
    run that meets the goal there has the same numbers; `restarts` records (epoch, round begun, why). With the
    radius rule (`radius`), a round that ends with no epoch kept, or the kept one trained below the promised
    radius, is followed by rounds that hold the full radius (RadiusFromRetainRule.hold): the rule does not fall
    back twice, and what the promise costs is measured where it is made. From the second round on the optimizer's
    weight decay is `weight_decay` where that is set (adversarial.later_weight_decay), and round k's cycle starts
    at the first one's rate times lr_scale ** (k - 1) (adversarial.later_lr_scale). Saved in checkpoints: a
    resumed fit is in the same round."""

    def __init__(self, cycle: int, rounds: int, kept_rank, bound_on: bool, warmup: "LrWarmup | None" = None,
                 radius: "RadiusFromRetainRule | None" = None, weight_decay: float = 0.0, lr_scale: float = 1.0):
        self.cycle, self.rounds, self.kept_rank, self.bound_on, self.warmup = cycle, rounds, kept_rank, bound_on, warmup
        self.radius, self.weight_decay, self.lr_scale = radius, weight_decay, lr_scale
        self.stopped = False
        self.restarts: list[dict] = []
        self.ended: str | None = None  # why the fit stopped short of its rounds (a round that kept nothing new)
        self._last_rank: list | None = None  # the kept rank at the end of the last round (None: none kept)

    @property
    def round(self) -> int:
        """The round the fit is in: one more than the rounds begun after the first."""
        return 1 + len(self.restarts)

    def state_dict(self) -> dict:
        return {"stopped": self.stopped, "restarts": self.restarts, "ended": self.ended, "last_rank": self._last_rank}

    def load_state_dict(self, state_dict: dict) -> None:
        self.stopped, self.restarts = bool(state_dict["stopped"]), list(state_dict["restarts"])
        self.ended, self._last_rank = state_dict.get("ended"), state_dict.get("last_rank")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.round = self.round
        if self.stopped:
            trainer.should_stop = True

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        epoch = trainer.current_epoch + 1
        if trainer.sanity_checking or epoch % self.cycle or epoch >= self.cycle * self.rounds:
            return
        rank = self.kept_rank()
        if goal_met(rank, self.bound_on):
            trainer.should_stop = self.stopped = True
            return
        why = "no epoch qualified" if rank is None else \
            f"kept epoch: {rank[1]:g} exposed, {rank[2]:g} not proven at gamma, below the radius: {bool(rank[0])}"
        if self.round > 1 and (None if rank is None else list(rank)) == self._last_rank:
            self._end(trainer, f"round {self.round} kept no epoch better than the rounds before it ({why}): another "
                               "cycle would start again from where this one began")
            return
        self._last_rank = None if rank is None else list(rank)
        if self.radius is not None and (rank is None or bool(rank[0])) and not self.radius.held:
            self.radius.hold(pl_module, ramp=self.cycle // 4)
            why += f"; the radius held at the full training radius from now on (a ramp of {self.radius.ramp} epochs)"
        self.restarts.append({"epoch": epoch, "round": self.round + 1, "why": why})
        pl_module.round = self.round
        top = self.lr_scale ** (self.round - 1)  # the cosine's recursive step scales with the group's rate
        for config in trainer.lr_scheduler_configs:  # at the cycle's top again: the epoch's own step() that
            config.scheduler.last_epoch = 0        # follows gives the rate of the cycle's second epoch
            for group in config.scheduler.optimizer.param_groups:
                group["lr"] = group.get("initial_lr", group["lr"]) * top
        if self.weight_decay:  # (saved with the optimizer's state: a resumed later round keeps it)
            for optimizer in trainer.optimizers:
                for group in optimizer.param_groups:
                    group["weight_decay"] = self.weight_decay
        if self.warmup is not None:
            self.warmup.origin = trainer.global_step
        if trainer.global_rank == 0:
            log.info("robust Alg 1: round %d of %d ends at epoch %d short of the goal (%s): round %d, the schedule "
                     "restarted, the bound term on every unproven image", self.round - 1, self.rounds, epoch, why,
                     self.round)


    def _end(self, trainer: L.Trainer, why: str) -> None:
        trainer.should_stop = self.stopped = True
        self.ended = why
        if trainer.global_rank == 0:
            log.info("robust Alg 1: the fit ends after round %d of %d: %s", self.round, self.rounds, why)


def check_method_callbacks(callbacks: dict[str, Part | None] | None) -> None:
    missing = [name for name in METHOD_CALLBACKS if not callbacks or callbacks.get(name) is None]
    if missing:
        raise TTPUserError(f"callbacks.{missing[0]} is missing; Alg 1 needs callbacks.best_model, .history and "
                           f".timer (conf/callbacks/default.yaml)")


def method_callbacks(callbacks: dict[str, Part | None]) -> dict:
    """Alg 1's callbacks from the `callbacks` group: `best_model` (a partial: call it with the thresholds),
    `history` and `timer`, fresh objects for each fit."""
    check_method_callbacks(callbacks)
    return {name: callbacks[name].build() for name in METHOD_CALLBACKS}


