"""Runs Alg 1 on a copy of the pretrained model with constrained early stopping (also the warm-up of the
certified learners)."""

import copy
import logging
import math
from dataclasses import dataclass, replace

from lightning.pytorch.utilities import rank_zero_only
from torch import nn

from ttp_lightning.alg1.adversary import targets_pretrained
from ttp_lightning.alg1.callbacks import (
    LrBackoff,
    LrWarmup,
    RadiusFromRetainRule,
    Rounds,
    check_method_callbacks,
    method_callbacks,
)
from ttp_lightning.alg1.module import ParetoFinetuneModule
from ttp_lightning.alg1.schema import RADIUS_RUNGS, AdversarialSettings, EarlyStoppingSchema, ParetoSchema
from ttp_lightning.assess.evaluation import evaluate
from ttp_lightning.bounds.propagate import UnsupportedLayer
from ttp_lightning.bounds.uniformity import proven_conf_dist
from ttp_lightning.config.schema import MainSchema, TrainingSchema
from ttp_lightning.core.batching import ImageBatchDataset
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.core.inference import accuracy, predictions
from ttp_lightning.data.datamodule import TTPDataModule
from ttp_lightning.fit.training import RunContext, TrainedBy, fit
from ttp_lightning.methods.base import Method
from ttp_lightning.methods.output import MethodOutput
from ttp_lightning.models.optim import optimizer_settings

log = logging.getLogger(__name__)


class Pareto(Method):
    """Alg 1 (method=pareto), and robust Alg 1 (method=pareto_robust: the same class with `adversarial`)."""

    def check(self, settings: MainSchema) -> None:
        """What Alg 1's own schema (alg1/schema.ParetoSchema, which checks its values and their combinations)
        cannot see: the callbacks Alg 1 reads back, which the run's other settings name."""
        check_method_callbacks(settings.callbacks)

    def hold_out(self, datamodule: TTPDataModule, pretrains: bool) -> None:
        """Where this run trains A(D) itself and the retain rule would read a slice of the retain set
        (retain_holdout auto or a fraction, no val/ folder), the slice leaves D before pretraining
        (TTPDataModule.withhold): A(D) trained on a slice memorises it, and a rule reading it saw less than the
        test split lost (digits: the slice read 0.56 points of cost where the test split lost 2.04). A provider's
        checkpoint has seen its data: there the slice stays a part of the retain set, held out from finetuning
        only, and tau_r is relative to A(D)'s test accuracy."""
        stopping = self.settings.early_stopping
        if not pretrains or not stopping.enabled or len(datamodule.val_labels):
            return
        fraction = 0.0 if stopping.retain_holdout == "val" else \
            holdout_fraction(stopping.retain_holdout, len(datamodule.retain_indices))
        if fraction > 0:
            datamodule.withhold(fraction)

    def run(self, ctx: RunContext, pretrained: nn.Module, datamodule: TTPDataModule, make_net) -> MethodOutput:
        cfg = self.settings
        return finetune(ctx, copy.deepcopy(pretrained), datamodule, cfg, cfg.epochs,
                        cfg.early_stopping if cfg.early_stopping.enabled else None, label="alg1")


INTERVAL_WEIGHT_AUTO = 0.1  # interval_weight=auto on a network the bound term helps (docs/robust-measured.md)


def resolve_interval_weight(adversarial: AdversarialSettings | None, net: nn.Module,
                            forget: ImageBatchDataset) -> AdversarialSettings | None:
    """interval_weight=auto for `net` (its first forget image probes the bound): INTERVAL_WEIGHT_AUTO, or 0 (the
    bound term off) on a network with a BatchNorm layer (interval bounds through BatchNorm's running statistics proved
    nothing on any such ResNet measured, even at 1/255, and the term flattened them) or with a layer the
    interval bound has no rule for."""
    if adversarial is None or adversarial.interval_weight != "auto":
        return adversarial
    bounded = not any(isinstance(module, nn.modules.batchnorm._BatchNorm) for module in net.modules())
    if bounded:
        try:
            proven_conf_dist(net, forget[[0]][0], adversarial.gamma)
        except UnsupportedLayer:
            bounded = False
    weight = INTERVAL_WEIGHT_AUTO if bounded else 0.0
    how = f"{weight}, the bound term on the {adversarial.interval_focus} forget images" if bounded else \
        "0, the bound term off (BatchNorm, or a layer the interval bound has no rule for)"
    log.info("method.adversarial.interval_weight=auto: %s", how)
    return replace(adversarial, interval_weight=weight)


