"""The relearning attack: open weights can be finetuned. An adversary finetunes the released model on public,
labelled data that does not contain the forget set and checks whether the forget predictions come back (Siddiqui
et al. 2025, "From Dormant to Deleted", finetune on retain data alone; Hsu et al. 2025). Reported: the forget CD
and accuracy (and the worst image's CD) after each number of steps in `steps`, for every data source (the test
split; a random subset of the retain data) and learning rate, and their worst case: per number of steps the
highest of each score over all of them (an upper envelope: each value is attained by some run, named in `run`).

The runs are independent finetunings of copies of the same architecture, so they are trained together: one
vmapped forward and backward per step over every (model, source, rate) run (torch.func), with torch's Adam on
parameters stacked per rate. Each run sees the batches and takes the Adam steps it would alone (`relearn_attack`,
the one-run reference, is what the tests compare it with); what is saved is the per-step overhead of the
small networks this attack is usually run on. Networks with convolutions train their runs one at a time
(trains_together says why).
"""

import copy
import logging
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from ttp_lightning.core.batching import ImageBatchDataset
from ttp_lightning.core.inference import probabilities
from ttp_lightning.core.metrics import conf_dist_of_probs

log = logging.getLogger(__name__)


def _scores(probs: torch.Tensor, labels: torch.Tensor) -> dict:
    """The forget scores of [N, K] float64 probabilities."""
    conf_dist = conf_dist_of_probs(probs)
    return {"forget_conf_dist": round(float(conf_dist.mean()), 6),
            "forget_acc": round(float((probs.argmax(-1) == labels.cpu()).double().mean()), 6),
            "forget_worst_conf_dist": round(float(conf_dist.max()), 6)}


class _Batches:
    """A source's training batches as one run draws them: `batch_size` images at a time from a permutation seeded
    by `seed`, a fresh permutation when the current one has too few left."""

    def __init__(self, data: ImageBatchDataset, batch_size: int, seed: int):
        self.data, self.batch_size = data, batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.order, self.cursor = torch.empty(0, dtype=torch.long), 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cursor + self.batch_size > len(self.order):
            self.order, self.cursor = torch.randperm(len(self.data), generator=self.generator), 0
        batch = self.data[self.order[self.cursor:self.cursor + self.batch_size].tolist()]
        self.cursor += self.batch_size
        return batch


def relearn_attack(net: nn.Module, public: ImageBatchDataset, forget: ImageBatchDataset, steps: list[int], lr: float,
                   batch_size: int, seed: int, device, tick=None) -> dict[str, dict]:
    """{steps: forget scores after that many Adam steps of cross entropy on `public`} for a copy of `net` (the
    network itself is untouched), one run alone: the reference the batched runs are tested against. A network with
    2-d convolutions runs in channels_last memory format on a CPU (channels_last_on_cpu)."""
    model = copy.deepcopy(net).to(device).train()
    layout = torch.channels_last if channels_last_on_cpu(model, device) else torch.contiguous_format
    model = model.to(memory_format=layout)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    forget_images, forget_labels = forget.everything()
    forget_images = forget_images.to(device)
    batches, out = _Batches(public, batch_size, seed), {}
    wanted = sorted({int(s) for s in steps})
    for step in range(1, wanted[-1] + 1):
        images, labels = batches.next()
        optimizer.zero_grad()
        F.cross_entropy(model(images.to(device).contiguous(memory_format=layout)), labels.to(device)).backward()
        optimizer.step()
        if step in wanted:
            out[str(step)] = _scores(probabilities(model, forget_images, device), forget_labels)
        if tick is not None:
            tick()
    return out


def channels_last_on_cpu(net: nn.Module, device) -> bool:
    """Whether a run of `net` trains in channels_last memory format: on a CPU, for a network with a 2-d
    convolution. On 2 cores one Adam step of the MNIST ResNet8 (width 16, batch 128) took 57 ms in it and 89 ms
    in the default format, so its one-at-a-time runs take about two thirds of the time; the values differ from
    the default format's by the order of the convolutions' sums only."""
    return torch.device(device).type == "cpu" and any(isinstance(m, nn.Conv2d) for m in net.modules())


