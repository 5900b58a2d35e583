"""Image files from the user: a data set in ImageFolder layout (`data=imagefolder`) and the forget images a
provider was sent (`data.forget.images=DIR`).

Image files are decoded by Pillow into pixels and nothing else; a file that is not a PNG or JPEG image, or
that Pillow cannot decode, is one error line naming it. Colour modes map to a channel count (grey: 1;
colour, palette, with or without alpha: 3); an image is converted within its kind, never from colour to
grey or back, so a colour photo sent for a grey-scale model is an error rather than a silent conversion.
"""

import csv
import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ttp_lightning.data.forget import fingerprint
from ttp_lightning.errors import TTPUserError
from ttp_lightning.files import atomic_tensors

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")
LABELS_FILE = "labels.csv"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Preprocess:
    """How files become uint8 [C, H, W] tensors: the channel count, and either the exact size every image
    must have (`resize=False`) or the size to resize the shorter side to and centre-crop (`resize=True`)."""

    channels: int
    image_size: int | None
    resize: bool = False


def channels_of(mode: str) -> int:
    return 1 if mode in GREY_MODES else 3


def open_image(path: Path, what: str, decode: bool = True):
    """The decoded image (`decode=False`: its header only, mode and size), or one error line naming the file."""
    from PIL import Image, UnidentifiedImageError

    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise TTPUserError(f"{what} {str(path)!r} is not an image file; allowed: PNG or JPEG files "
                           f"({', '.join(IMAGE_SUFFIXES)})")
    try:
        with Image.open(path) as image:
            if not decode:
                return image.mode, image.size
            image.load()
            return image.copy()
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise TTPUserError(f"{what} {str(path)!r} cannot be read as an image ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''})") from None


def to_tensor(image, path: Path, prep: Preprocess, what: str) -> torch.Tensor:
    """uint8 [C, H, W] pixels of `image` as `prep` says, or one error line (wrong channel count or size)."""
    import numpy as np
    from PIL import Image

    found = channels_of(image.mode)
    if found != prep.channels:
        kind = {1: "grey-scale", 3: "colour"}
        raise TTPUserError(f"{what} {str(path)!r} is a {kind[found]} image (mode {image.mode}, {found} channel"
                           f"{'s' if found > 1 else ''}); the data has {prep.channels} channel"
                           f"{'s' if prep.channels > 1 else ''} ({kind[prep.channels]})")
    image = image.convert("L" if prep.channels == 1 else "RGB")
    if prep.resize:
        width, height = image.size
        scale = prep.image_size / min(width, height)
        size = (max(prep.image_size, round(width * scale)), max(prep.image_size, round(height * scale)))
        image = image.resize(size, Image.Resampling.BILINEAR)
        left, top = (size[0] - prep.image_size) // 2, (size[1] - prep.image_size) // 2
        image = image.crop((left, top, left + prep.image_size, top + prep.image_size))
    elif prep.image_size is not None and image.size != (prep.image_size, prep.image_size):
        raise TTPUserError(f"{what} {str(path)!r} is {image.size[0]}x{image.size[1]} pixels; the data's images are "
                           f"{prep.image_size}x{prep.image_size} (data=imagefolder resizes with data.image_size=N)")
    pixels = torch.as_tensor(np.asarray(image, dtype=np.uint8).copy())
    return pixels.unsqueeze(0) if pixels.ndim == 2 else pixels.permute(2, 0, 1).contiguous()


# ------------------------------------------------------------------------------------------ image folders
def class_tree(folder: Path, what: str) -> list[tuple[Path, str]]:
    """(file, class name) for every file under `folder`/<class>/, sorted; a stray file is an error."""
    if not folder.is_dir():
        raise TTPUserError(f"{what} folder {str(folder)!r} does not exist")
    files = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if not entry.is_dir():
            raise TTPUserError(f"{what} folder {str(folder)!r} holds the file {entry.name!r} outside a class "
                               "folder; put each image in <folder>/<class name>/")
        files += [(path, entry.name) for path in sorted(entry.rglob("*"))
                  if path.is_file() and not path.name.startswith(".")]
    if not files:
        raise TTPUserError(f"{what} folder {str(folder)!r} holds no images (expected <folder>/<class>/<image>)")
    return files