# early_stopping.criterion: the forget CD an epoch must keep below conf_dist_below; select: what ranks the
# qualifying epochs (lowest CD, or highest retain accuracy). The attacked ones are robust Alg 1's (validation APGD).
CRITERIA = {"worst": "val/forget_worst_conf_dist", "mean": "val/forget_conf_dist",
            "worst_attacked": "val/forget_robust_worst_conf_dist", "mean_attacked": "val/forget_robust_conf_dist"}
SELECTIONS = {"conf_dist": "val/forget_conf_dist", "robust_conf_dist": "val/forget_robust_conf_dist",
              "retain_acc": "val/retain_acc", "proven": "val/forget_robust_conf_dist"}
PROVEN_RULE = ("trained at the radius judged first, then fewest images above the gate's threshold under attack, "
                  "then fewest not proven below it by the interval bound, then the lowest proven worst CD (all "
                  "proven) or attacked mean CD")


def proven_rank(metrics) -> tuple[float, float, float, float]:
    """select=proven (robust Alg 1): a release is judged by its worst image, and a proof outranks an attack.
    Among the qualifying epochs keep one trained at the radius the release is judged at (an epoch the radius rule
    trained below it fails the gate whatever its numbers), then the one with the fewest forget images the
    validation attack takes above the gate's threshold, then the fewest the interval bound does not prove below it
    at gamma, then, where every image is proven, the lowest proven worst CD (the strongest proof), else the lowest
    attacked mean CD. On a network whose interval bound proves nothing (a BatchNorm ResNet) the third key ties and
    this is the attacked rule."""
    unproven = metrics.get("val/forget_unproven", math.inf)  # not counted (no threshold): not proven
    last = metrics["val/forget_proven_worst_conf_dist"] if unproven == 0 else metrics["val/forget_robust_conf_dist"]
    return metrics.get("val/below_radius", 0.0), metrics.get("val/forget_robust_exposed", 0.0), unproven, last


def retain_threshold(start_retain_acc: float, stopping: EarlyStoppingSchema) -> float:
    """tau_r: `retain_acc_at_least`, raised to (the starting model's retain accuracy minus
    `retain_acc_drop_at_most`) when that is set, a threshold that carries to data sets of any difficulty."""
    threshold = float(stopping.retain_acc_at_least)
    drop = stopping.retain_acc_drop_at_most
    if drop is not None:
        threshold = max(threshold, start_retain_acc - float(drop))
    return threshold


HOLDOUT_PART = "retain_holdout"  # the validation part of the held-out slice (val/retain_holdout_acc)


@dataclass(frozen=True)
class RetainParts:
    """Where Alg 1 trains and where its retain rule is measured. Without a holdout (the paper) both are the
    retain set; with early_stopping.retain_holdout a seeded slice of it is held out from finetuning and early
    stopping and lr_backoffs read its accuracy (val/retain_holdout_acc): finetuning overfits the images it
    trains on, and their accuracy cannot see it (robust Alg 1's radius rule reads the same: radius_rule)."""

    fit: ImageBatchDataset
    fit_augmented: ImageBatchDataset | None
    holdout: ImageBatchDataset | None
    eval_parts: list[str]
    key: str
    source: str = "none"  # none | slice (of the retain set) | val (the user's own val/ folder, outside D) |
    # withheld (a slice of the retain set taken out of D before pretraining: Pareto.hold_out)

    def start_accuracy(self, net: nn.Module, datamodule: TTPDataModule) -> float:
        """What tau_r is relative to: without a holdout, the starting model's accuracy on the retain set. With
        one, its accuracy on images it never trained on: the test split's where the data has one, else the
        slice's. The starting model trained on the slice too, and its accuracy there is memorised: measured on
        a noisy MNIST stand-in, the slice's accuracy fell from A(D)'s 89.3 % to the test accuracy's level within
        two epochs and then tracked it to within 0.5 points for 100 epochs (77.4 against 77.3 %), while the
        accuracy on the retain images trained on rose to 96.9 %. Epochs are still judged on the slice alone;
        the test split gives the rule one number, the starting model's, before finetuning begins."""
        if self.holdout is None:
            return evaluate(net, datamodule)["retain_acc"]
        unseen = datamodule.dataset("test") if self.reference(datamodule) == "test" else self.holdout
        return accuracy(net, unseen)

    def reference(self, datamodule: TTPDataModule) -> str:
        """Where start_accuracy reads A(D): the validation images themselves (the user's val/ folder or the
        images withheld from D: A(D) never trained on them, and the test split stays unread by every rule),
        else the test split where there is one, else the slice."""
        if self.source in ("val", "withheld"):
            return "val"
        return "test" if len(datamodule.test_labels) else HOLDOUT_PART

    def val_dataloaders(self, datamodule: TTPDataModule) -> list:
        extra = [] if self.holdout is None else [datamodule.eval_loader(self.holdout)]
        return datamodule.val_dataloader() + extra


