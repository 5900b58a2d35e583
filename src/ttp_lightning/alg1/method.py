"""Runs Alg 1 on a copy of the pretrained model with constrained early stopping (also the warm-up of the
certified learners)."""

import copy
import hashlib
import logging
import math
from dataclasses import dataclass, replace

import torch
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
from ttp_lightning.assess.confirmation import (
    ConfirmedCost,
    SelectedCost,
    bound_selected,
    confirm_against_reference,
    confirm_paired,
)
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


INTERVAL_WEIGHT_AUTO = 0.1  # interval_weight=auto on a network the bound term helps (docs/robust-defaults.md)


def trained_for_bound(ctx: RunContext) -> bool:
    """A(D) came from certified pretraining here (`pretrain.certified.gamma` > 0 and no provider's checkpoint)."""
    model = ctx.fit_settings.model
    return ctx.fit_settings.pretrain.certified.enabled and not (model is not None and model.get("checkpoint"))


def resolve_interval_weight(adversarial: AdversarialSettings | None, net: nn.Module,
                            forget: ImageBatchDataset, trained_for_bound: bool = False) -> AdversarialSettings | None:
    """interval_weight=auto for `net` (its first forget image probes the bound): INTERVAL_WEIGHT_AUTO, or 0 (the
    bound term off) on a network with a BatchNorm layer that was not trained for the bound (interval bounds through
    BatchNorm's running statistics proved nothing on any naturally trained ResNet measured, even at 1/255, and the
    term flattened them; `trained_for_bound`: A(D) came from certified pretraining, whose bound runs through
    BatchNorm) or with a layer the interval bound has no rule for."""
    if adversarial is None or adversarial.interval_weight != "auto":
        return adversarial
    bounded = trained_for_bound or \
        not any(isinstance(module, nn.modules.batchnorm._BatchNorm) for module in net.modules())
    if bounded:
        try:
            proven_conf_dist(net, forget[[0]][0], adversarial.gamma)
        except UnsupportedLayer:
            bounded = False
    weight = INTERVAL_WEIGHT_AUTO if bounded else 0.0
    how = f"{weight}, the bound term on the {adversarial.interval_focus} forget images" if bounded else \
        "0, the bound term off (BatchNorm not trained for the bound, or a layer the interval bound has no rule for)"
    log.info("method.adversarial.interval_weight=auto: %s", how)
    return replace(adversarial, interval_weight=weight)


# early_stopping.criterion: the forget CD an epoch must keep below conf_dist_below; select: what ranks the
# qualifying epochs (lowest CD, or highest retain accuracy). The attacked ones are robust Alg 1's (validation APGD).
CRITERIA = {"worst": "val/forget_worst_conf_dist", "mean": "val/forget_conf_dist",
            "worst_attacked": "val/forget_robust_worst_conf_dist", "mean_attacked": "val/forget_robust_conf_dist"}
SELECTIONS = {"conf_dist": "val/forget_conf_dist", "robust_conf_dist": "val/forget_robust_conf_dist",
              "retain_acc": "val/retain_acc", "proven": "val/forget_robust_conf_dist"}
PROVEN_RULE = ("trained at the radius judged (or every image proven there) first, then fewest images above the "
               "gate's threshold under attack, then fewest not proven below it by the interval bound, then the "
               "lowest proven worst CD (all proven) or attacked mean CD")


