"""Registry of image data sets, each loaded into memory as uint8 NCHW tensors with integer labels."""

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from ttp_lightning.data.arrays import ImageArrays
from ttp_lightning.data.cifar import load_cifar
from ttp_lightning.data.tinyimagenet import load_tinyimagenet
from ttp_lightning.dataset_info import DatasetInfo
from ttp_lightning.errors import TTPUserError


@dataclass(frozen=True)
class DataSource:
    info: DatasetInfo
    load: Callable[[Path, bool], ImageArrays]
    expected_files: str  # shown in the "not found" error


def _as_nchw(images) -> torch.Tensor:
    """MNIST-like [N, H, W] gets its channel axis; SVHN is already [N, C, H, W]."""
    tensor = torch.as_tensor(np.asarray(images), dtype=torch.uint8)
    return tensor.unsqueeze(1) if tensor.ndim == 3 else tensor


def _torchvision_loader(class_name: str, split_kw: str = "train") -> Callable:
    """Load a torchvision data set class; `split_kw` is how that class names its train/test switch."""

    def load(root: Path, download: bool) -> ImageArrays:
        import torchvision.datasets as tvd

        cls = getattr(tvd, class_name)
        parts = []
        for is_train in (True, False):
            switch = {"train": is_train} if split_kw == "train" else {"split": "train" if is_train else "test"}
            dataset = cls(root=str(root), download=download, **switch)
            labels = getattr(dataset, "targets", None)
            if labels is None:
                labels = dataset.labels
            parts += [_as_nchw(dataset.data), torch.as_tensor(np.asarray(labels), dtype=torch.long)]
        return ImageArrays(*parts)

    return load


def _cifar_loader(name: str) -> Callable:
    """CIFAR's official python files, read without running them (data/cifar.py; torchvision would unpickle)."""

    def load(root: Path, download: bool) -> ImageArrays:
        *arrays, names = load_cifar(name, root, download)
        return ImageArrays(*arrays, class_names=names)

    return load


def _load_digits(root: Path, download: bool) -> ImageArrays:
    """scikit-learn's bundled 8x8 digits (values 0..16) rescaled to uint8; no official split exists."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.as_tensor(np.round(digits.images * (255.0 / 16.0)), dtype=torch.uint8).unsqueeze(1)
    labels = torch.as_tensor(digits.target, dtype=torch.long)
    empty_images = images[:0]
    return ImageArrays(images, labels, empty_images, labels[:0])


def _load_tinyimagenet(root: Path, download: bool) -> ImageArrays:
    """TinyImageNet as the official zip lays it out (or with val in class folders), read by data/tinyimagenet.py."""
    *arrays, names = load_tinyimagenet(root, download)
    return ImageArrays(*arrays, class_names=names)  # the WordNet ids, as train/'s folders name them


_MNIST_FILES = "train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte"

DATA_SOURCES: dict[str, DataSource] = {
    "digits": DataSource(
        DatasetInfo(10, 1, 8, (0.3048,), (0.3753,), has_official_split=False),
        _load_digits,
        "nothing (bundled with scikit-learn)",
    ),
    "mnist": DataSource(
        DatasetInfo(10, 1, 28, (0.1307,), (0.3081,)),
        _torchvision_loader("MNIST"),
        f"MNIST/raw/{{{_MNIST_FILES}}}",
    ),
    "kmnist": DataSource(
        DatasetInfo(10, 1, 28, (0.1918,), (0.3483,)),
        _torchvision_loader("KMNIST"),
        f"KMNIST/raw/{{{_MNIST_FILES}}}",
    ),
    "fashion_mnist": DataSource(
        DatasetInfo(10, 1, 28, (0.2860,), (0.3530,)),
        _torchvision_loader("FashionMNIST"),
        f"FashionMNIST/raw/{{{_MNIST_FILES}}}",
    ),
    "svhn": DataSource(
        DatasetInfo(10, 3, 32, (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)),
        _torchvision_loader("SVHN", split_kw="split"),
        "train_32x32.mat, test_32x32.mat",
    ),
    "cifar10": DataSource(
        DatasetInfo(10, 3, 32, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
        _cifar_loader("cifar10"),
        "cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}",
    ),
    "cifar100": DataSource(
        DatasetInfo(100, 3, 32, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
        _cifar_loader("cifar100"),
        "cifar-100-python/{train, test, meta}",
    ),
    "tinyimagenet": DataSource(
        DatasetInfo(200, 3, 64, (0.4802, 0.4481, 0.3975), (0.2770, 0.2691, 0.2821)),
        _load_tinyimagenet,
        "tiny-imagenet-200/train/<wnid>/images/*.JPEG and tiny-imagenet-200/val/images/*.JPEG with "
        "val/val_annotations.txt (the official zip), or val/<wnid>/<image>",
    ),
}


def load_source(name: str, root: str | Path, download: bool) -> tuple[DatasetInfo, ImageArrays]:
    """Load a registered data set, turning "files missing and no download" into one clear error."""
    if name not in DATA_SOURCES:
        raise TTPUserError(f"unknown data set {name!r}; choose one of: {', '.join(DATA_SOURCES)}")
    source = DATA_SOURCES[name]
    root = Path(root).expanduser().resolve()
    try:
        arrays = source.load(root, download)
    except TTPUserError:
        raise
    except Exception as exc:  # torchvision raises RuntimeError / URLError / FileNotFoundError
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if not _is_missing(exc):
            raise TTPUserError(f"data set {name!r} under {root} could not be read; its files look corrupt or "
                               f"truncated (expected {source.expected_files}; {reason})") from exc
        how = "and the download failed" if download else "and data.download=false"
        raise TTPUserError(
            f"data set {name!r} not found under {root} {how} (expected {source.expected_files}; {reason})"
        ) from exc
    _check_labels(name, root, source.info.num_classes, arrays)
    if arrays.class_names and len(arrays.class_names) != source.info.num_classes:
        raise TTPUserError(f"data set {name!r} under {root} names {len(arrays.class_names)} classes; it has "
                           f"{source.info.num_classes} (its files look corrupt)")
    return replace(source.info, class_names=arrays.class_names), arrays


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
