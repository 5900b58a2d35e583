"""The attack evaluation of one model on the forget set: every configured attack at every radius, the worst
case per image, and the sanity checks of Carlini et al. ("On Evaluating Adversarial Robustness", 2019) that
say whether the numbers can be trusted.

Radii are visited in increasing order and every attack at radius gamma may start from the worst point found
at the previous radius (it lies inside the larger ball), so the worst case per image never decreases with
gamma for a deterministic model. The clean image is always a candidate: an attack never scores below it. An
image whose worst point is already within SATURATED (base.py) of confidence 1 is not attacked again by an
attack that keeps its start (APGD with an untargeted objective): no attack could raise its CD by more.

Checks, per model:
  randomised          whether two forward passes on the same images differ (then every gradient, objective
                      and score is an average over `eot_samples` passes: expectation over transformation)
  zero_gradient_share share of forget images where the exact input gradient of every objective is zero
                      (gradient masking; the ReLU surrogate's share is reported beside it)
  monotone_in_gamma   whether the worst case per image never drops as gamma grows (and which gradient
                      attacks' mean curves do drop: a sign of a weak or masked attack)
  unbounded           the gradient attacks with gamma = 1 (any image in [0, 1]): they should restore at
                      least the pretrained model's forget CD; if not, the table is a lower bound and says so
  wall_s              the evaluation's wall time
"""

import time
from itertools import pairwise

import torch
from torch import nn

from ttp_lightning.attacks.base import Attack, saturated
from ttp_lightning.attacks.objectives import OBJECTIVES
from ttp_lightning.attacks.surrogate import smooth_relu_gradients
from ttp_lightning.config.build import build_part
from ttp_lightning.config.schema import AttacksSchema
from ttp_lightning.core.batching import ImageBatchDataset
from ttp_lightning.core.inference import eval_device
from ttp_lightning.core.metrics import conf_dist_of_confidence

WORST = "worst"
UNBOUNDED = 255


def build_suite(suite) -> dict[str, Attack]:
    """The attacks of `attacks.suite`, in its order, each built by Hydra from its `_target_` (null entries,
    attacks left out, are skipped)."""
    return {str(name): build_part(settings, f"attacks.suite.{name}", Attack) for name, settings in suite.items()
            if settings is not None}


def is_randomised(model: nn.Module, images: torch.Tensor) -> bool:
    with torch.no_grad():
        return not torch.equal(model(images), model(images))