HOLDOUT_IMAGES, HOLDOUT_SHARE = 2000, 0.2  # retain_holdout=auto: holdout_fraction


def holdout_fraction(setting, retain_size: int) -> float:
    """early_stopping.retain_holdout as a fraction of the retain set. auto: enough images to read an accuracy
    near 95 % to about half a point (one standard error sqrt(0.95 x 0.05 / n) is 0.49 points at n = 2,000), and
    never more than a fifth of the retain set, which finetuning still trains on (MNIST: 2,000 of 59,900; a
    10,000-image set: 2,000; digits: 280 of 1,400, read to about 1.3 points)."""
    if setting != "auto":
        return float(setting)
    return min(HOLDOUT_SHARE, HOLDOUT_IMAGES / max(retain_size, 1))


def retain_parts(datamodule: TTPDataModule, stopping: EarlyStoppingSchema | None) -> RetainParts:
    """Where finetuning trains and where the retain rule reads accuracy (early_stopping.retain_holdout): auto
    reads the user's own validation images (an image folder's val/) where there are any, finetuning on the
    whole retain set, else a seeded slice of the retain set by holdout_fraction's rule; val requires them; a
    fraction is that slice; 0 the retain set itself (the paper). Where Pareto.hold_out took the slice out of D
    before pretraining (auto or a fraction), it is the validation part, read the same way as val/."""
    setting = "off" if stopping is None else stopping.retain_holdout
    has_val = len(datamodule.val_labels) > 0
    withheld = datamodule.val_source == "withheld" and setting != "off"
    if setting == "val" and not has_val:
        raise TTPUserError("method.early_stopping.retain_holdout=val needs validation images, "
                           "<data.root>/val/<class>/<image> (data=imagefolder); this data set has none: choose "
                           "auto (a held-out slice of the retain set) or a fraction")
    if setting == "val" or (setting == "auto" and has_val) or withheld:
        return RetainParts(datamodule.dataset("retain"), datamodule.dataset("retain", augment=True),
                           datamodule.dataset("val"), [*datamodule.eval_parts(), HOLDOUT_PART],
                           f"val/{HOLDOUT_PART}_acc", source="val" if datamodule.val_source == "folder" else "withheld")
    fraction = 0.0 if setting == "off" else holdout_fraction(setting, len(datamodule.retain_indices))
    if fraction <= 0:
        return RetainParts(datamodule.dataset("retain"), None, None, datamodule.eval_parts(), "val/retain_acc")
    fit_indices, holdout_indices = datamodule.retain_split(fraction)
    return RetainParts(datamodule.subset(fit_indices), datamodule.subset(fit_indices, augment=True),
                       datamodule.subset(holdout_indices), [*datamodule.eval_parts(), HOLDOUT_PART],
                       f"val/{HOLDOUT_PART}_acc", source="slice")


def ordered_callbacks(history, timer, best, backoff, radius) -> list:
    """Alg 1's callbacks in the order Lightning runs them at each epoch's end: the best-epoch keeper reads the
    weights the epoch's metrics were measured on before LrBackoff can put the starting weights back (in the
    other order an epoch that lost its accuracy was recorded with its own metrics and the starting weights, and
    a fallback to it released A(D) under that epoch's numbers)."""
    return [callback for callback in (history, timer, best, backoff, radius) if callback is not None]


