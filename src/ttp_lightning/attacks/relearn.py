"""The relearning attack: open weights can be finetuned. An adversary finetunes the released model on public,
labelled data that does not contain the forget set and checks whether the forget predictions come back (Siddiqui
et al. 2025, "From Dormant to Deleted", finetune on retain data alone; Hsu et al. 2025). Reported: the forget CD
and accuracy (and the worst image's CD) after each number of steps in `steps`, for every data source (the test
split; a random subset of the retain data) and learning rate, and their worst case: per number of steps the
highest of each score over all of them (an upper envelope: each value is attained by some run, named in `run`).
"""

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from ttp_lightning.core.batching import ImageBatchDataset
from ttp_lightning.core.inference import probabilities
from ttp_lightning.core.metrics import conf_dist_of_probs


def _forget_scores(net: nn.Module, images: torch.Tensor, labels: torch.Tensor, device) -> dict:
    probs = probabilities(net, images, device)
    conf_dist = conf_dist_of_probs(probs)
    return {"forget_conf_dist": round(float(conf_dist.mean()), 6),
            "forget_acc": round(float((probs.argmax(-1) == labels.cpu()).double().mean()), 6),
            "forget_worst_conf_dist": round(float(conf_dist.max()), 6)}


def relearn_attack(net: nn.Module, public: ImageBatchDataset, forget: ImageBatchDataset, steps: list[int], lr: float,
                   batch_size: int, seed: int, device) -> dict[str, dict]:
    """{steps: forget scores after that many Adam steps of cross entropy on `public`} for a copy of `net` (the
    network itself is untouched). Batches are drawn with replacement of epochs from a seeded permutation."""
    model = copy.deepcopy(net).to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    forget_images, forget_labels = forget.everything()
    forget_images = forget_images.to(device)
    generator = torch.Generator().manual_seed(seed)
    order, cursor, out = torch.empty(0, dtype=torch.long), 0, {}
    wanted = sorted({int(s) for s in steps})
    for step in range(1, wanted[-1] + 1):
        if cursor + batch_size > len(order):
            order, cursor = torch.randperm(len(public), generator=generator), 0
        images, labels = public[order[cursor:cursor + batch_size].tolist()]
        cursor += batch_size
        optimizer.zero_grad()
        F.cross_entropy(model(images.to(device)), labels.to(device)).backward()
        optimizer.step()
        if step in wanted:
            out[str(step)] = _forget_scores(model, forget_images, forget_labels, device)
    return out


def retain_subset(retain: ImageBatchDataset, size: int | None, seed: int) -> ImageBatchDataset:
    """`size` retain images drawn without replacement by `seed` (all of them when None or larger), unaugmented:
    the attacker's sample of the data the model keeps."""
    count = len(retain) if size is None else min(int(size), len(retain))
    chosen = torch.randperm(len(retain), generator=torch.Generator().manual_seed(seed))[:count].sort().values
    return ImageBatchDataset(retain.images[chosen], retain.labels[chosen])


def relearn_worst(net: nn.Module, sources: dict[str, ImageBatchDataset], forget: ImageBatchDataset,
                  steps: list[int], lrs: list[float], batch_size: int, seed: int, device,
                  progress=None) -> tuple[dict, dict]:
    """(worst, runs): `runs` {"<source> lr <lr>": {steps: scores}} is relearn_attack for every source and learning
    rate; `worst` {steps: scores} holds, per number of steps, the highest forget CD, worst image's CD and forget
    accuracy over the runs, and `run`, the run with the highest forget CD (NaN counts as the highest).
    `progress(done, total)` is called after each run."""
    plan = [(f"{name} lr {lr:g}", data, lr) for name, data in sources.items() for lr in lrs]
    runs = {}
    for done, (label, data, lr) in enumerate(plan, 1):
        runs[label] = relearn_attack(net, data, forget, steps, lr, batch_size, seed, device)
        if progress is not None:
            progress(done, len(plan))
    worst = {}
    for count in next(iter(runs.values())):
        rows = {name: scores[count] for name, scores in runs.items()}
        worst[count] = {key: max((row[key] for row in rows.values()), key=_nan_highest) for key in _SCORES}
        worst[count]["run"] = max(rows, key=lambda name: _nan_highest(rows[name]["forget_conf_dist"]))
    return worst, runs


_SCORES = ("forget_conf_dist", "forget_acc", "forget_worst_conf_dist")


def _nan_highest(value: float) -> float:
    return math.inf if math.isnan(value) else value