@torch.no_grad()
def confidence_and_correct(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                           samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per image: max softmax and whether the arg-max is the label, averaged over `samples` passes."""
    confidence = correct = 0.0
    for _ in range(samples):
        probs = model(images).softmax(dim=-1)
        confidence = confidence + probs.max(dim=-1).values
        correct = correct + (probs.argmax(dim=-1) == labels).float()
    return confidence / samples, correct / samples


def zero_gradient_mask(model: nn.Module, images: torch.Tensor, targets: torch.Tensor,
                       beta: float | None) -> torch.Tensor:
    """Per image: True where every objective's input gradient is exactly zero (with ReLU surrogate `beta`)."""
    zero = torch.ones(len(images), dtype=torch.bool, device=images.device)
    with torch.enable_grad(), smooth_relu_gradients(beta):
        for objective in dict.fromkeys(OBJECTIVES.values()):  # each function once: `targeted` is ce_pretrained's
            x = images.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(objective(model(x), targets).sum(), x)
            zero &= grad.flatten(1).abs().amax(dim=1) == 0
    return zero


def evaluate_attacks(model: nn.Module, forget: ImageBatchDataset, cfg: AttacksSchema, attacks: dict[str, Attack],
                     targets: torch.Tensor | None = None, reference_conf_dist: float | None = None,
                     progress=None) -> dict:
    """{"scores": {attack: {gamma (/255): {forget_conf_dist, forget_acc}}} with "none" (clean) and "worst"
    (per image the most confident of all `attacks`, built by `build_suite`), "checks": {...}, "worst_per_image": {gamma: [each image's
    CD at its most confident point]}}. `targets`: the labels an adversary wants
    back (the pretrained model's predictions; default the true labels). `reference_conf_dist`: the forget CD
    the unbounded attack should restore (the pretrained model's). `progress(done, total)` is called after each
    attack's run on a chunk of images at one radius."""
    started = time.perf_counter()
    device = eval_device()
    was_training = model.training
    model.eval().to(device)
    images, labels = forget.everything()
    images, labels = images.to(device), labels.to(device)
    targets = labels if targets is None else targets.to(device)
    with torch.no_grad():
        num_classes = model(images[:1]).shape[-1]
    randomised = is_randomised(model, images[: min(len(images), 16)])
    samples = int(cfg.eot_samples) if randomised else 1
    own = any(attack.own_surrogates for attack in attacks.values())
    betas = [b for b in [cfg.relu_gradient_beta, *(cfg.surrogate_betas if own else [])] if b is not None]
    gammas = sorted(float(g) for g in cfg.gammas)
    chunk = int(cfg.chunk_size)
    per_image = _attack_per_image(model, images, labels, targets, cfg, attacks, gammas, samples, chunk, progress)
    scores = {attack: {_key(g): _summary(*by_gamma[g], num_classes) for g in by_gamma}
              for attack, by_gamma in per_image.items() if attack != "unbounded"}
    scores = _in_config_order(scores, cfg.gammas)
    checks = {"randomised": randomised, "eot_samples": samples,
              **_masking(model, images, targets, max(betas, default=None), chunk),
              **_monotonicity(per_image, gammas, num_classes, [n for n, a in attacks.items() if a.random])}
    if "unbounded" in per_image:
        checks["unbounded"] = _unbounded(per_image["unbounded"][UNBOUNDED], num_classes, reference_conf_dist)
    model.train(was_training)
    checks["wall_s"] = round(time.perf_counter() - started, 3)
    worst = {_key(g): conf_dist_of_confidence(confidence.double(), num_classes).tolist()
             for g, (confidence, _) in per_image[WORST].items()}
    return {"scores": scores, "checks": checks, "worst_per_image": worst}


def _attack_per_image(model, images, labels, targets, cfg, attacks, gammas, samples, chunk, progress=None) -> dict:
    """{attack: {gamma: (confidence, correct) per image}}; gamma 255 under "unbounded" for the gradient
    attacks. Generators are seeded per (attack, gamma) and consumed chunk by chunk, as the paper's attacks
    always were, so two models face the same random draws."""
    names = list(attacks)
    generators = {(name, g): torch.Generator().manual_seed(int(cfg.seed)) for name in names
                  for g in [*gammas, UNBOUNDED]}
    per_image: dict = {"none": {0.0: [[], []]}, WORST: {g: [[], []] for g in gammas}}
    per_image.update({name: {g: [[], []] for g in gammas} for name in names})
    gradient_attacks = [name for name in names if not attacks[name].random]
    if cfg.unbounded_check and gradient_attacks:
        per_image["unbounded"] = {UNBOUNDED: [[], []]}
    runs = len(gammas) * len(names) + (len(gradient_attacks) if "unbounded" in per_image else 0)
    count = {"done": 0, "total": runs * -(-len(images) // chunk)}

    def tick() -> None:
        count["done"] += 1
        if progress is not None:
            progress(count["done"], count["total"])

    for start in range(0, len(images), chunk):
        x, y, t = images[start:start + chunk], labels[start:start + chunk], targets[start:start + chunk]
        clean = confidence_and_correct(model, x, y, samples)
        _append(per_image["none"][0.0], clean)
        worst_x, worst = x, clean
        for gamma in gammas:
            worst_x, worst = _radius(model, x, y, t, cfg, attacks, names, gamma, generators, samples, worst_x,
                                     worst, per_image, tick)
            _append(per_image[WORST][gamma], worst)
        if "unbounded" in per_image:
            _, unbounded = _radius(model, x, y, t, cfg, attacks, gradient_attacks, UNBOUNDED, generators,
                                   samples, worst_x, worst, None, tick)
            _append(per_image["unbounded"][UNBOUNDED], unbounded)
    return {attack: {g: (torch.cat(c), torch.cat(r)) for g, (c, r) in by_gamma.items()}
            for attack, by_gamma in per_image.items()}


def _radius(model, x, y, t, cfg, attacks, names, gamma, generators, samples, worst_x, worst, per_image, tick):
    """Every attack in `names` at one radius, each free to start from `worst_x`; returns the new worst
    point and score per image (never below `worst`); `tick()` after each attack."""
    for name in names:
        attack = attacks[name]
        with smooth_relu_gradients(None if attack.own_surrogates else cfg.relu_gradient_beta):
            attacked = _attack_open_images(attack, model, x, t, gamma / 255.0, generators[(name, gamma)], cfg,
                                           worst_x, worst[0], samples)
        scored = confidence_and_correct(model, attacked, y, samples)
        if per_image is not None:
            _append(per_image[name][gamma], scored)
        more = scored[0] > worst[0]
        worst_x = torch.where(more.view((-1,) + (1,) * (x.dim() - 1)), attacked, worst_x)
        worst = (torch.where(more, scored[0], worst[0]), torch.where(more, scored[1], worst[1]))
        tick()
    return worst_x, worst


def _attack_open_images(attack: Attack, model, x, t, radius, generator, cfg, worst_x, worst_confidence,
                        samples) -> torch.Tensor:
    """The attack's point per image; an attack that keeps its start leaves an image whose worst point so far is
    saturated there (it could raise it by no more; NaN is attacked)."""
    open_ = ~saturated(worst_confidence)
    if not attack.keeps_start(cfg) or bool(open_.all()):
        return attack(model, x, radius, generator, cfg, targets=t, warm_start=worst_x, samples=samples).detach()
    attacked = worst_x.clone()
    if bool(open_.any()):
        attacked[open_] = attack(model, x[open_], radius, generator, cfg, targets=t[open_],
                                 warm_start=worst_x[open_], samples=samples).detach()
    return attacked


def _append(slot: list, scored: tuple[torch.Tensor, torch.Tensor]) -> None:
    slot[0].append(scored[0].cpu())
    slot[1].append(scored[1].cpu())


def _key(gamma: float) -> str:
    return f"{gamma:g}"


def _summary(confidence: torch.Tensor, correct: torch.Tensor, num_classes: int) -> dict:
    conf_dist = conf_dist_of_confidence(confidence.double(), num_classes).mean()
    return {"forget_conf_dist": round(float(conf_dist), 6), "forget_acc": round(float(correct.double().mean()), 6)}


def _in_config_order(scores: dict, gammas) -> dict:
    order = [_key(float(g)) for g in gammas]
    return {attack: by_gamma if attack == "none" else {g: by_gamma[g] for g in order}
            for attack, by_gamma in scores.items()}


def _masking(model, images, targets, beta, chunk: int) -> dict:
    """Shares of forget images with an all-zero input gradient: exact, and under the sharpest surrogate."""
    def share(b):
        masks = [zero_gradient_mask(model, images[i:i + chunk], targets[i:i + chunk], b)
                 for i in range(0, len(images), chunk)]
        return round(float(torch.cat(masks).float().mean()), 6)

    out = {"zero_gradient_share": share(None)}
    if beta is not None:
        out["zero_gradient_share_surrogate"] = share(beta)
    return out


def _monotonicity(per_image: dict, gammas: list[float], num_classes: int, random: list[str]) -> dict:
    """The worst case per image must not drop as gamma grows; per-attack mean curves that drop are listed."""
    tolerance = 1e-6
    worst = [per_image[WORST][g][0] for g in gammas]
    monotone = all(bool((later >= earlier - tolerance).all()) for earlier, later in pairwise(worst))
    drops = []
    for attack, by_gamma in per_image.items():
        if attack in ("none", "unbounded", WORST, *random):
            continue
        means = [_summary(*by_gamma[g], num_classes)["forget_conf_dist"] for g in gammas]
        drops += [f"{attack}: CD {a:.4f} at {_key(g1)}/255 > {b:.4f} at {_key(g2)}/255"
                  for g1, g2, a, b in zip(gammas, gammas[1:], means, means[1:]) if b < a - tolerance]
    return {"monotone_in_gamma": monotone, "attack_curves_that_drop": drops}


def _unbounded(scored: tuple[torch.Tensor, torch.Tensor], num_classes: int, reference: float | None) -> dict:
    conf_dist = _summary(*scored, num_classes)["forget_conf_dist"]
    out = {"gamma": UNBOUNDED, "forget_conf_dist": conf_dist, "reference_conf_dist": reference}
    if reference is None:
        return out
    out["restored"] = conf_dist >= reference - 1e-6
    if not out["restored"]:
        out["note"] = (f"with any image in [0, 1] allowed the attacks reach forget CD {conf_dist:.4f}, below the "
                       f"pretrained model's {reference:.4f}: they are too weak for this model (or it cannot be "
                       "confident anywhere near these images); read every attacked CD as a lower bound")
    return out
