"""Whole-batch indexing of in-memory images and a DDP-aware batch sampler (no per-item collate)."""

import copy

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Sampler


def random_crop_flip(images: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """Standard small-image augmentation on a batch: random crop after zero padding, then a horizontal flip.

    The draws come from `generator` (on the host, so a batch held on a GPU draws what it would on the CPU);
    the crops are one gather on the images' own device, not a loop over images."""
    n, channels, height, width = images.shape
    padded = torch.nn.functional.pad(images, (padding,) * 4)
    offsets = torch.randint(0, 2 * padding + 1, (n, 2), generator=generator)
    flips = (torch.rand(n, generator=generator) < 0.5).long()
    draws = to_device(torch.cat([offsets, flips[:, None]], dim=1), images.device)  # one copy, no wait
    offsets, flips = draws[:, :2], draws[:, 2].bool()
    rows = offsets[:, :1] + torch.arange(height, device=images.device)  # [n, H]
    columns = torch.arange(width, device=images.device).expand(n, width)
    columns = offsets[:, 1:] + torch.where(flips[:, None], columns.flip(-1), columns)  # [n, W]
    return padded[torch.arange(n, device=images.device)[:, None, None, None],
                  torch.arange(channels, device=images.device)[None, :, None, None],
                  rows[:, None, :, None], columns[:, None, None, :]]


AUGMENTATIONS = {"none": None, "crop_flip": random_crop_flip}


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`. To a GPU it goes through pinned memory without a wait: a copy from
    ordinary (pageable) host memory can make the host wait for the device's queue, and such waits after
    every step cost the H200 pipeline 10-27 % of its speed (docs/cluster-and-gpu.md, GPU speed)."""
    if tensor.device == device:
        return tensor
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


class ImageBatchDataset(Dataset):
    """Images + labels, indexed by a list of positions; returns float images in [0, 1]. Images are uint8
    (real data) or float already in pixel units (synthetic points finer than 1/255, noisy copies)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, augment: str = "none", seed: int = 0):
        self.images, self.labels = images, labels
        self.augment = AUGMENTATIONS[augment]
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)

    def set_epoch(self, epoch: int) -> None:
        """Augmentation draws of epoch `epoch` come from (seed, epoch) alone, so a resumed fit draws what an
        uninterrupted one would."""
        self.generator.manual_seed(self.seed * 1_000_003 + epoch)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        first, last = positions[0], positions[-1]
        if last - first + 1 == len(positions) and positions == list(range(first, last + 1)):
            index = slice(first, last + 1)  # unshuffled chunks: a view, no gather
        else:
            index = to_device(torch.as_tensor(positions, dtype=torch.long), self.images.device)
        images = self.images[index]
        images = images.float().div_(255.0) if images.dtype == torch.uint8 else images.float().clone()
        if self.augment is not None:
            images = self.augment(images, self.generator)
        return images, self.labels[index]

    def everything(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All images (float, [0, 1]) and labels in order, as two tensors."""
        return self[list(range(len(self)))]

    def augment_name(self) -> str:
        return next(name for name, fn in AUGMENTATIONS.items() if fn is self.augment)

    def take(self, positions: torch.Tensor) -> "ImageBatchDataset":
        """The images and labels at `positions` (a long tensor), with the same augmentation and seed."""
        return ImageBatchDataset(self.images[positions], self.labels[positions], self.augment_name(), self.seed)

    def with_positions(self) -> "PositionedBatchDataset":
        """The same images, labels, augmentation and seed; each batch also carries its images' positions."""
        return PositionedBatchDataset(self.images, self.labels, self.augment_name(), self.seed)

    def relabelled(self, labels: torch.Tensor) -> "ImageBatchDataset":
        """The same images, augmentation and seed with other labels (one per image, in order)."""
        if labels.shape != self.labels.shape:
            raise ValueError(f"{len(labels)} labels for {len(self.labels)} images")
        view = copy.copy(self)
        view.labels, view.generator = labels, torch.Generator().manual_seed(self.seed)
        return view


class PositionedBatchDataset(ImageBatchDataset):
    """An ImageBatchDataset whose batches are (images, labels, positions): robust Alg 1's inner attack keeps a
    perturbation per forget image across the steps that visit it (alg1/module.py)."""

    def __getitem__(self, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        images, labels = super().__getitem__(positions)
        return images, labels, torch.as_tensor(positions, dtype=torch.long)


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class ShardedBatchSampler(Sampler[list[int]]):
    """Batches of positions, shuffled per epoch from a seed; under DDP each rank takes its own shard.

    Training shards are cut to equal length so all ranks take the same number of steps; evaluation
    shards (`equal_shards=False`) are disjoint and complete, so summed metrics count every instance once.
    """

    def __init__(self, size: int, batch_size: int, shuffle: bool, drop_last: bool, seed: int = 0,
                 equal_shards: bool = True, sharded: bool = True, on_epoch=None):
        self.sharded, self.on_epoch = sharded, on_epoch
        self.size, self.batch_size = size, batch_size
        self.shuffle, self.drop_last, self.seed, self.equal_shards = shuffle, drop_last, seed, equal_shards
        self.epoch = 0

    def _rank_and_world(self) -> tuple[int, int]:
        return _rank_and_world() if self.sharded else (0, 1)

    def _shard(self) -> torch.Tensor:
        rank, world = self._rank_and_world()
        if self.shuffle:
            order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        else:
            order = torch.arange(self.size)
        shard = order[rank::world]
        if self.equal_shards:
            shard = shard[: self.size // world]
        return shard

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning before every training epoch (the epoch counter of a resumed fit included)."""
        self.epoch = epoch

    def __iter__(self):
        shard = self._shard()
        if self.on_epoch is not None:
            self.on_epoch(self.epoch)
        self.epoch += 1
        stop = len(shard) - len(shard) % self.batch_size if self.drop_last else len(shard)
        for start in range(0, stop, self.batch_size):
            yield shard[start : start + self.batch_size].tolist()

    def __len__(self) -> int:
        _, world = self._rank_and_world()
        n = self.size // world if self.equal_shards else -(-self.size // world)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


def batch_loader(dataset: ImageBatchDataset, batch_size: int, shuffle: bool = False, drop_last: bool = False,
                 seed: int = 0, training: bool = True, sharded: bool = True, num_workers: int = 0) -> DataLoader:
    """A DataLoader that fetches whole batches by fancy indexing (this rank's shard unless `sharded=False`)."""
    batch_size = max(1, min(batch_size, len(dataset)))
    sampler = ShardedBatchSampler(len(dataset), batch_size, shuffle, drop_last, seed, equal_shards=training,
                                  sharded=sharded, on_epoch=getattr(dataset, "set_epoch", None) if training else None)
    # its own generator: a DataLoader without one draws its workers' base seed from the global generator every time
    # it is iterated, so the loaders (a sanity check's too) would move the stream robust Alg 1's inner attack and
    # dropout draw from, and a resumed fit, which iterates its loaders once more, would not take the same steps
    return DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=num_workers,
                      persistent_workers=num_workers > 0, generator=torch.Generator().manual_seed(seed))


def iterate_shard(dataset: ImageBatchDataset, chunk_size: int, sharded: bool = True):
    """This rank's complete, disjoint share of `dataset` in chunks (the whole set on a single process, or
    everywhere with `sharded=False`)."""
    sampler = ShardedBatchSampler(len(dataset), chunk_size, shuffle=False, drop_last=False, equal_shards=False,
                                  sharded=sharded)
    for positions in sampler:
        yield dataset[positions]
