"""Gradients and Hessian-vector products (Pearlmutter) of the Pareto objective, memory O(#params);
fp32 by default (`dtype`), whatever precision the model was trained in (autocast is switched off).

With `sharded=True` under DDP every rank runs its own disjoint share of the data and the sums are
all-reduced before the division by the global counts, so each rank does 1 / world of the forward-backward
work and all ranks hold the same full-data result (the full-batch Pareto path sums the same way).

Products are with H + lambda I, H the Hessian of theta * L_K(D_f) + (1 - theta) * L_A(D_r) (dataset
means); the gradient is that of the unregularised objective, as in Algs 2-4. The model is
evaluated in eval mode: BatchNorm uses its running statistics, which stay frozen (no forward pass
mutates them), so every product is a product with one fixed matrix. The certified methods first
recompute those statistics on the retain set (`refresh_batchnorm`), so the released buffers, which carry
no noise, do not depend on the forget set. timm's fused attention kernels are switched off: they have
no double backward.
"""

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

from ttp_lightning.core import stopping
from ttp_lightning.core.batching import ImageBatchDataset, iterate_shard
from ttp_lightning.core.nn_modes import trainable
from ttp_lightning.core.objectives import retain_loss

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (logits, labels) -> batch-mean loss


def flatten(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten(vector: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    out, offset = [], 0
    for ref in like:
        out.append(vector[offset : offset + ref.numel()].view_as(ref))
        offset += ref.numel()
    return out


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """The sum (or max) of `tensor` over the DDP ranks, in place; unchanged on a single process."""
    if distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return tensor


def chunks(dataset: ImageBatchDataset, chunk_size: int, device: torch.device, dtype: torch.dtype,
           sharded: bool = False):
    """The dataset in order on `device` in `dtype`: all of it, or with `sharded` this DDP rank's share."""
    for images, labels in iterate_shard(dataset, chunk_size, sharded=sharded):
        stopping.check()  # a pass over the data is the unit of a long certified step's work
        yield images.to(device, dtype), labels.to(device)


def refresh_batchnorm(net: nn.Module, dataset: ImageBatchDataset, chunk_size: int = 1024) -> bool:
    """Recompute every BatchNorm's running mean/variance from `dataset` in one train-mode pass (as
    torch.optim.swa_utils.update_bn does): the size-weighted average of the chunks' batch statistics,
    so the first layer's mean is exact. Returns whether the model has any BatchNorm."""
    norms = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return False
    momenta = [m.momentum for m in norms]
    device = next(net.parameters()).device
    was_training = net.training
    net.train()
    for norm in norms:
        norm.reset_running_stats()
    seen = 0
    with torch.no_grad():
        for images, _ in iterate_shard(dataset, chunk_size, sharded=False):
            seen += len(images)
            for norm in norms:
                norm.momentum = len(images) / seen  # running = (1 - m) running + m batch: a weighted mean
            net(images.to(device))
    for norm, momentum in zip(norms, momenta):
        norm.momentum = momentum
    net.train(was_training)
    return True


def disable_fused_attention(net: nn.Module) -> None:
    """timm attention blocks fall back to the explicit softmax(QK^T)V path, which supports double backward."""
    for module in net.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = False


class ParetoCurvature:
    """Full-data gradient and HVPs of the regularised Pareto objective at the model's current weights."""

    def __init__(self, net: nn.Module, retain: ImageBatchDataset, forget: ImageBatchDataset, theta: float,
                 uniformity: Callable[[torch.Tensor], torch.Tensor], lam: float = 0.0,
                 forget_temperature: float = 1.0, chunk_size: int = 4096, dtype: torch.dtype = torch.float32,
                 sharded: bool = False):
        self.net, self.retain, self.forget, self.dtype = net.eval().to(dtype), retain, forget, dtype
        self.sharded = sharded and distributed()
        self.instances = 0  # images this process ran forward (and backward) through, for the work measurement
        self.theta, self.lam, self.chunk_size = theta, lam, chunk_size
        self.uniformity, self.forget_temperature = uniformity, forget_temperature
        self.forget_loss: Loss = lambda logits, labels: uniformity(logits / forget_temperature)
        disable_fused_attention(self.net)
        self.params = trainable(self.net)
        self.names = [name for name, p in self.net.named_parameters() if p.requires_grad]  # same order
        self.device = self.params[0].device

    def assign(self, vector: torch.Tensor) -> None:
        """Write a flat vector into the trainable parameters (the inverse of flattening them)."""
        with torch.no_grad():
            for param, value in zip(self.params, unflatten(vector, self.params)):
                param.copy_(value)

    def weighted_terms(self):
        """(dataset, loss, weight) per part: the objective is sum_parts weight * mean loss over the part."""
        return [(self.forget, self.forget_loss, self.theta), (self.retain, retain_loss, 1.0 - self.theta)]

    def shard(self, dataset: ImageBatchDataset):
        """(images, labels) chunks of this process's share of `dataset` (all of it unless sharded)."""
        for images, labels in chunks(dataset, self.chunk_size, self.device, self.dtype, self.sharded):
            self.instances += len(labels)
            yield images, labels

    def part_sum(self, dataset: ImageBatchDataset, fn: Callable) -> torch.Tensor:
        """Sum over the dataset's chunks of fn(images, labels) (a tensor), all-reduced when sharded."""
        total = None
        with torch.autocast(self.device.type, enabled=False):
            for images, labels in self.shard(dataset):
                value = fn(images, labels)
                total = value if total is None else total + value
            if self.sharded:
                if total is None:  # more ranks than instances: this rank adds zeros of the right shape
                    images, labels = dataset[[0]]
                    total = fn(images.to(self.device, self.dtype), labels.to(self.device)) * 0
                total = all_reduce(total.contiguous())
        return total

    def part_mean(self, dataset: ImageBatchDataset, loss_fn: Loss, fn: Callable) -> torch.Tensor:
        """Mean over the dataset of a linear functional `fn` of the loss (applied to chunk loss sums)."""
        return self.part_sum(
            dataset, lambda images, labels: fn(loss_fn(self.net(images), labels) * len(labels))) / len(dataset)

    def gradient(self) -> torch.Tensor:
        """Flat gradient of theta L_K + (1 - theta) L_A, the paper's grad_{w*,K,A}: lambda enters the Newton
        steps only as the damping in (H + lambda I), not as a pull of the weights towards zero."""
        grad = torch.zeros_like(flatten(p.detach() for p in self.params))
        for dataset, loss_fn, weight in self.weighted_terms():
            if weight:
                grad = grad + weight * self.part_mean(
                    dataset, loss_fn, lambda loss: flatten(torch.autograd.grad(loss, self.params)))
        return grad

    def hvp(self, vector: torch.Tensor) -> torch.Tensor:
        """(H + lambda I) v over the full data."""
        out = self.lam * vector
        for dataset, loss_fn, weight in self.weighted_terms():
            if weight:
                out = out + weight * self.part_mean(dataset, loss_fn, lambda loss: self._hvp_of(loss, vector))
        return out

    def sample_hvp(self, part: str, vectors: torch.Tensor, batch_size: int,
                   generator: torch.Generator | None = None, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Row i: the Hessian of the part's loss (forget: L_K, retain: L_A; no theta weight, no lambda) on its
        own `batch_size` instances drawn uniformly with replacement, times vectors[i] (an unbiased sample
        of that part's Hessian). All rows in one vectorised forward-over-reverse pass. The instances of every
        row are drawn from `generator`, but only the rows in the boolean mask `keep` (default: all) are
        computed; the others are zero (a DDP rank computes its own estimator chains and draws what the
        others draw, so every chain sees the samples it would see on one process)."""
        dataset, loss_fn = {"forget": (self.forget, self.forget_loss), "retain": (self.retain, retain_loss)}[part]
        rows = len(vectors)
        positions = torch.randint(len(dataset), (rows * batch_size,), generator=generator).view(rows, batch_size)
        keep = torch.ones(rows, dtype=torch.bool) if keep is None else keep.cpu()
        out = torch.zeros_like(vectors)
        if not keep.any():
            return out
        kept = keep.nonzero().flatten()
        images, labels = dataset[positions[kept].flatten().tolist()]
        self.instances += len(labels)
        images = images.to(self.device, self.dtype).unflatten(0, (len(kept), batch_size))
        labels = labels.to(self.device).unflatten(0, (len(kept), batch_size))
        names = self.names
        weights = {name: p.detach() for name, p in zip(names, self.params)}

        def loss_at(params, batch, targets):
            return loss_fn(torch.func.functional_call(self.net, params, (batch,)), targets)

        def product(batch, targets, vector):
            tangent = dict(zip(names, unflatten(vector, self.params)))
            _, hessian_vector = torch.func.jvp(lambda params: torch.func.grad(loss_at)(params, batch, targets),
                                               (weights,), (tangent,))
            return flatten(hessian_vector[name] for name in names)

        with torch.autocast(self.device.type, enabled=False):
            out[kept.to(out.device)] = torch.func.vmap(product)(images, labels, vectors[kept.to(vectors.device)])
        return out

    def _hvp_of(self, loss: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
        grads = torch.autograd.grad(loss, self.params, create_graph=True)
        dot = sum((g * v).sum() for g, v in zip(grads, unflatten(vector, grads)))
        return flatten(torch.autograd.grad(dot, self.params)).detach()