def load_imagefolder(root: str | Path, image_size: int | None, channels: int | None,
                     cache_dir: str | Path | None = None):
    """`root`/train/<class>/* and `root`/test/<class>/* as (DatasetInfo, ImageArrays, Preprocess). Class
    names are the training folder's subfolder names, sorted; the channel count, image size and normalisation
    statistics come from the training images unless data.channels / data.image_size set them. With
    `cache_dir`, the decoded images are kept there (a safetensors file, keyed by every file's path, size and
    modification time and the settings), so the next run over an unchanged folder decodes nothing; it is a
    copy of the folder's pixels, so a new entry for the same folder deletes the one it replaces."""
    root = Path(root).expanduser()
    train_files = class_tree(root / "train", "data.root train")
    test_files = class_tree(root / "test", "data.root test") if (root / "test").exists() else []
    if cache_dir is None:
        return _decode_imagefolder(root, train_files, test_files, image_size, channels)
    folder = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    entry = Path(cache_dir).expanduser() / \
        f"{folder}_{_folder_key(root, train_files + test_files, image_size, channels)}.safetensors"
    cached = _read_decoded(entry, image_size)
    if cached is not None:
        return cached
    info, arrays, prep = _decode_imagefolder(root, train_files, test_files, image_size, channels)
    entry.parent.mkdir(parents=True, exist_ok=True)
    atomic_tensors(entry, {"train_images": arrays.train_images, "train_labels": arrays.train_labels,
                           "test_images": arrays.test_images, "test_labels": arrays.test_labels},
                   metadata={"format": DECODED_FORMAT, "info": json.dumps(asdict(info))})
    for superseded in entry.parent.glob(f"{folder}_*.safetensors"):  # an image removed from the folder
        if superseded != entry:                                       # leaves no copy behind here
            superseded.unlink(missing_ok=True)
    return info, arrays, prep


DECODED_FORMAT = "ttp_lightning.decoded_images/1"


def _folder_key(root: Path, files: list[tuple[Path, str]], image_size, channels) -> str:
    """What the decoded images depend on: every file (path under root, class, size, modification time) and
    the settings."""
    stats = [(path, name, path.stat()) for path, name in files]
    listing = [(str(path.relative_to(root)), name, stat.st_size, stat.st_mtime_ns) for path, name, stat in stats]
    identity = {"format": DECODED_FORMAT, "files": listing, "image_size": image_size, "channels": channels}
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:32]