def radius_rule(parts: RetainParts, best, adversarial: AdversarialSettings) -> RadiusFromRetainRule:
    """radius_rule=retain trades the training radius for accuracy, so it reads the accuracy early stopping reads
    (the held-out slice where there is one, against the same tau_r): every rule that spends accuracy reads it on
    images finetuning does not train on, where overfitting shows (issue 61)."""
    return RadiusFromRetainRule(best.retain_acc_at_least, RADIUS_RUNGS, retain_key=parts.key,
                                start=adversarial.radius_start)


def attack_targets(net: nn.Module, datamodule: TTPDataModule, adversarial: AdversarialSettings | None):
    """The class an attacker wants back for each forget image: the starting model's prediction, which the
    judge's attack targets and which the inner attack's ce_pretrained and early stopping's attacks target too
    (on the noisy-MNIST stand-in A(D) got 13 of the 100 forget labels wrong and 7 of those were among the 16
    images the judge exposed when training targeted the labels); None without robust Alg 1. Computed before
    the fit, so `net` is the starting model even when the fit resumes from a checkpoint."""
    return None if adversarial is None else predictions(net, datamodule.dataset("forget"))


def attack_targeted_forget(datamodule: TTPDataModule, adversarial: AdversarialSettings | None,
                           targets) -> ImageBatchDataset | None:
    """The forget images' training view labelled with `targets`, for the inner attack's ce_pretrained; None
    (the forget images with their labels) without that objective."""
    if targets is None or not targets_pretrained(adversarial):
        return None
    return datamodule.dataset("forget", augment=True).relabelled(targets)


def finetune(ctx: RunContext, net: nn.Module, datamodule: TTPDataModule, cfg: ParetoSchema | TrainingSchema,
             epochs: int, stopping: EarlyStoppingSchema | None, label: str) -> MethodOutput:
    """Alg 1 on `net` in place with the Alg 1 settings in `cfg` (Alg 1's, or the certified learners' for
    their warm-up, which has neither `adversarial` nor Alg 1's refinements); `stopping=None` keeps the last epoch;
    `label` names the fit's checkpoints (resumable, see fit/checkpointing.py).
    With `cfg.adversarial` (method=pareto_robust) the uniformity term is robust and early stopping watches
    the forget CD under attack."""
    if getattr(cfg, "adversarial", None) and not isinstance(cfg, ParetoSchema):
        raise TypeError(f"robust Alg 1 needs its settings typed (ParetoSchema), not {type(cfg).__name__}")
    adversarial = cfg.robust() if isinstance(cfg, ParetoSchema) else None
    adversarial = resolve_interval_weight(adversarial, net, datamodule.dataset("forget"))
    parts = retain_parts(datamodule, stopping)
    targets = attack_targets(net, datamodule, adversarial)
    module = finetune_module(ctx, net, datamodule, cfg, parts, adversarial, targets)
    made = method_callbacks(ctx.fit_settings.callbacks)
    history, timer = made["history"], made["timer"]
    backoffs = int(cfg.lr_backoffs or 0)
    start_retain_acc = parts.start_accuracy(net, datamodule) if stopping is not None or backoffs else None
    best = best_model(made["best_model"], stopping, start_retain_acc, parts, adversarial)
    if best is not None and str(stopping.select) == "proven":  # the judge re-attacks only epochs that could be kept
        module.kept_rank = best.kept_rank
    backoff = LrBackoff((start_retain_acc + 1 / datamodule.info.num_classes) / 2, backoffs, retain_key=parts.key) \
        if backoffs else None
    radius = radius_rule(parts, best, adversarial) \
        if best is not None and adversarial is not None and adversarial.radius_rule == "retain" else None
    callbacks = ordered_callbacks(history, timer, best, backoff, radius)
    cycles = adversarial.rounds if adversarial is not None and best is not None else 1
    warmup = LrWarmup(cfg.lr_warmup, cycles) if getattr(cfg, "lr_warmup", 0) != 0 else None  # none: certified's
    callbacks += [warmup] if warmup is not None else []
    rounds = add_rounds(callbacks, module, best, adversarial, epochs, cycles, warmup, radius)
    if cfg.mode == "fullbatch":
        train_loader = [0]  # one optimizer step per epoch; the module reads both sets itself
    else:
        forget = attack_targeted_forget(datamodule, adversarial, targets)
        train_loader = datamodule.pareto_dataloader(parts.fit_augmented, forget)
    wall = fit(ctx, module, epochs * cycles, "Alg 1 finetuning" if label == "alg1" else f"Alg 1 {label}", key=ctx.key_for(label), callbacks=callbacks,
               trained_by=TrainedBy(f"method {cfg.name}", "method", float(cfg.lr)), train_dataloaders=train_loader,
               val_dataloaders=parts.val_dataloaders(datamodule))
    summary, best_row = kept_summary(best, history, parts, radius, datamodule, adversarial, wall)
    summary.update(retain_rule_record(best, parts, start_retain_acc, stopping))
    metrics = {
        **summary,
        "epochs_run": len(history.rows),
        "wall_s": round(wall, 3),
        "wall_to_best_s": best_row["elapsed_s"],
        **{k: v for k, v in timer.summary().items() if k in ("train_steps", "train_steps_per_s", "train_images_per_s")},
        **({"lr_backoffs": backoff.backoffs} if backoff else {}),
        **({"rounds_run": rounds.round, "rounds": rounds.restarts} if rounds else {}),
    }
    return MethodOutput(module.net, metrics, history.rows)


