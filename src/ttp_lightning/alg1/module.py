"""Alg 1 (Sec. 3.1): finetune A(D) on theta * L_K(D_f) + (1 - theta) * L_A(D_r); optionally robust, with
L_K evaluated at worst-case perturbations of each forget image (method=pareto_robust)."""

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from ttp_lightning.alg1.adversary import robust_conf_dist, targets_pretrained, worst_forget_images
from ttp_lightning.alg1.schema import AdversarialSettings
from ttp_lightning.bounds.propagate import UnsupportedLayer, trace
from ttp_lightning.bounds.uniformity import proven_conf_dist, reverse_kl_upper_bound
from ttp_lightning.core.batching import ImageBatchDataset, iterate_shard
from ttp_lightning.core.nn_modes import batchnorm_in_eval_mode, evaluating, trainable
from ttp_lightning.core.objectives import PER_INSTANCE_LOSSES, combine_gradients, reduce_forget, retain_loss
from ttp_lightning.models.evaluation_mixin import PartsValidationMixin
from ttp_lightning.models.optim import configure_optimizer


def replayed(attacked_conf_dist: torch.Tensor, threshold: float, limit: int) -> torch.Tensor:
    """The indices of the forget images whose attacked CD is above `threshold` (NaN counts as above: it is no
    proof of anything), the worst first (NaN first, then by CD, ties by index), at most `limit`."""
    values = torch.nan_to_num(attacked_conf_dist.detach().double().cpu(), nan=float("inf"))
    order = torch.argsort(values, descending=True, stable=True)
    return order[~(values[order] <= threshold)][:limit].clone()


STRAGGLERS = 0.1  # interval_focus=unproven: B only while at most this share of the forget set is unproven


def stragglers(unproven: torch.Tensor, every: bool = False, covered: torch.Tensor | None = None) -> torch.Tensor:
    """The indices of the unproven forget images (`unproven`: [N] bool) while they are at most STRAGGLERS of the
    forget set (at least one image), else none: the bound term finishes a proof the attack-trained model nearly
    has; it does not push a whole forget set into a provable region (on the noisy-MNIST stand-in that cost 2.5
    test points against 1.5 without it, docs/robust-defaults.md). `every`: all the unproven images (robust Alg 1's
    later rounds, callbacks.Rounds: the first round did not prove them), and with them every image in `covered`
    (the indices B was on: in later rounds B stays on an image once it has covered it, since switching it off
    the moment the image is proven let whole forget sets flip between proven and unproven on alternate epochs,
    docs/robust-budget.md)."""
    index = unproven.nonzero().flatten().cpu()
    if every and covered is not None and len(covered):
        return torch.unique(torch.cat([index, covered.cpu().to(index.dtype)]))
    return index if every or len(index) <= max(1, int(STRAGGLERS * len(unproven))) else index[:0]