def proven_rank(metrics) -> tuple[float, float, float, float]:
    """select=proven (robust Alg 1): a release is judged by its worst image, and a proof outranks an attack.
    Among the qualifying epochs keep one trained at the radius the release is judged at or with every image proven
    there (val/below_radius: an epoch the radius rule trained below it fails the gate unless the bound proves
    every image, since a proof holds whatever radius trained), then the one with the fewest forget images the
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
CONFIRM_PART = "retain_confirm"  # its confirmation half (val/retain_confirm_acc): logged, never read by a rule


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
    confirm: ImageBatchDataset | None = None  # the held-out images' confirmation half (split_for_confirmation):
    # the kept epoch's cost is read there once (assess/confirmation.py); every epoch logs its accuracy there, which
    # no rule reads

    def with_confirmation(self, budget: float | None) -> "RetainParts":
        """The same parts with the held-out images split in two (split_for_confirmation): the rules read the
        selection half (`holdout`), the cost is confirmed on the other (`confirm`); unsplit where a half could
        not resolve the budget (`budget`: retain_acc_drop_at_most, a share)."""
        if self.holdout is None:
            return self
        select, confirm = split_for_confirmation(self.holdout, budget)
        if confirm is None:
            return self
        return replace(self, holdout=select, confirm=confirm, eval_parts=[*self.eval_parts, CONFIRM_PART])

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
        extra = [datamodule.eval_loader(part) for part in (self.holdout, self.confirm) if part is not None]
        return datamodule.val_dataloader() + extra

    def selection_reference(self, net: nn.Module, datamodule: TTPDataModule) -> list[bool] | None:
        """A(D)'s correctness on each held-out image the rule reads, read before the fit, where they were too few
        to split and A(D) never trained on them (withheld from D, or the user's val/); None otherwise."""
        if self.holdout is None or self.confirm is not None or self.reference(datamodule) != "val":
            return None
        return correct_each(net, self.holdout)

    def confirm_reference(self, net: nn.Module, datamodule: TTPDataModule) -> "ConfirmReference | None":
        """What the kept epoch's confirmed cost is relative to, read from the starting model `net` before the
        fit: each confirmation image's correctness under A(D) where A(D) never trained on them (or, for a slice
        of a data set without a test split, the memorised images themselves: a cost read against them is
        overstated), else A(D)'s accuracy on the test split; None without confirmation images."""
        if self.confirm is None:
            return None
        if self.reference(datamodule) == "test":
            test = datamodule.dataset("test")
            return ConfirmReference(None, accuracy(net, test), len(test))
        return ConfirmReference(correct_each(net, self.confirm), None, None)


@dataclass(frozen=True)
class ConfirmReference:
    """A(D) on the confirmation images (`right`, per image) or on the test split (`acc` of `images`)."""

    right: list[bool] | None
    acc: float | None
    images: int | None

    def confirm(self, kept: nn.Module, confirm: ImageBatchDataset, stopping: EarlyStoppingSchema) -> ConfirmedCost:
        """The kept weights' cost on the confirmation images against this reference (assess/confirmation.py)."""
        kept_right = correct_each(kept, confirm)
        at_least, drop = float(stopping.retain_acc_at_least), stopping.retain_acc_drop_at_most
        if self.right is not None:
            return confirm_paired(self.right, kept_right, at_least, drop)
        return confirm_against_reference(kept_right, self.acc, self.images, at_least, drop)


def correct_each(net: nn.Module, dataset: ImageBatchDataset) -> list[bool]:
    """Whether `net` classifies each image of `dataset` right, in order (eval mode, this process alone)."""
    _, labels = dataset.everything()
    return (predictions(net, dataset) == labels.cpu()).tolist()


# retain_holdout=auto: holdout_fraction. Each half (selection, confirmation) gets up to HOLDOUT_IMAGES.
HOLDOUT_IMAGES, HOLDOUT_SHARE = 2000, 0.2


def holdout_fraction(setting, retain_size: int) -> float:
    """early_stopping.retain_holdout as a fraction of the retain set. auto: two halves (the rules select on one,
    the cost is confirmed on the other: split_for_confirmation), each enough images to read an accuracy near
    95 % to about half a point (one standard error sqrt(0.95 x 0.05 / n) is 0.49 points at n = 2,000), and never
    more than a fifth of the retain set in all, which finetuning still trains on (MNIST: 4,000 of 59,900; a
    10,000-image set: 2,000, two halves of 1,000; digits: 248 of 1,238, two halves of 124, each read to about 2
    points)."""
    if setting != "auto":
        return float(setting)
    return min(HOLDOUT_SHARE, 2 * HOLDOUT_IMAGES / max(retain_size, 1))


# a half is split off for confirmation only where the budget is at least this many of its images: on fewer, one
# image is a large share of the budget (digits: 124 images a half, one image 0.81 of a 1-point budget) and the
# rule on the half refused the default job, which on all 248 images kept an epoch 2 images (0.81 points) down
BUDGET_IMAGES = 5


def split_for_confirmation(holdout: ImageBatchDataset, budget: float | None = None) \
        -> tuple[ImageBatchDataset, ImageBatchDataset | None]:
    """(selection, confirmation): the held-out images in two halves by a permutation seeded from the data's seed
    (its own stream: SHA-256 of it), the first (the larger, when the count is odd) for the rules, the second for
    the confirmed cost; (holdout, None), unsplit, with fewer than two images or where the budget (`budget`, a
    share; None: no budget, tau_r absolute) is fewer than BUDGET_IMAGES images of a half (1 point: 500 a half)."""
    count = len(holdout)
    if count < 2 or (budget is not None and (count // 2) * float(budget) < BUDGET_IMAGES - 1e-9):
        return holdout, None
    digest = hashlib.sha256(f"ttp_lightning confirmation {int(holdout.seed)}".encode()).digest()
    order = torch.randperm(count, generator=torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1))
    half = (count + 1) // 2
    return holdout.take(order[:half].sort().values), holdout.take(order[half:].sort().values)


def retain_parts(datamodule: TTPDataModule, stopping: EarlyStoppingSchema | None) -> RetainParts:
    """Where finetuning trains and where the retain rule reads accuracy (early_stopping.retain_holdout): auto
    reads the user's own validation images (an image folder's val/) where there are any, finetuning on the
    whole retain set, else a seeded slice of the retain set by holdout_fraction's rule; val requires them; a
    fraction is that slice; 0 the retain set itself (the paper). Where Pareto.hold_out took the slice out of D
    before pretraining (auto or a fraction), it is the validation part, read the same way as val/."""
    setting = "off" if stopping is None else stopping.retain_holdout
    budget = None if stopping is None else stopping.retain_acc_drop_at_most
    has_val = len(datamodule.val_labels) > 0
    withheld = datamodule.val_source == "withheld" and setting != "off"
    if setting == "val" and not has_val:
        raise TTPUserError("method.early_stopping.retain_holdout=val needs validation images, "
                           "<data.root>/val/<class>/<image> (data=imagefolder); this data set has none: choose "
                           "auto (a held-out slice of the retain set) or a fraction")
    if setting == "val" or (setting == "auto" and has_val) or withheld:
        return RetainParts(datamodule.dataset("retain"), datamodule.dataset("retain", augment=True),
                           datamodule.dataset("val"), [*datamodule.eval_parts(), HOLDOUT_PART],
                           f"val/{HOLDOUT_PART}_acc",
                           source="val" if datamodule.val_source == "folder" else "withheld").with_confirmation(budget)
    fraction = 0.0 if setting == "off" else holdout_fraction(setting, len(datamodule.retain_indices))
    if fraction <= 0:
        return RetainParts(datamodule.dataset("retain"), None, None, datamodule.eval_parts(), "val/retain_acc")
    fit_indices, holdout_indices = datamodule.retain_split(fraction)
    return RetainParts(datamodule.subset(fit_indices), datamodule.subset(fit_indices, augment=True),
                       datamodule.subset(holdout_indices), [*datamodule.eval_parts(), HOLDOUT_PART],
                       f"val/{HOLDOUT_PART}_acc", source="slice").with_confirmation(budget)


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
    bound_trained = trained_for_bound(ctx)
    adversarial = resolve_interval_weight(adversarial, net, datamodule.dataset("forget"), bound_trained)
    parts = retain_parts(datamodule, stopping)
    confirm_from = parts.confirm_reference(net, datamodule)  # A(D) on the confirmation images, before the fit
    select_from = parts.selection_reference(net, datamodule)  # or on the unsplit held-out images
    targets = attack_targets(net, datamodule, adversarial)
    module = finetune_module(ctx, net, datamodule, cfg, parts, adversarial, targets)
    module.bound_from_start = bound_trained
    made = method_callbacks(ctx.fit_settings.callbacks)
    history, timer = made["history"], made["timer"]
    backoffs = int(cfg.lr_backoffs or 0)
    start_retain_acc = parts.start_accuracy(net, datamodule) if stopping is not None or backoffs else None
    best = best_model(made["best_model"], stopping, start_retain_acc, parts, adversarial)
    if best is not None and str(stopping.select) == "proven":  # the judge re-attacks only epochs that could be kept
        module.kept_rank, module.could_qualify = best.kept_rank, best.could_qualify
    backoff = LrBackoff((start_retain_acc + 1 / datamodule.info.num_classes) / 2, backoffs, retain_key=parts.key) \
        if backoffs else None
    radius = radius_rule(parts, best, adversarial) \
        if best is not None and adversarial is not None and adversarial.radius_rule == "retain" else None
    callbacks = ordered_callbacks(history, timer, best, backoff, radius)
    cycles = adversarial.rounds if adversarial is not None and best is not None else 1
    warmup = LrWarmup(cfg.lr_warmup, cycles) if getattr(cfg, "lr_warmup", 0) != 0 else None  # none: certified's
    callbacks += [warmup] if warmup is not None else []
    train_loader, epochs = fit_loader(cfg, datamodule, parts, adversarial, targets, epochs)
    rounds = add_rounds(callbacks, module, best, adversarial, epochs, cycles, warmup, radius)
    wall = fit(ctx, module, epochs * cycles, "Alg 1 finetuning" if label == "alg1" else f"Alg 1 {label}",
               key=ctx.key_for(label), callbacks=callbacks, train_dataloaders=train_loader,
               trained_by=TrainedBy(f"method {cfg.name}", "method", float(cfg.lr)),
               val_dataloaders=parts.val_dataloaders(datamodule))
    summary, best_row = kept_summary(best, history, parts, radius, datamodule, adversarial, wall)
    summary.update(retain_rule_record(best, parts, start_retain_acc, stopping))
    if best is not None:
        compared = Compared(select_from, epochs * cycles, bool(backoff and backoff.backoffs) or radius is not None
                            or rounds is not None)
        summary.update(confirmation_record(confirm_from, module.net, parts, stopping, summary, start_retain_acc,
                                           compared))
    metrics = {**summary, "epochs_run": len(history.rows),
               **({"round_epochs": epochs} if adversarial is not None else {}),
               "wall_s": round(wall, 3), "wall_to_best_s": best_row["elapsed_s"], **fit_counts(timer, backoff, rounds)}
    return MethodOutput(module.net, metrics, history.rows)


def fit_counts(timer, backoff: LrBackoff | None, rounds) -> dict:
    """The fit's step counts and speed, learning-rate backoffs and robust Alg 1's rounds, for results.json."""
    return {
        **{k: v for k, v in timer.summary().items() if k in ("train_steps", "train_steps_per_s", "train_images_per_s")},
        **({"lr_backoffs": backoff.backoffs} if backoff else {}),
        **({"rounds_run": rounds.round, "rounds": rounds.restarts} if rounds else {}),
        **({"rounds_ended": rounds.ended} if rounds and rounds.ended else {}),
    }


def fit_loader(cfg, datamodule: TTPDataModule, parts: RetainParts, adversarial: AdversarialSettings | None,
               targets, epochs: int):
    """The fit's training batches and a cycle's epochs (sized by visits for robust Alg 1, see round_epochs)."""
    if cfg.mode == "fullbatch":
        return [0], epochs  # one optimizer step per epoch; the module reads both sets itself
    forget = attack_targeted_forget(datamodule, adversarial, targets)
    if adversarial is not None and adversarial.inner_start == "persistent":  # batches carry their positions
        forget = (forget if forget is not None else datamodule.dataset("forget", augment=True)).with_positions()
    train_loader = datamodule.pareto_dataloader(parts.fit_augmented, forget)
    steps = max(len(loader) for loader in train_loader.flattened)  # max_size_cycle: the retain loader's
    return train_loader, round_epochs(epochs, adversarial, steps, datamodule.forget_batch_size,
                                      len(datamodule.forget_indices))


@dataclass(frozen=True)
class Compared:
    """What bounds the cost of an epoch kept from many read on the same unsplit held-out images: A(D)'s
    correctness on each (`right`; None where the images were split, or A(D) trained on them), the most epochs the
    fit could compare (`epochs`), and whether the training path read them (`path_read`: a learning-rate back-off
    fired, the radius rule or robust Alg 1's rounds steered it), where no union over one fixed sequence of epochs
    holds (assess/confirmation.py)."""

    right: list[bool] | None
    epochs: int
    path_read: bool

    def bound(self, net: nn.Module, holdout: ImageBatchDataset) -> SelectedCost | None:
        if self.right is None or self.path_read:
            return None
        return bound_selected(self.right, correct_each(net, holdout), self.epochs)


def confirmation_record(confirm_from, net: nn.Module, parts: RetainParts, stopping, summary: dict,
                        start_retain_acc: float | None, compared: Compared) -> dict:
    """The kept epoch's cost read once on the confirmation images (`retain_confirmed`), said on the console;
    or, where the held-out images were too few to split, the console says the cost is not confirmed and, where
    the training path did not read them, bounds it over every epoch compared (`retain_selected`)."""
    if confirm_from is None:
        if parts.holdout is None:
            return {}
        selected = compared.bound(net, parts.holdout)
        if rank_zero_only.rank == 0:
            log.info("kept epoch %d: its cost is not confirmed on images no rule read (read the test split's): "
                     "half of the %d held-out images would hold fewer than %d images of the budget; %s",
                     summary["best_epoch"], len(parts.holdout), BUDGET_IMAGES, selected_words(selected, compared))
        return {"retain_selected": selected.to_json()} if selected is not None else {}
    confirmed = confirm_from.confirm(net, parts.confirm, stopping)
    if rank_zero_only.rank == 0:
        log.info("kept epoch %d: accuracy cost %.2f points on the %d images the retain rule read, %s",
                 summary["best_epoch"], 100 * (start_retain_acc - summary["retain_holdout_acc"]),
                 len(parts.holdout), confirmed_words(confirmed))
    return {"retain_confirmed": confirmed.to_json()}


def round_epochs(epochs: int, adversarial: AdversarialSettings | None, steps_per_epoch: int, forget_batch: int,
                 forget_images: int) -> int:
    """A cycle's length: `epochs`, cut (visits_per_round) to the fewest epochs that visit each forget image that
    many times at `forget_batch` forget images a step. The robust term's cost (the inner attack) and what it
    learns both go with the visits, not with the retain set's size: on MNIST (437 steps an epoch, 44 visits of
    each of 100 forget images) 50 epochs met the goal that 100 met, in half the time; a small retain set (digits,
    letters: a few visits an epoch) keeps `epochs` (docs/robust-budget.md)."""
    if adversarial is None or adversarial.visits_per_round is None or steps_per_epoch < 1 or forget_images < 1:
        return epochs
    per_epoch = steps_per_epoch * forget_batch / forget_images
    cut = min(epochs, max(1, math.ceil(adversarial.visits_per_round / per_epoch)))
    if cut < epochs and rank_zero_only.rank == 0:
        log.info("method.adversarial.visits_per_round=%d: %d epochs a round, not %d (each of the %d forget images "
                 "visited %.0f times an epoch)", adversarial.visits_per_round, cut, epochs, forget_images, per_epoch)
    return cut


def add_rounds(callbacks: list, module, best, adversarial, epochs: int, cycles: int, warmup,
               radius=None) -> Rounds | None:
    """adversarial.rounds above 1: the Rounds controller, after early stopping's keeper, whose rank it reads at a
    cycle's end (and which holds the radius rule's full radius after a round below it), and the schedule's cycle
    set to `epochs`; None for one round."""
    if cycles <= 1:
        return None
    module.schedule_epochs = epochs
    rounds = Rounds(epochs, cycles, best.kept_rank, float(adversarial.interval_weight) > 0, warmup, radius,
                    float(adversarial.later_weight_decay), float(adversarial.later_lr_scale))
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
        summary.update(accuracy_split(best_row, len(datamodule.retain_indices), held_out_of_retain(parts)))
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


def selected_words(selected: SelectedCost | None, compared: Compared) -> str:
    """The unsplit cost's bound in words (the console), or why there is none."""
    if selected is not None:
        return (f"on the {selected.images} it read, {100 * selected.cost:.2f} points, at most "
                f"{100 * selected.cost_upper:.2f} at {selected.confidence:.0%} over the {selected.compared} epochs "
                "it could compare")
    if compared.right is None:
        return "A(D) trained on them, so no paired bound"
    return ("no bound over the epochs compared: the training path read these images (a back-off, the radius rule "
            "or robust Alg 1's rounds)")


def confirmed_words(confirmed: ConfirmedCost) -> str:
    """The confirmed cost in words (the console and the model card)."""
    return (f"{100 * confirmed.cost:.2f} on the {confirmed.images} it did not (confirmed; at most "
            f"{100 * confirmed.cost_upper:.2f} at {confirmed.confidence:.0%})")


def held_out_of_retain(parts: RetainParts) -> dict[str, int]:
    """{history key: images} of the held-out parts that are part of the retain set (a slice of it: the selection
    and confirmation halves); none where they lie outside it (the user's val/ folder, images withheld from D)."""
    if parts.source != "slice":
        return {}
    sizes = {f"{HOLDOUT_PART}_acc": len(parts.holdout)}
    if parts.confirm is not None:
        sizes[f"{CONFIRM_PART}_acc"] = len(parts.confirm)
    return sizes


def accuracy_split(row: dict, retain_size: int, inside: dict[str, int]) -> dict:
    """The kept epoch's accuracy on the retain images finetuning trained on and on the held-out images the rules
    read (results.json and the card show them beside the test accuracy), the first from the whole retain set's
    correct count less the held-out parts' that lie inside it (`inside`: {history key: images}; exact sums, under
    DDP too)."""
    correct = row["retain_acc"] * retain_size - sum(row[key] * size for key, size in inside.items())
    return {"retain_fit_acc": round(correct / (retain_size - sum(inside.values())), 6),
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