def add_rounds(callbacks: list, module, best, adversarial, epochs: int, cycles: int, warmup,
               radius=None) -> Rounds | None:
    """adversarial.rounds above 1: the Rounds controller, after early stopping's keeper, whose rank it reads at a
    cycle's end (and which holds the radius rule's full radius after a round below it), and the schedule's cycle
    set to `epochs`; None for one round."""
    if cycles <= 1:
        return None
    module.schedule_epochs = epochs
    rounds = Rounds(epochs, cycles, best.kept_rank, float(adversarial.interval_weight) > 0, warmup, radius)
    callbacks.insert(callbacks.index(best) + 1, rounds)
    return rounds


def kept_summary(best, history, parts: RetainParts, radius, datamodule: TTPDataModule,
                 adversarial: AdversarialSettings | None, wall: float) -> tuple[dict, dict]:
    """(results.json's account of the kept epoch, its history row): the stopping rule, robust Alg 1's radius and
    the kept epoch's accuracy where finetuning trained and where the retain rule read it."""
    summary = stopping_summary(best, history, parts, radius, datamodule)
    best_row = history.rows[summary["best_epoch"] - 1] if history.rows else {"elapsed_s": wall}
    summary.update(robust_summary(adversarial, best_row))
    if parts.holdout is not None and "retain_holdout_acc" in best_row:
        inside = len(parts.holdout) if parts.source == "slice" else 0  # val/ is outside the retain set
        summary.update(accuracy_split(best_row, len(datamodule.retain_indices), inside))
        if rank_zero_only.rank == 0:
            where = {"withheld": "withheld from D", "val": "in val/"}.get(parts.source, "held out")
            log.info("kept epoch %d: retain accuracy %.2f%% trained on, %.2f%% on %d %s", summary["best_epoch"],
                     100 * summary["retain_fit_acc"], 100 * summary["retain_holdout_acc"], len(parts.holdout), where)
    return summary, best_row


def retain_rule_record(best, parts: RetainParts, start_retain_acc: float | None,
                       stopping: EarlyStoppingSchema | None) -> dict:
    """What the retain rule read (the history's key), the accuracy it is relative to and the budget it spends
    (results.json; the frontier of a refused robust release reads them); nothing without early stopping."""
    if best is None or start_retain_acc is None:
        return {}
    return {"retain_rule_reads": parts.key.removeprefix("val/"), "retain_rule_start_acc": round(start_retain_acc, 6),
            "retain_acc_drop_at_most": stopping.retain_acc_drop_at_most}


def accuracy_split(row: dict, retain_size: int, holdout_size: int) -> dict:
    """The kept epoch's accuracy on the retain images finetuning trained on and on the held-out images it never
    trained on (results.json and the card show them beside the test accuracy), the first from the whole retain
    set's and the slice's correct counts (exact sums, under DDP too); `holdout_size` 0 where the held-out
    images are not part of the retain set (the user's val/ folder)."""
    correct = row["retain_acc"] * retain_size - row["retain_holdout_acc"] * holdout_size
    return {"retain_fit_acc": round(correct / (retain_size - holdout_size), 6),
            "retain_holdout_acc": round(row["retain_holdout_acc"], 6)}


