"""CIFAR10 / CIFAR100 from their official python files without running them.

The official files (`cifar-10-batches-py/data_batch_1..5, test_batch`, `cifar-100-python/train, test`) are
Python pickles. torchvision's CIFAR classes read them with `pickle.load`, which runs whatever a file names, so
a tampered copy from a mirror would run code. Here they are read by an unpickler that resolves only the four
names a CIFAR file holds (numpy's array reconstruction, `numpy.ndarray`, `numpy.dtype`, and `_codecs.encode`,
which Python 3 writes for bytes at protocol 2); any other name stops the read before anything is built. The
result must then be a dict with a uint8 `data` array of N x 3072 and N integer labels.

Downloading (data.download=true) uses torchvision's own URL and MD5 check; the archive is then read the same
way.
"""

import io
import pickle
from pathlib import Path

import numpy as np
import torch

ALLOWED_GLOBALS = frozenset({
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
})

FILES = {  # data set -> (folder, training files, test files, label key)
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], "labels"),
    "cifar100": ("cifar-100-python", ["train"], ["test"], "fine_labels"),
}
META = {"cifar10": ("batches.meta", "label_names"), "cifar100": ("meta", "fine_label_names")}


class _CifarUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which a CIFAR file never holds (refused, "
                                         f"nothing in it was run)")
        return super().find_class(module, name)


def _unpickle(path: Path):
    """A CIFAR file's content, through the unpickler that resolves ALLOWED_GLOBALS only."""
    return _CifarUnpickler(io.BytesIO(path.read_bytes()), encoding="latin1").load()


def read_batch(path: Path, label_key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One CIFAR batch file as uint8 [N, 3, 32, 32] images and int64 labels."""
    batch = _unpickle(path)
    if not isinstance(batch, dict):
        raise TypeError(f"{path.name} holds a {type(batch).__name__}, not a CIFAR batch (a dict)")
    batch = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in batch.items()}
    data, labels = batch.get("data"), batch.get(label_key)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        found = f"{data.dtype} {list(data.shape)}" if isinstance(data, np.ndarray) else type(data).__name__
        raise ValueError(f"{path.name}: 'data' must be a uint8 N x 3072 array, found {found}")
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu" or labels.shape != (len(data),):
        raise ValueError(f"{path.name}: {label_key!r} must be {len(data)} integers, found {labels.dtype} "
                         f"{list(labels.shape)}")
    images = torch.from_numpy(np.ascontiguousarray(data)).view(-1, 3, 32, 32)
    return images, torch.from_numpy(labels.astype(np.int64))


def read_class_names(path: Path, key: str) -> tuple[str, ...]:
    """The class names in CIFAR's meta file (`label_names` / `fine_label_names`); () when there is none."""
    if not path.is_file():
        return ()
    meta = _unpickle(path)
    names = meta.get(key) if isinstance(meta, dict) else None
    if not isinstance(names, list) or not all(isinstance(n, str) and n.isprintable() for n in names):
        raise ValueError(f"{path.name}: {key!r} must be a list of class names")
    return tuple(names)


def load_cifar(name: str, root: Path, download: bool) -> tuple:
    """(train images, train labels, test images, test labels, class names) of `name` ("cifar10" or
    "cifar100") under root; the class names come from its meta file (none without one)."""
    folder, train_files, test_files, label_key = FILES[name]
    if download and not all((root / folder / f).is_file() for f in train_files + test_files):
        _download(name, root)
    parts = []
    for files in (train_files, test_files):
        batches = [read_batch(root / folder / f, label_key) for f in files]
        parts += [torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])]
    meta_file, names_key = META[name]
    return (*parts, read_class_names(root / folder / meta_file, names_key))


def _download(name: str, root: Path) -> None:
    """torchvision's archive for `name`, checked against torchvision's MD5, extracted under root."""
    import torchvision.datasets as tvd
    from torchvision.datasets.utils import download_and_extract_archive

    cls = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
    download_and_extract_archive(cls.url, str(root), filename=cls.filename, md5=cls.tgz_md5)


def write_batch(path: Path, images: torch.Tensor, labels: torch.Tensor, label_key: str = "labels") -> None:
    """A CIFAR batch file in the official layout (protocol 2, as the official files), for tests and benchmarks
    that need CIFAR-shaped data without the download."""
    data = images.to(torch.uint8).reshape(len(images), -1).numpy()
    record = {"batch_label": path.name, label_key: labels.tolist(), "data": data,
              "filenames": [f"{i}.png" for i in range(len(labels))]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(record, protocol=2))


def write_synthetic(name: str, root: Path, train: int, test: int, seed: int = 0) -> Path:
    """A CIFAR-shaped stand-in for `name` under root (random class templates plus noise, so a network can
    learn it): the files load_cifar reads, returned as data.root."""
    folder, train_files, test_files, label_key = FILES[name]
    classes = 10 if name == "cifar10" else 100
    generator = torch.Generator().manual_seed(seed)
    templates = torch.rand(classes, 3, 32, 32, generator=generator) * 255
    for files, count in ((train_files, train), (test_files, test)):
        sizes = [count // len(files) + (i < count % len(files)) for i in range(len(files))]
        for file, size in zip(files, sizes, strict=True):
            labels = torch.randint(0, classes, (size,), generator=generator)
            noise = torch.randn(size, 3, 32, 32, generator=generator) * 40
            images = (templates[labels] + noise).clamp(0, 255).round()
            write_batch(root / folder / file, images, labels, label_key)
    meta_file, names_key = META[name]
    (root / folder / meta_file).write_bytes(pickle.dumps({names_key: [f"class{i}" for i in range(classes)]},
                                                         protocol=2))
    return root
