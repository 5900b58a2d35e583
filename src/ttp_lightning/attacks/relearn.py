"""The relearning attack: open weights can be finetuned. An adversary finetunes the released model on a little
public, labelled data that does not contain the forget set (by default the test split) and checks whether the
forget predictions come back (Siddiqui et al. 2025, "From Dormant to Deleted"; Hsu et al. 2025). Reported: the
forget CD and accuracy (and the worst image's CD) after each number of steps in `steps`.
"""

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ttp_lightning.batching import ImageBatchDataset
from ttp_lightning.evaluation import probabilities
from ttp_lightning.metrics import conf_dist_of_probs


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