class ParetoFinetuneModule(PartsValidationMixin):
    """Two ways to optimise the Pareto objective.

    minibatch (the paper's text): each step takes a retain batch and a forget batch and one step on
    the weighted sum of their mean losses (automatic optimisation, DDP averages gradients as usual).
    `joint_forward` runs the two batches through one forward pass (one kernel launch per layer instead of
    two: an Alg 1 step then costs what an ERM step costs on a launch-bound GPU). For networks without
    BatchNorm the step is the same; with BatchNorm the two batches share their batch statistics, which the
    paper's two forward passes do not (a departure, off by default).
    fullbatch (the authors' public code): each epoch is ONE step on the gradients of the whole forget set
    and the whole retain set, accumulated in chunks (summed across DDP ranks, then divided by the global
    counts) and optionally combined by PCGrad-style surgery. The forget logits are divided by
    `forget_temperature` inside L_K in both modes.

    L_K is computed per forget image and reduced over the batch by `forget_reduction` (mean: the paper; max
    or cvar: the hardest images weigh more, core.objectives.reduce_forget). `forget_batchnorm="eval"` runs the
    forget images through BatchNorm with its running statistics, the function the released model computes
    (in training mode a forget batch of a few images is normalised by its own statistics, so a model made
    uniform there need not be uniform at test time; the paper's two forward passes use "train").
    `retain_batchnorm="eval"` does the same for the retain batch: the step then sees, for both terms, the
    function that is released. With the forget images in eval mode and the retain batch in training mode, the
    optimiser can rescale a layer before a BatchNorm: the retain batch normalises the scale away, the
    released (running-statistics) function does not, so it becomes uncertain on everything (a timm
    resnet10t fell from 100 to 90 % retain accuracy while its forget images became uniform).

    With `adversarial` settings (robust Alg 1), each forget image's L_K is
    clean_weight * L_K(x) + (1 - clean_weight) * L_K(x*) + interval_weight * B(x), x* from an inner attack
    that makes the model as confident as it can inside the training ball (alg1/adversary.py) and B(x) an
    upper bound on KL(u || p) over the whole ball (interval bound propagation with BatchNorm's running
    statistics, bounds/uniformity.py; the bound term, as GOOD's training); the retain term is unchanged. Every
    validation epoch also logs val/forget_robust_conf_dist (and the worst image's), the forget CD under a
    stronger attack, which the early-stopping callback then watches. `radius_scale` multiplies the training
    radius (callbacks.RadiusFromRetainRule sets it each epoch under adversarial.radius_rule=retain).
    """

    def __init__(self, net: nn.Module, theta: float, optim: dict, mode: str = "minibatch", uniformity: str = "kl",
                 forget_temperature: float = 1.0, gradient_surgery: bool = False, chunk_size: int = 8192,
                 retain_data: ImageBatchDataset | None = None, forget_data: ImageBatchDataset | None = None,
                 eval_parts: tuple[str, ...] = (), adversarial: AdversarialSettings | None = None,
                 joint_forward: bool = False, exposed_above: float | None = None, forget_reduction: str = "mean",
                 forget_cvar_fraction: float = 0.2, forget_reduction_temperature: float | None = None,
                 forget_batchnorm: str = "train",
                 retain_batchnorm: str = "train", attack_targets: torch.Tensor | None = None):
        super().__init__()
        self.joint_forward = joint_forward
        self.adversarial = adversarial
        # the class an attacker wants back for each forget image, in order: the starting model's prediction
        # (finetune() computes it before the fit; None: the forget labels)
        self._attack_targets = attack_targets
        self.net, self.theta, self.optim, self.mode = net, theta, dict(optim), mode
        self.uniformity_each = PER_INSTANCE_LOSSES[uniformity]
        self.forget_reduction, self.forget_cvar_fraction = forget_reduction, forget_cvar_fraction
        self.forget_reduction_temperature = forget_reduction_temperature
        self.forget_batchnorm, self.retain_batchnorm = forget_batchnorm, retain_batchnorm
        self.radius_scale = 1.0
        # robust Alg 1's round (callbacks.Rounds): from round 2 the bound term covers every unproven image
        self.round = 1
        # the bound term covers every unproven image from round 1 (finetune() sets it where A(D) was trained for
        # the bound: the straggler cap, measured on networks nearly proven, kept it off a whole round on the
        # certified MNIST ResNet8, docs/provable.md)
        self.bound_from_start = False
        # the epochs one cosine cycle of the schedule spans (None: the whole fit)
        self.schedule_epochs: int | None = None
        # forget images (indices) every step replays (adversarial.replay): set after each validation epoch
        self._replay = torch.empty(0, dtype=torch.long)
        # forget images (indices) the bound term covers every step (adversarial.interval_focus=unproven): those
        # the last validation epoch's bound did not prove at gamma; none before the first
        self._unproven = torch.empty(0, dtype=torch.long)
        # inner_start=persistent: (each forget image's last inner-attack perturbation, whether it has one)
        self._carried: tuple[torch.Tensor, torch.Tensor] | None = None
        # the rank of the epoch early stopping keeps so far (None: none yet); finetune() hands it the callback's
        self.kept_rank: Callable[[], tuple | None] | None = None
        # early stopping's could_qualify (select=proven): the judge attacks no epoch that cannot be kept
        self.could_qualify: Callable[[Callable[[str], float | None]], bool] | None = None
        # the network's traced graph, for the interval term: kept in a list so that it is not registered as a
        # submodule (its parameters would enter the state_dict a second time, and a state_dict saved before the
        # first trace would no longer load: LrBackoff's restart did exactly that)
        self._graph: list = []
        self._unbounded = False  # the interval bound has no rule for a layer of the network (found once)
        self.forget_temperature, self.gradient_surgery, self.chunk_size = forget_temperature, gradient_surgery, chunk_size
        self.retain_data, self.forget_data = retain_data, forget_data
        self.automatic_optimization = mode == "minibatch"
        self._init_validation(eval_parts, exposed_above=exposed_above)
        self.exposed_above = exposed_above

    def forward(self, images):
        return self.net(images)

    def training_step(self, batch, batch_idx):
        if self.mode == "minibatch":
            retain_images, retain_labels = batch["retain"]
            forget_images, forget_labels, *positions = batch["forget"]  # positions: inner_start=persistent
            if self.joint_forward:  # one forward pass for both batches (BatchNorm then normalises them together)
                logits = self(torch.cat([retain_images, forget_images]))
                retain_logits, forget_logits = logits.split([len(retain_images), len(forget_images)])
                retain_term = retain_loss(retain_logits, retain_labels)
                forget_term = self._reduce(self._uniformity(forget_logits))
            else:
                retain_term = self._retain_loss(retain_images, retain_labels)
                forget_term = self._forget_loss(*self._with_replay(forget_images, forget_labels, *positions))
                forget_term = forget_term + self._unproven_bound()
            loss = self.theta * forget_term + (1 - self.theta) * retain_term
            self.log("train/pareto_loss", loss, prog_bar=True)
            return loss
        self._fullbatch_step()

    def _with_replay(self, images, labels, positions=None):
        """The forget batch and the forget images replayed in every step (adversarial.replay: those the last
        epoch's attack left exposed, the worst first), un-augmented, labelled as the inner attack targets them;
        with the batch's `positions` in the forget set (inner_start=persistent), theirs too."""
        if not len(self._replay):
            return images, labels, positions
        replay_images, replay_labels = self.forget_data[self._replay.tolist()]  # only the images replayed
        if self._attack_targets is not None and targets_pretrained(self.adversarial):
            replay_labels = self._attack_targets[self._replay]
        if positions is not None:
            positions = torch.cat([positions, self._replay.to(positions)])
        return torch.cat([images, replay_images.to(images)]), torch.cat([labels, replay_labels.to(labels)]), positions

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["forget_replay"] = self._replay.tolist()
        checkpoint["forget_unproven"] = self._unproven.tolist()
        if self._carried is not None:  # inner_start=persistent: every forget image's last inner-attack point
            checkpoint["inner_carried"] = [tensor.detach().cpu() for tensor in self._carried]

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._replay = torch.tensor(checkpoint.get("forget_replay", []), dtype=torch.long)
        self._unproven = torch.tensor(checkpoint.get("forget_unproven", []), dtype=torch.long)
        carried = checkpoint.get("inner_carried")
        self._carried = None if carried is None else (carried[0].clone(), carried[1].clone())

    def _uniformity(self, logits):
        """Each image's L_K of the temperature-scaled logits."""
        return self.uniformity_each(logits / self.forget_temperature)

    def _reduce(self, losses):
        return reduce_forget(losses, self.forget_reduction, self.forget_cvar_fraction, self.forget_reduction_temperature)

    def _forget_loss(self, images, labels, positions=None):
        """L_K on a forget batch: at the images, or (robust) mixed with their worst-case perturbations and the
        interval bound over their balls; per image, then reduced over the batch. With `forget_batchnorm="eval"`
        BatchNorm layers normalise the forget images by their running statistics and leave them unchanged.
        `positions`: the batch's images' positions in the forget set, where inner_start=persistent carries each
        image's last inner-attack point over to its next visit."""
        with batchnorm_in_eval_mode(self.net, self.forget_batchnorm == "eval"):
            losses = self._uniformity(self(images))
            settings = self.adversarial
            if settings is None:
                return self._reduce(losses)
            start, started = self._carried_start(images, positions)
            attacked = worst_forget_images(self.net, images, labels, settings, self.train_radius(), start, started)
            self._carry(images, positions, attacked)
            losses = settings.clean_weight * losses + (1 - settings.clean_weight) * self._uniformity(self(attacked))
        if settings.interval_weight and settings.interval_focus == "all":
            losses = losses + settings.interval_weight * self._interval_bound(images)
        return self._reduce(losses)

    def _carried_start(self, images, positions):
        """(each batch image's carried perturbation added to it, whether it has one) under inner_start=persistent
        (the store is made at the first visit, one perturbation per forget image); (None, None) otherwise."""
        if positions is None or self.adversarial.inner_start != "persistent":
            return None, None
        if self._carried is None:
            count = len(self.forget_data)
            self._carried = (images.new_zeros((count, *images.shape[1:])),
                             torch.zeros(count, dtype=torch.bool, device=images.device))
        delta, seen = self._carried
        index = positions.to(delta.device)
        return images + delta[index].to(images), seen[index]

    def _carry(self, images, positions, attacked) -> None:
        """Remember each batch image's inner-attack point (as its perturbation) for its next visit."""
        if self._carried is None or positions is None:
            return
        delta, seen = self._carried
        index = positions.to(delta.device)
        delta[index] = (attacked - images).detach().to(delta)
        seen[index] = True

    def _unproven_bound(self):
        """interval_focus=unproven: interval_weight x B summed over the forget images the last validation epoch
        left unproven, divided by the forget set's size: each such image weighs in every step what it weighs on
        average under interval_focus=all (w / batch size, in a batch one step in N / batch size); proven ones
        not at all. 0 when nothing is unproven or the term is off."""
        settings = self.adversarial
        if settings is None or not settings.interval_weight or settings.interval_focus != "unproven" \
                or not len(self._unproven):
            return 0.0
        images, _ = self.forget_data[self._unproven.tolist()]
        return settings.interval_weight * self._interval_bound(images.to(self.device)).sum() / len(self.forget_data)

    def train_radius(self) -> float:
        """The inner attack's radius this epoch, in [0, 1] pixels: the training radius times `radius_scale`."""
        return self.adversarial.train_radius * self.radius_scale

    def _interval_radius(self) -> float:
        """The interval term's radius: grown linearly over the first `interval_ramp_epochs` epochs to the
        training radius, or to interval_gamma where it is set (as IBP training does: a bound over the full ball is
        loose and large at the start, and its gradient alone would wreck the model's accuracy in the first
        epoch)."""
        ramp = self.adversarial.interval_ramp_epochs
        fraction = 1.0 if not ramp or self._trainer is None else min(1.0, (self.current_epoch + 1) / ramp)
        fixed = self.adversarial.interval_gamma
        return (self.train_radius() if fixed is None else float(fixed) / 255.0) * fraction

    def _interval_bound(self, images):
        """Each image's upper bound on KL(u || p) over its ball (`_interval_radius`; by `bound_term`: interval or
        CROWN-IBP), with BatchNorm's running statistics (the function the released model computes)."""
        if not self._graph:
            self._graph.append(trace(self.net))
        with evaluating(self.net):
            return reverse_kl_upper_bound(self.net, images, self._interval_radius(), self._graph[0],
                                          self.adversarial.bound_term)

    def _retain_loss(self, images, labels):
        with batchnorm_in_eval_mode(self.net, self.retain_batchnorm == "eval"):
            return retain_loss(self(images), labels)

    # ------------------------------------------------------ robust validation
    def on_validation_epoch_end(self) -> None:
        if self.adversarial is None or self.trainer.sanity_checking:
            return
        # the radius this epoch trained at, in units of 1/255 (it moves under adversarial.radius_rule=retain)
        self.log("val/train_gamma", self.train_radius() * 255.0, on_epoch=True, sync_dist=False)
        proven = self._proven_conf_dist()
        self.log("val/below_radius", float(self._below_radius(proven)), on_epoch=True, sync_dist=False)
        self.log("val/forget_proven_worst_conf_dist", proven.max().item(), on_epoch=True, sync_dist=False)
        per_image, judged = self._attacked_conf_dist(proven)
        # Every rank attacks the whole (small) forget set with the same seed: the values are identical.
        self.log("val/forget_robust_judged", float(judged), on_epoch=True, sync_dist=False)
        self.log("val/forget_robust_conf_dist", per_image.mean().item(), on_epoch=True, sync_dist=False)
        self.log("val/forget_robust_worst_conf_dist", per_image.max().item(), on_epoch=True, sync_dist=False)
        if self.exposed_above is not None and self.adversarial.replay:
            self._replay = replayed(per_image, self.exposed_above, self.adversarial.replay)
            self.log("val/forget_replayed", float(len(self._replay)), on_epoch=True, sync_dist=False)
        if self.exposed_above is not None:
            exposed = float((~(per_image <= self.exposed_above)).sum())  # NaN is exposed: it proves nothing
            self.log("val/forget_robust_exposed", exposed, on_epoch=True, sync_dist=False)
            unproven = ~(proven <= self.exposed_above)  # NaN is not a proof
            self.log("val/forget_unproven", float(unproven.sum()), on_epoch=True, sync_dist=False)
            if self.adversarial.interval_focus == "unproven":
                self._unproven = stragglers(unproven, every=self.round > 1 or self.bound_from_start,
                                            covered=self._unproven if self.round > 1 else None)

    def _attacked_conf_dist(self, proven: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """Each forget image's CD under early stopping's attack, and whether the judge's attack (judge_steps > 0)
        ran too (per image the worse of the two). It runs on an epoch that could be kept: trained at the radius
        judged, within early stopping's retain and clean thresholds (`could_qualify`), and no more images exposed
        by the first attack than by the epoch kept so far (`kept_rank()`, select=proven's (below radius, exposed,
        ...): an epoch ranked worse on those cannot be kept, and a kept epoch at the radius was always judged). An image the bound already proves at or below the threshold
        (`proven`: each image's proven CD at gamma) is not attacked: no attack can take it above the threshold,
        and its value is the proven CD, an upper bound on whatever an attack reaches (on mnist_mlp the attacks
        on proven images were 46 % of robust Alg 1's time, scripts/profile_robust.py)."""
        settings = self.adversarial
        open_ = torch.ones(len(proven), dtype=torch.bool) if self.exposed_above is None else \
            ~(proven <= self.exposed_above)  # NaN is not a proof: attacked
        per_image = proven.clone().to(torch.float64)
        if not bool(open_.any()):
            return per_image, False
        index = open_.nonzero().flatten()
        forget = self.forget_data.take(index)
        targets = None if self._attack_targets is None else self._attack_targets[index.to(self._attack_targets.device)]
        screened = robust_conf_dist(self.net, forget, targets, settings, self.device)
        judge = settings.judge()
        judged = False
        if judge is not None and self.exposed_above is not None and not self._below_radius() and \
                (self.could_qualify is None or self.could_qualify(self.epoch_value)):
            kept = self.kept_rank() if self.kept_rank is not None else None
            if kept is None or kept[0] or float((screened > self.exposed_above).sum()) <= kept[1]:
                screened = torch.maximum(screened, robust_conf_dist(self.net, forget, targets, judge, self.device))
                judged = True
        per_image[index] = screened
        return per_image, judged

    def _below_radius(self, proven: torch.Tensor | None = None) -> bool:
        """This epoch trained below the radius the release is judged at (the radius rule stepped it down) and, given
        `proven` (each forget image's proven CD at gamma), the interval bound does not prove every forget image at
        or below the threshold there. A proof holds whatever radius the epoch trained at, so a fully proven epoch
        counts as at the radius for every rule that reads this (early stopping's rank, the rounds' goal, the
        frontier); the gate recomputes the proofs itself (assess/protection.py radius_fallback). NaN is no proof."""
        below = self.train_radius() * 255.0 < self.adversarial.gamma - 1e-9
        if not below or proven is None or self.exposed_above is None:
            return below
        return not bool((proven <= self.exposed_above).all())

    def _proven_conf_dist(self) -> torch.Tensor:
        """[N]: each forget image's interval-bound proven CD at gamma (cheap: one bound pass; a network the
        interval bound has no rule for gets the vacuous 1 - 1/K, nothing proven, and is not copied and traced again
        in later epochs: the architecture does not change)."""
        images, _ = self.forget_data.everything()
        if not self._unbounded:
            try:
                return proven_conf_dist(self.net, images, self.adversarial.gamma, device=self.device)
            except UnsupportedLayer:
                self._unbounded = True
        with torch.no_grad(), evaluating(self.net):
            classes = self.net(images[:1].to(self.device)).shape[-1]
        return torch.full((len(images),), 1.0 - 1.0 / classes, dtype=torch.float64)

    # --------------------------------------------------------------- fullbatch

    def _mean_gradient(self, dataset: ImageBatchDataset, loss_fn) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Gradient of the dataset-mean loss and that mean, over every rank's shard.

        Losses are batch means, so loss * n is a sum; sums and counts are all-reduced, then divided.
        torch.autograd.grad leaves .grad and DDP's hooks alone; the reduction is explicit.
        """
        params = trainable(self.net)
        sums = [torch.zeros_like(p) for p in params]
        totals = torch.zeros(2, device=self.device, dtype=torch.float64)  # loss sum, count
        for images, labels in iterate_shard(dataset, self.chunk_size):
            images, labels = images.to(self.device), labels.to(self.device)
            loss_sum = loss_fn(images, labels) * len(labels)
            for total, grad in zip(sums, torch.autograd.grad(loss_sum, params)):
                total.add_(grad)
            totals += torch.tensor([loss_sum.item(), len(labels)], device=self.device, dtype=torch.float64)
        if dist.is_available() and dist.is_initialized():
            for total in sums:
                dist.all_reduce(total)
            dist.all_reduce(totals)
        count = totals[1].clamp(min=1)
        return [total / count.to(total.dtype) for total in sums], totals[0] / count

    def _forget_gradient(self) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The forget term's gradient and value over the whole forget set: its mean L_K, plus the bound term on
        the stragglers (interval_focus=unproven; already a mean over the forget set, the same on every rank)."""
        grads, loss = self._mean_gradient(self.forget_data, self._forget_loss)
        extra = self._unproven_bound()
        if not torch.is_tensor(extra):
            return grads, loss
        params = trainable(self.net)
        more = torch.autograd.grad(extra, params, allow_unused=True)
        return [g if m is None else g + m for g, m in zip(grads, more)], loss + extra.detach().to(loss.dtype)

    def _fullbatch_step(self) -> None:
        forget_grads, forget_loss = self._forget_gradient()
        retain_grads, retain_loss_value = self._mean_gradient(self.retain_data, self._retain_loss)
        step = combine_gradients(forget_grads, retain_grads, self.theta, self.gradient_surgery)
        optimizer = self.optimizers()
        optimizer.zero_grad()
        for param, grad in zip((p for p in self.net.parameters() if p.requires_grad), step):
            param.grad = grad
        optimizer.step()
        objective = self.theta * forget_loss + (1 - self.theta) * retain_loss_value
        self.log("train/pareto_loss", objective.float(), prog_bar=True)
        self.log("train/forget_loss", forget_loss.float())
        self.log("train/retain_loss", retain_loss_value.float())

    def on_train_epoch_end(self) -> None:
        scheduler = self.lr_schedulers()
        if not self.automatic_optimization and scheduler is not None:
            scheduler.step()

    def configure_optimizers(self):
        return configure_optimizer(self.net.parameters(), self.schedule_epochs or self.trainer.max_epochs, **self.optim)