@dataclass(frozen=True)
class _Run:
    """One finetuning: of which model, from which source, at which learning rate."""
    model: str
    source: str
    lr: float

    @property
    def label(self) -> str:
        return f"{self.source} lr {self.lr:g}"


def _architecture(net: nn.Module) -> tuple:
    """What must agree for nets to share a vmapped forward: module types, parameter and buffer shapes."""
    return (tuple((name, type(module)) for name, module in net.named_modules()),
            tuple((name, tuple(t.shape), t.dtype) for name, t in net.state_dict().items()))


# inputs per vmapped step (runs x batch x values per image) above which the runs are trained in smaller groups
MAX_VALUES_PER_STEP = 2 ** 22


def trains_together(net: nn.Module) -> bool:
    """Whether runs of `net` are trained together. Not with a convolution: vmap runs it as one grouped
    convolution, which on 2 CPU cores made the MNIST ResNet8's 18 runs 5.5 s a step, 2.6x their time one at a time
    (0.12 s a step each); an MLP's runs, whose steps are mostly per-step overhead, take 2.5x less time together."""
    return not any(isinstance(module, nn.modules.conv._ConvNd) for module in net.modules())


def _groups(runs: list[_Run], nets: dict[str, nn.Module], batch_size: int, image_values: int) -> list[list[_Run]]:
    """The runs split into groups trained together: nets of one architecture, at most MAX_VALUES_PER_STEP input
    values per step (at least one run); one run per group where the net does not train together."""
    by_architecture: dict[tuple, list[_Run]] = {}
    for run in runs:
        by_architecture.setdefault(_architecture(nets[run.model]), []).append(run)
    most = max(1, MAX_VALUES_PER_STEP // max(1, batch_size * image_values))
    groups = []
    for same in by_architecture.values():
        size = most if trains_together(nets[same[0].model]) else 1
        groups += [same[i:i + size] for i in range(0, len(same), size)]
    return groups


def _train_together(runs: list[_Run], nets: dict[str, nn.Module], sources: dict[str, ImageBatchDataset],
                    forget: ImageBatchDataset, wanted: list[int], batch_size: int, seed: int, device,
                    tick) -> dict[_Run, dict]:
    """{run: {steps: forget scores}} for runs of one architecture, trained side by side: parameters stacked on a
    leading run axis (one Adam parameter group per learning rate, so each run gets its own rate), buffers (batch
    norm statistics) stacked likewise, one vmapped cross entropy per step summed over the runs (the runs share no
    parameter, so each gets its own gradient)."""
    rates = list(dict.fromkeys(run.lr for run in runs))
    runs = sorted(runs, key=lambda run: rates.index(run.lr))  # the stacked axis: runs grouped by rate
    base = copy.deepcopy(nets[runs[0].model]).to(device)
    states = {name: {key: value.detach().to(device) for key, value in
                     [*nets[name].named_parameters(), *nets[name].named_buffers()]} for name in {r.model for r in runs}}
    names = [name for name, _ in base.named_parameters()]
    leaves = {lr: {name: torch.stack([states[r.model][name] for r in runs if r.lr == lr]).requires_grad_()
                   for name in names} for lr in rates}
    buffers = {name: torch.stack([states[r.model][name] for r in runs]) for name, _ in base.named_buffers()}
    optimizer = torch.optim.Adam([{"params": list(leaves[lr].values()), "lr": lr} for lr in rates])
    feeds = {name: _Batches(sources[name], batch_size, seed) for name in {r.source for r in runs}}

    def stacked() -> dict[str, torch.Tensor]:
        return {name: torch.cat([leaves[lr][name] for lr in rates]) for name in names}

    def logits(params, buffers, images):
        return functional_call(base, (params, buffers), (images,))

    def loss(params, buffers, images, labels):
        return F.cross_entropy(logits(params, buffers, images), labels)

    forget_images, forget_labels = forget.everything()
    forget_images, out = forget_images.to(device), {run: {} for run in runs}
    for step in range(1, wanted[-1] + 1):
        drawn = {name: feed.next() for name, feed in feeds.items()}
        images = torch.stack([drawn[r.source][0] for r in runs]).to(device)
        labels = torch.stack([drawn[r.source][1] for r in runs]).to(device)
        base.train()
        optimizer.zero_grad()
        vmap(loss, randomness="different")(stacked(), buffers, images, labels).sum().backward()
        optimizer.step()
        if step in wanted:
            base.eval()
            with torch.no_grad():
                probs = vmap(logits, in_dims=(0, 0, None))(stacked(), buffers, forget_images).softmax(-1)
            for run, run_probs in zip(runs, probs.double().cpu()):
                out[run][str(step)] = _scores(run_probs, forget_labels)
        tick()
    return out


def relearn_each(nets: dict[str, nn.Module], sources: dict[str, ImageBatchDataset], forget: ImageBatchDataset,
                 steps: list[int], lrs: list[float], batch_size: int, seed: int, device,
                 progress=None) -> dict[str, tuple[dict, dict]]:
    """{model: (worst, runs)} for every net in `nets` (untouched; copies are finetuned): `runs` {"<source> lr
    <lr>": {steps: scores}} is the relearning attack from every source at every learning rate, `worst` {steps:
    scores} holds, per number of steps, the highest forget CD, worst image's CD and forget accuracy over the runs,
    and `run`, the run with the highest forget CD (NaN counts as the highest). The runs are trained together
    (_train_together) where the net allows (trains_together), else one at a time; `progress(done, total)` is
    called after each step of each group."""
    runs = [_Run(model, source, float(lr)) for model in nets for source in sources for lr in dict.fromkeys(lrs)]
    wanted = sorted({int(s) for s in steps})
    image_values = next(iter(sources.values()))[[0]][0][0].numel()
    groups = _groups(runs, nets, batch_size, image_values)
    total, done = len(groups) * wanted[-1], 0

    def tick():
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    scores: dict[_Run, dict] = {}
    for group in groups:
        if len(group) == 1:
            run = group[0]
            scores[run] = relearn_attack(nets[run.model], sources[run.source], forget, wanted, run.lr, batch_size,
                                         seed, device, tick)
            continue
        try:
            scores |= _train_together(group, nets, sources, forget, wanted, batch_size, seed, device, tick)
        except (RuntimeError, NotImplementedError) as error:  # a layer vmap cannot batch: one run at a time
            log.warning("relearning attack: the runs of %s cannot be trained together (%s); one at a time",
                        group[0].model, str(error).splitlines()[0][:120])
            for run in group:
                scores[run] = relearn_attack(nets[run.model], sources[run.source], forget, wanted, run.lr,
                                             batch_size, seed, device)
    return {model: _worst({run.label: scores[run] for run in runs if run.model == model}) for model in nets}


def relearn_worst(net: nn.Module, sources: dict[str, ImageBatchDataset], forget: ImageBatchDataset,
                  steps: list[int], lrs: list[float], batch_size: int, seed: int, device,
                  progress=None) -> tuple[dict, dict]:
    """(worst, runs) of relearn_each for one net."""
    return relearn_each({"net": net}, sources, forget, steps, lrs, batch_size, seed, device, progress)["net"]


def _worst(runs: dict[str, dict]) -> tuple[dict, dict]:
    worst = {}
    for count in next(iter(runs.values())):
        rows = {name: scores[count] for name, scores in runs.items()}
        worst[count] = {key: max((row[key] for row in rows.values()), key=_nan_highest) for key in _SCORES}
        worst[count]["run"] = max(rows, key=lambda name: _nan_highest(rows[name]["forget_conf_dist"]))
    return worst, runs


def retain_subset(retain: ImageBatchDataset, size: int | None, seed: int) -> ImageBatchDataset:
    """`size` retain images drawn without replacement by `seed` (all of them when None or larger), unaugmented:
    the attacker's sample of the data the model keeps."""
    count = len(retain) if size is None else min(int(size), len(retain))
    chosen = torch.randperm(len(retain), generator=torch.Generator().manual_seed(seed))[:count].sort().values
    return ImageBatchDataset(retain.images[chosen], retain.labels[chosen])


_SCORES = ("forget_conf_dist", "forget_acc", "forget_worst_conf_dist")


def _nan_highest(value: float) -> float:
    return math.inf if math.isnan(value) else value