def _read_decoded(entry: Path, image_size):
    """(info, arrays, prep) from a decoded-images entry; None when there is none or it cannot be read (it is
    then decoded again and rewritten)."""
    from safetensors import safe_open

    from ttp_lightning.data.sources import DatasetInfo, ImageArrays

    if not entry.is_file():
        return None
    try:
        with safe_open(str(entry), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in
                       ("train_images", "train_labels", "test_images", "test_labels")}
        if metadata.get("format") != DECODED_FORMAT:
            raise ValueError(f"format {metadata.get('format')!r}")
        fields = json.loads(metadata["info"])
        info = DatasetInfo(**{**fields, "mean": tuple(fields["mean"]), "std": tuple(fields["std"]),
                              "class_names": tuple(fields["class_names"])})
    except Exception as exc:  # noqa: BLE001 -- any unreadable entry is decoded again
        log.warning("decoded images %s are unreadable (%s: %s); decoding the folder again", entry,
                    type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        return None
    prep = Preprocess(info.channels, info.image_size, resize=image_size is not None)
    return info, ImageArrays(tensors["train_images"], tensors["train_labels"], tensors["test_images"],
                             tensors["test_labels"], class_names=info.class_names), prep


def _decode_imagefolder(root: Path, train_files, test_files, image_size: int | None, channels: int | None):
    from ttp_lightning.data.sources import DatasetInfo, ImageArrays

    classes = sorted({name for _, name in train_files})
    if len(classes) < 2:
        raise TTPUserError(f"data.root={str(root)!r}: train/ has {len(classes)} class folder; a classifier "
                           "needs at least 2")
    unknown = sorted({name for _, name in test_files} - set(classes))
    if unknown:
        raise TTPUserError(f"data.root={str(root)!r}: test/ has the class folder {unknown[0]!r}, which train/ "
                           f"does not have; allowed: {', '.join(classes)}")
    files = train_files + test_files
    headers = [open_image(path, "image", decode=False) for path, _ in files]  # mode and size, no pixels
    if channels is None:
        channels = max(channels_of(mode) for mode, _ in headers)
    if image_size is None:
        sizes = {size for _, size in headers}
        if len(sizes) != 1 or len({*next(iter(sizes))}) != 1:
            raise TTPUserError(f"data.root={str(root)!r} holds images of sizes {sorted(sizes)[:3]}; set "
                               "data.image_size=N to resize them (shorter side to N, centre crop N x N)")
        prep = Preprocess(channels, next(iter(sizes))[0])
    else:
        prep = Preprocess(channels, int(image_size), resize=True)
    index = {name: i for i, name in enumerate(classes)}
    tensors = [to_tensor(open_image(path, "image"), path, prep, "image") for path, _ in files]  # one at a time
    labels = torch.as_tensor([index[name] for _, name in files], dtype=torch.long)
    cut = len(train_files)
    train_x = torch.stack(tensors[:cut])
    test_x = torch.stack(tensors[cut:]) if test_files else train_x[:0]
    scaled = train_x.float().div(255.0)
    mean = tuple(round(float(v), 4) for v in scaled.mean(dim=(0, 2, 3)))
    std = tuple(round(max(float(v), 1e-3), 4) for v in scaled.std(dim=(0, 2, 3)))
    info = DatasetInfo(len(classes), channels, prep.image_size, mean, std, has_official_split=bool(test_files),
                       class_names=tuple(classes))
    return info, ImageArrays(train_x, labels[:cut], test_x, labels[cut:], class_names=info.class_names), prep


# ----------------------------------------------------------------------------------------- forget images
@dataclass
class ForgetImages:
    images: torch.Tensor       # uint8 [N, C, H, W]
    labels: torch.Tensor       # int64 [N]
    hashes: list[str]          # image_hash of each
    files: list[str]           # relative paths (kept in memory for error messages, never written out)


def _labelled_files(folder: Path) -> list[tuple[Path, str]]:
    """(file, label) from `folder`/labels.csv (columns file,label) or from class subfolders."""
    table = folder / LABELS_FILE
    if not table.is_file():
        return class_tree(folder, "data.forget.images")
    try:
        rows = list(csv.DictReader(table.read_text().splitlines()))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise TTPUserError(f"{str(table)!r} cannot be read as CSV ({exc})") from None
    if not rows or not {"file", "label"} <= set(rows[0]):
        raise TTPUserError(f"{str(table)!r} needs the header `file,label` and one row per image")
    listed = []
    for row in rows:
        path = (folder / row["file"]).resolve()
        if folder.resolve() not in path.parents or not path.is_file():
            raise TTPUserError(f"{str(table)!r} names {row['file']!r}, which is not a file inside {str(folder)!r}")
        listed.append((path, str(row["label"]).strip()))
    named = {path for path, _ in listed}
    stray = [p for p in sorted(folder.rglob("*")) if p.is_file() and p.resolve() not in named
             and p.name != LABELS_FILE and not p.name.startswith(".")]
    if stray:
        raise TTPUserError(f"data.forget.images file {str(stray[0])!r} has no row in {LABELS_FILE}; list every "
                           "image with its label")
    return listed


def class_index(label: str, class_names: tuple[str, ...], path: Path) -> int:
    """A label is a class name or a class index (0..K-1)."""
    if label in class_names:
        return class_names.index(label)
    if label.isdigit() and int(label) < len(class_names):
        return int(label)
    shown = ", ".join(class_names[:12]) + (", ..." if len(class_names) > 12 else "")
    raise TTPUserError(f"forget image {str(path)!r} has label {label!r}, which is not one of the model's "
                       f"{len(class_names)} classes; allowed: {shown} (or 0..{len(class_names) - 1})")


def read_forget_images(folder: str | Path, prep: Preprocess, class_names: tuple[str, ...]) -> ForgetImages:
    """The forget images under `folder` (labels from class subfolders or labels.csv), preprocessed like the
    data, without repeats (a repeated image is kept once)."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise TTPUserError(f"data.forget.images={str(folder)!r} is not a folder")
    kept: dict[str, tuple] = {}
    for path, label in _labelled_files(folder):
        pixels = to_tensor(open_image(path, "forget image"), path, prep, "forget image")
        target = class_index(label, class_names, path)
        digest = fingerprint(pixels)
        if digest in kept:
            if kept[digest][1] != target:
                raise TTPUserError(f"forget images {kept[digest][2]!r} and {str(path)!r} are the same image "
                                   "with different labels")
            log.warning("forget image %s repeats %s; it is used once", path, kept[digest][2])
            continue
        kept[digest] = (pixels, target, str(path))
    values = list(kept.values())
    return ForgetImages(torch.stack([v[0] for v in values]), torch.as_tensor([v[1] for v in values]),
                        list(kept), [v[2] for v in values])


def match_images(hashes: list[str], images: torch.Tensor) -> dict[str, list[int]]:
    """For each hash in `hashes`, the indices of `images` with exactly those pixels."""
    wanted = set(hashes)
    found: dict[str, list[int]] = {h: [] for h in hashes}
    for i in range(len(images)):
        digest = fingerprint(images[i])
        if digest in wanted:
            found[digest].append(i)
    return found