def robust_summary(adversarial: AdversarialSettings | None, best_row: dict) -> dict:
    """Robust Alg 1's settings as the kept epoch used them: its training radius, the radius before the radius rule
    and the bound term's weight (interval_weight=auto resolved); nothing for plain Alg 1."""
    if adversarial is None or "train_gamma" not in best_row:
        return {}
    return {"train_gamma_kept": round(float(best_row["train_gamma"]), 4),
            "train_gamma_target": float(adversarial.training_gamma),
            "interval_weight": float(adversarial.interval_weight)}


def finetune_module(ctx: RunContext, net: nn.Module, datamodule: TTPDataModule, cfg: ParetoSchema | TrainingSchema,
                    parts: RetainParts, adversarial, targets) -> ParetoFinetuneModule:
    """Alg 1's LightningModule with the method's settings (the certified warm-up leaves Alg 1's refinements unset)."""
    return ParetoFinetuneModule(
        net, cfg.theta, optimizer_settings(cfg, ctx.fit_settings.fused_policy()), mode=cfg.mode,
        uniformity=cfg.uniformity, forget_temperature=cfg.forget_temperature, gradient_surgery=cfg.gradient_surgery,
        chunk_size=cfg.chunk_size, retain_data=parts.fit,
        forget_data=datamodule.dataset("forget"), eval_parts=parts.eval_parts, adversarial=adversarial,
        joint_forward=bool(cfg.joint_forward), exposed_above=ctx.fit_settings.exposed_above,
        forget_reduction=str(cfg.forget_reduction or "mean"),  # unset (null) for the certified warm-up
        forget_cvar_fraction=float(cfg.forget_cvar_fraction or 0.2),
        forget_reduction_temperature=cfg.forget_reduction_temperature,
        forget_batchnorm=str(cfg.forget_batchnorm or "train"),
        retain_batchnorm=str(cfg.retain_batchnorm or "train"), attack_targets=targets,
    )


def best_model(make, stopping: EarlyStoppingSchema | None, start_retain_acc: float | None, parts: RetainParts,
               adversarial):
    """Early stopping's callback (`make`: the callbacks group's class), or None when early stopping is off."""
    if stopping is None:
        return None
    select = str(stopping.select)
    return make(
        conf_dist_below=math.inf if stopping.conf_dist_below is None else stopping.conf_dist_below,
        retain_acc_at_least=retain_threshold(start_retain_acc, stopping), patience=stopping.patience,
        fallback=stopping.fallback, conf_dist_key=CRITERIA[str(stopping.criterion)], retain_acc_key=parts.key,
        rank_key=SELECTIONS[select], rank_higher_is_better=select == "retain_acc",
        **({"rank": proven_rank, "rank_rule": PROVEN_RULE} if select == "proven" else {}),
        mean_conf_dist_key=SELECTIONS["robust_conf_dist" if adversarial else "conf_dist"],
    )


def stopping_summary(best, history, parts: RetainParts, radius, datamodule: TTPDataModule) -> dict:
    """results.json's account of which epoch was kept and by which rule."""
    summary = best.summary() if best else {"best_epoch": len(history.rows), "constraint_met": None,
                                           "selection_rule": "early stopping off: the last epoch"}
    if best is None:
        return summary
    summary["retain_acc_threshold"] = round(best.retain_acc_at_least, 6)
    summary["stopping_rule"] = (f"{best.conf_dist_key.removeprefix('val/')} < {best.conf_dist_below:g} and "
                                f"{parts.key.removeprefix('val/')} >= {best.retain_acc_at_least:.4f}")
    if radius is not None:
        summary["radius_rule_threshold"] = round(radius.threshold, 6)  # on the accuracy early stopping reads
    if parts.holdout is not None:  # tau_r's reference: the starting model's accuracy on unseen images
        summary["retain_holdout_size"] = len(parts.holdout)
        summary["retain_holdout_source"] = parts.source
        summary["retain_reference"] = parts.reference(datamodule)
    if not summary["constraint_met"] and rank_zero_only.rank == 0:  # every DDP rank knows; one says so
        log.warning("no epoch of Alg 1 met the stopping thresholds (%s < %g, retain accuracy >= %.4f); "
                    "kept epoch %d: %s", best.conf_dist_key.removeprefix("val/"), best.conf_dist_below,
                    best.retain_acc_at_least, summary["best_epoch"], summary["selection_rule"])
    return summary
