"""TinyImageNet read with the project's own image reader (data/images.py: Pillow decodes pixels and nothing
else; every bad file is one error line naming it), from the layout of the official zip or from class folders.

    tiny-imagenet-200/train/<wnid>/images/<wnid>_<n>.JPEG   (and <wnid>_boxes.txt, ignored)
    tiny-imagenet-200/val/images/val_<n>.JPEG + val/val_annotations.txt   (file, wnid, box; tab-separated)
or  tiny-imagenet-200/val/<wnid>/<image>                                  (val sorted into class folders)

The labelled val split is the test set (the official test split has no labels). Class names are the WordNet
ids of train/'s folders, sorted. TinyImageNet holds some grey-scale JPEGs among its colour ones; those are
made RGB here (each channel the grey value), for this registered data set only: the reader never converts
a forget image a user sends between grey and colour.
"""

from pathlib import Path

import torch

from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.data.images import (
    IMAGE_SUFFIXES,
    Preprocess,
    class_tree,
    read_file,
)

FOLDER = "tiny-imagenet-200"
ANNOTATIONS = "val_annotations.txt"
PREP = Preprocess(channels=3, image_size=64)


def _images(files: list[tuple[Path, str]]) -> list[tuple[Path, str]]:
    """The image files among (file, class) pairs (the official zip keeps a boxes .txt beside each class's images)."""
    return [(path, name) for path, name in files if path.suffix.lower() in IMAGE_SUFFIXES]


def train_files(folder: Path) -> list[tuple[Path, str]]:
    """(image, wnid) under train/<wnid>/ (any depth), sorted."""
    everything = class_tree(folder, "TinyImageNet train")
    files = _images(everything)
    empty = sorted({name for _, name in everything} - {name for _, name in files})
    if empty:
        raise TTPUserError(f"TinyImageNet train folder {str(folder / empty[0])!r} holds no JPEG or PNG images")
    return files


def val_files(folder: Path, classes: list[str]) -> list[tuple[Path, str]]:
    """(image, wnid) of the val split: from val_annotations.txt and val/images/ (the official zip), else from
    val/<wnid>/ folders. Every wnid must be one of train's, and every image in val/images/ must be listed."""
    table = folder / ANNOTATIONS
    known = set(classes)
    if not table.is_file():
        files = _images(class_tree(folder, "TinyImageNet val"))
        unknown = sorted({name for _, name in files} - known)
        if unknown:
            raise TTPUserError(f"TinyImageNet val folder {str(folder / unknown[0])!r} is not a class of train/ "
                               f"(its {len(classes)} WordNet ids)")
        return files
    try:
        lines = table.read_text().splitlines()
    except UnicodeDecodeError as exc:
        raise TTPUserError(f"{str(table)!r} cannot be read as text ({exc})") from None
    listed = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2 or not fields[0] or Path(fields[0]).name != fields[0]:
            raise TTPUserError(f"{str(table)!r} line {number} is {line[:80]!r}; expected <file name>\\t<wnid>[\\t<box>]")
        if fields[1] not in known:
            raise TTPUserError(f"{str(table)!r} line {number} labels {fields[0]!r} with {fields[1]!r}, which is "
                               f"not a class of train/ (its {len(classes)} WordNet ids)")
        path = folder / "images" / fields[0]
        if not path.is_file():
            raise TTPUserError(f"{str(table)!r} line {number} names {fields[0]!r}, which is not a file in "
                               f"{str(folder / 'images')!r}")
        listed.append((path, fields[1]))
    named = {path.name for path, _ in listed}
    stray = sorted(p for p in (folder / "images").glob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
                   and p.name not in named)
    if stray:
        raise TTPUserError(f"TinyImageNet val image {str(stray[0])!r} has no line in {ANNOTATIONS}; every val "
                           "image needs its class")
    if not listed:
        raise TTPUserError(f"{str(table)!r} lists no images")
    return listed


def decode(files: list[tuple[Path, str]], classes: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 [N, 3, 64, 64] images (one decoded at a time, grey ones made RGB) and int64 labels."""
    index = {name: i for i, name in enumerate(classes)}
    images = torch.empty((len(files), PREP.channels, PREP.image_size, PREP.image_size), dtype=torch.uint8)
    for i, (path, _) in enumerate(files):
        images[i] = read_file(path, PREP, "TinyImageNet image")[0]  # grey ones repeated into RGB
    return images, torch.as_tensor([index[name] for _, name in files], dtype=torch.long)


def load_tinyimagenet(root: Path, download: bool):
    """(train images, train labels, val images, val labels, class names) under root/tiny-imagenet-200."""
    if download:
        raise TTPUserError("data set 'tinyimagenet' has no automatic download; set data.download=false")
    base = Path(root) / FOLDER
    if not (base / "train").is_dir() or not (base / "val").is_dir():
        raise FileNotFoundError(f"{base}/train and {base}/val not found")
    train = train_files(base / "train")
    classes = sorted({name for _, name in train})
    val = val_files(base / "val", classes)
    return (*decode(train, classes), *decode(val, classes), tuple(classes))
