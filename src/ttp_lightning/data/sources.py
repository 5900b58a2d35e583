"""Registered image data sets: each conf/data/<name>.yaml names its loader by `loader._target_` (a Source
subclass, built by Hydra with its shape, classes and statistics), which reads the data set's files into memory
as uint8 NCHW tensors with integer labels. A new data set is one YAML (with an existing Source, e.g. another
torchvision class) or one YAML plus one Source subclass, importable from anywhere (docs/extending.md).
"""

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from ttp_lightning.core.dataset_info import DatasetInfo
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.data.arrays import ImageArrays
from ttp_lightning.data.cifar import load_cifar
from ttp_lightning.data.images import Preprocess, load_imagefolder
from ttp_lightning.data.tinyimagenet import load_tinyimagenet


class Source:
    """A data set's loader: what a model needs to know about it (`info`) and how its official train and test
    partitions are read (`read`); `load` adds the one-line errors for missing or corrupt files."""

    reads_root = True  # whether data.root is where the files are read from

    def __init__(self, num_classes: int, channels: int, image_size: int, mean, std, expected_files: str,
                 has_official_split: bool = True):
        self.info = DatasetInfo(int(num_classes), int(channels), int(image_size), tuple(float(m) for m in mean),
                                tuple(float(s) for s in std), has_official_split=bool(has_official_split))
        self.expected_files = expected_files  # shown in the "not found" error

    def read(self, root: Path, download: bool) -> ImageArrays:
        raise NotImplementedError(f"{type(self).__name__}.read")

    def preprocess(self, info: DatasetInfo) -> Preprocess:
        """How a forget image file (data.forget.images) becomes one of this data set's images: its channels and
        exact size."""
        return Preprocess(info.channels, info.image_size)

    def load(self, name: str, root: str | Path, download: bool) -> tuple[DatasetInfo, ImageArrays]:
        """Read the data set, turning "files missing and no download" into one clear error."""
        root = Path(root).expanduser().resolve()
        try:
            arrays = self.read(root, download)
        except TTPUserError:
            raise
        except Exception as exc:  # torchvision raises RuntimeError / URLError / FileNotFoundError
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if not _is_missing(exc):
                raise TTPUserError(f"data set {name!r} under {root} could not be read; its files look corrupt or "
                                   f"truncated (expected {self.expected_files}; {reason})") from exc
            how = "and the download failed" if download else "and data.download=false"
            raise TTPUserError(
                f"data set {name!r} not found under {root} {how} (expected {self.expected_files}; {reason})"
            ) from exc
        _check_labels(name, root, self.info.num_classes, arrays)
        if arrays.class_names and len(arrays.class_names) != self.info.num_classes:
            raise TTPUserError(f"data set {name!r} under {root} names {len(arrays.class_names)} classes; it has "
                               f"{self.info.num_classes} (its files look corrupt)")
        return replace(self.info, class_names=arrays.class_names), arrays


def _as_nchw(images) -> torch.Tensor:
    """MNIST-like [N, H, W] gets its channel axis; SVHN is already [N, C, H, W]."""
    tensor = torch.as_tensor(np.asarray(images), dtype=torch.uint8)
    return tensor.unsqueeze(1) if tensor.ndim == 3 else tensor


class TorchvisionSource(Source):
    """A torchvision data set class (MNIST, KMNIST, FashionMNIST, SVHN, ...); `split_kw` is how that class
    names its train/test switch (`train` or `split`)."""

    def __init__(self, class_name: str, split_kw: str = "train", **info):
        super().__init__(**info)
        self.class_name, self.split_kw = class_name, split_kw

    def read(self, root: Path, download: bool) -> ImageArrays:
        import torchvision.datasets as tvd

        cls = getattr(tvd, self.class_name)
        parts = []
        for is_train in (True, False):
            switch = {"train": is_train} if self.split_kw == "train" else {"split": "train" if is_train else "test"}
            dataset = cls(root=str(root), download=download, **switch)
            labels = getattr(dataset, "targets", None)
            if labels is None:
                labels = dataset.labels
            parts += [_as_nchw(dataset.data), torch.as_tensor(np.asarray(labels), dtype=torch.long)]
        return ImageArrays(*parts)


class CifarSource(Source):
    """CIFAR's official python files, read without running them (data/cifar.py; torchvision would unpickle)."""

    def __init__(self, variant: str, **info):
        super().__init__(**info)
        self.variant = variant

    def read(self, root: Path, download: bool) -> ImageArrays:
        *arrays, names = load_cifar(self.variant, root, download)
        return ImageArrays(*arrays, class_names=names)


class DigitsSource(Source):
    """scikit-learn's bundled 8x8 digits (values 0..16) rescaled to uint8; no official split exists."""

    reads_root = False  # bundled with scikit-learn: data.root is not read (run/validation warns when it is set)

    def read(self, root: Path, download: bool) -> ImageArrays:
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = torch.as_tensor(np.round(digits.images * (255.0 / 16.0)), dtype=torch.uint8).unsqueeze(1)
        labels = torch.as_tensor(digits.target, dtype=torch.long)
        empty_images = images[:0]
        return ImageArrays(images, labels, empty_images, labels[:0])


class ImageFolderSource(Source):
    """data=imagefolder: the user's own images, <data.root>/train/<class>/* and (optional) test/<class>/*
    (data/images.load_imagefolder). Their shape, classes and statistics come from the images, not the YAML;
    `image_size` and `channels` (data.image_size, data.channels) resize and convert them, and the forget images
    the same way; `decoded_cache` keeps the decoded pixels between runs."""

    def __init__(self, image_size: int | None = None, channels: int | None = None, decoded_cache: str | None = None):
        self.image_size, self.channels, self.decoded_cache = image_size, channels, decoded_cache
        self._preprocess: Preprocess | None = None

    def load(self, name: str, root: str | Path, download: bool) -> tuple[DatasetInfo, ImageArrays]:
        info, arrays, self._preprocess = load_imagefolder(root, self.image_size, self.channels, self.decoded_cache)
        return info, arrays

    def preprocess(self, info: DatasetInfo) -> Preprocess:
        return self._preprocess


class TinyImageNetSource(Source):
    """TinyImageNet as the official zip lays it out (or with val in class folders), read by data/tinyimagenet.py."""

    def read(self, root: Path, download: bool) -> ImageArrays:
        *arrays, names = load_tinyimagenet(root, download)
        return ImageArrays(*arrays, class_names=names)  # the WordNet ids, as train/'s folders name them


def _is_missing(exc: Exception) -> bool:
    """torchvision's "files are not there" (as opposed to files that are there but unreadable)."""
    return isinstance(exc, FileNotFoundError) or "not found" in str(exc).lower() or "download" in str(exc).lower()


def _check_labels(name: str, root: Path, num_classes: int, arrays: ImageArrays) -> None:
    """Every label must be a class index; a corrupt label file otherwise fails deep inside training."""
    for part, labels in (("training", arrays.train_labels), ("test", arrays.test_labels)):
        bad = labels[(labels < 0) | (labels >= num_classes)]
        if len(bad):
            raise TTPUserError(f"data set {name!r} under {root} has label {int(bad[0])} in its {part} labels; "
                               f"allowed 0..{num_classes - 1} (a corrupt label file?)")
