"""Image files from the user: a data set in ImageFolder layout (`data=imagefolder`) and the forget images a
provider was sent (`data.forget.images=DIR`).

Image files are decoded by Pillow into pixels and nothing else; a file that is not a PNG or JPEG image, or
that Pillow cannot decode, is one error line naming it. Every image, training or forget, goes through the same
`decode`: documented conversions only (EXIF orientation, 16-bit grey by its top byte, palettes expanded, CMYK
to RGB, an opaque alpha channel dropped), each recorded, or one error line naming the file and the fix (a
transparent pixel, 8-bit values in a 16-bit file, floating-point pixels). Grey is repeated into RGB for colour
data; colour becomes grey only when its channels are all equal (nothing is lost), so a colour photo sent for a
grey-scale model is an error rather than a silent conversion. A file or folder that links
outside the folder it was given in is refused.
"""

import csv
import hashlib
import io
import json
import logging
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from ttp_lightning.core import proofs
from ttp_lightning.core.dataset_info import DatasetInfo
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.core.files import atomic_tensors
from ttp_lightning.data.arrays import ImageArrays
from ttp_lightning.data.forget import fingerprint

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
LABELS_FILE = "labels.csv"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Preprocess:
    """How files become uint8 [C, H, W] tensors: the channel count, and either the exact size every image
    must have (`resize=False`) or the size to resize the shorter side to and centre-crop (`resize=True`)."""

    channels: int
    image_size: int | None
    resize: bool = False


@dataclass(frozen=True)
class Decoded:
    """An image file's pixels as uint8 [H, W, C], C = 1 (grey modes, a grey palette) or 3, after every conversion in
    `notes` (in words, for the run's records)."""

    pixels: np.ndarray
    notes: tuple[str, ...] = ()

    @property
    def channels(self) -> int:
        return self.pixels.shape[2]


SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")
CONVERTED_TO_RGB = ("CMYK", "YCbCr", "LAB", "HSV")
WITH_ALPHA = {"LA": "L", "La": "L", "RGBA": "RGB", "RGBa": "RGB"}
ORIENTATION_TAG = 0x0112  # EXIF Orientation


def open_image(path: Path, what: str):
    """The decoded image, or one error line naming the file."""
    from PIL import Image, UnidentifiedImageError

    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise TTPUserError(f"{what} {str(path)!r} is not an image file; allowed: PNG or JPEG files "
                           f"({', '.join(IMAGE_SUFFIXES)})")
    try:
        with Image.open(path) as image:
            frames = getattr(image, "n_frames", 1)
            if frames != 1:  # an APNG: which frame a viewer, a model or this check reads is not one answer
                raise TTPUserError(f"{what} {str(path)!r} is an animated image of {frames} frames; an image here is "
                                   "one picture: save the frame you mean as a still PNG or JPEG")
            image.load()
            return image.copy()
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise TTPUserError(f"{what} {str(path)!r} cannot be read as an image ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''})") from None


def decode(image, path: Path, what: str) -> Decoded:
    """The pixels the image means, by documented conversions only, or one error line naming the file and the fix:
    EXIF orientation applied (Pillow's ImageOps.exif_transpose, as torchvision's decode_image does); 16-bit grey
    to 8 bits by its top byte (torchvision's to_dtype(uint8, scale=True): an 8-bit image saved as 16-bit, v * 257,
    comes back exactly); palette images expanded (a grey palette to grey); CMYK / YCbCr / LAB / HSV to RGB by
    Pillow's conversion; an alpha channel dropped only when every pixel is opaque. The channel count is the
    mode's: an RGB file is colour data even when its channels are equal (finish() accepts those for grey data)."""
    from PIL import ImageOps

    notes: list[str] = []
    orientation = image.getexif().get(ORIENTATION_TAG, 1)
    if orientation not in (1, None):
        image = ImageOps.exif_transpose(image)
        notes.append(f"EXIF orientation {orientation} applied")
    mode = image.mode
    if mode in SIXTEEN_BIT:
        return Decoded(_sixteen_bit(np.asarray(image), path, what), (*notes, "16-bit grey scaled to 8 bits (top byte)"))
    if mode == "F":
        raise TTPUserError(f"{what} {str(path)!r} holds floating-point pixels (mode F); save it as an 8-bit PNG")
    if mode == "1":
        image = image.convert("L")
    elif mode in ("P", "PA"):
        image = image.convert("RGBA")
        notes.append("palette expanded")
    elif mode in CONVERTED_TO_RGB:
        image = image.convert("RGB")
        notes.append(f"{mode} converted to RGB (Pillow)")
    elif mode not in ("L", "RGB", *WITH_ALPHA):
        raise TTPUserError(f"{what} {str(path)!r} has the pixel mode {mode}, which is not supported; save it as an "
                           "8-bit grey or RGB PNG")
    if image.mode in WITH_ALPHA:
        alpha = np.asarray(image.getchannel(image.mode[-1]))
        if (alpha < 255).any():
            raise TTPUserError(f"{what} {str(path)!r} has {int((alpha < 255).sum())} transparent pixels (alpha "
                               "below 255), and what a model sees there is not defined; flatten it onto the "
                               "background your model was trained on and save it without alpha")
        image = image.convert(WITH_ALPHA[image.mode])
        notes.append("opaque alpha channel dropped")
    pixels = np.asarray(image, dtype=np.uint8)
    pixels = pixels[:, :, None] if pixels.ndim == 2 else pixels
    if mode in ("P", "PA") and _equal_channels(pixels):  # a grey palette is a grey image
        pixels = pixels[:, :, :1]
        notes.append("grey palette read as grey")
    return Decoded(np.ascontiguousarray(pixels), tuple(notes))


def _equal_channels(pixels: np.ndarray) -> bool:
    return pixels.shape[2] == 3 and bool((pixels == pixels[:, :, :1]).all())


def _sixteen_bit(values, path: Path, what: str):
    """uint8 [H, W, 1] from 16-bit grey values: their top byte, or one error line when the values cannot be
    16-bit grey (outside 0..65535) or look like 8-bit values stored in a 16-bit file (none above 255)."""
    if values.min() < 0 or values.max() > 65535:
        raise TTPUserError(f"{what} {str(path)!r} has pixel values outside 0..65535; save it as an 8-bit PNG")
    if 0 < values.max() <= 255:
        raise TTPUserError(f"{what} {str(path)!r} is a 16-bit image whose values are all at most 255 (8-bit values "
                           "in a 16-bit file?); its top byte would be black: save it as an 8-bit PNG")
    return (values.astype(np.uint32) >> 8).astype(np.uint8)[:, :, None]


def finish(decoded: Decoded, path: Path, prep: Preprocess, what: str) -> torch.Tensor:
    """uint8 [C, H, W] pixels as `prep` says (grey repeated into 3 channels for colour data, as Pillow's L to RGB;
    colour whose channels are all equal taken as grey for grey data; resized and centre-cropped, or checked for
    size), or one error line (colour for grey data, or a wrong size)."""
    from PIL import Image

    pixels = decoded.pixels
    if decoded.channels == 3 and prep.channels == 1:
        if not _equal_channels(pixels):
            raise TTPUserError(f"{what} {str(path)!r} is a colour image; the data has 1 channel (grey-scale): "
                               "convert it to grey the way your training images were, and send that")
        pixels = pixels[:, :, :1]  # grey stored as colour (equal channels, e.g. a CMYK scan of a grey image)
    if decoded.channels == 1 and prep.channels == 3:
        pixels = pixels.repeat(3, axis=2)
    image = Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels)
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
    out = torch.as_tensor(np.asarray(image, dtype=np.uint8).copy())
    return out.unsqueeze(0) if out.ndim == 2 else out.permute(2, 0, 1).contiguous()


def read_file(path: Path, prep: Preprocess, what: str) -> tuple[torch.Tensor, tuple[str, ...]]:
    """(uint8 [C, H, W] pixels, the conversions applied) of one image file, decoded as every image is."""
    decoded = decode(open_image(path, what), path, what)
    return finish(decoded, path, prep, what), decoded.notes


def inside(path: Path, folder: Path, what: str) -> Path:
    """`path`, refused in one line when it (or a link on its way) leads outside `folder`."""
    if folder.resolve() not in path.resolve().parents:
        raise TTPUserError(f"{what} {str(path)!r} links to {str(path.resolve())!r}, outside {str(folder)!r}; "
                           "copy the file into the folder instead of linking it")
    return path


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
        files += [(inside(path, folder, what + " file"), entry.name) for path in sorted(entry.rglob("*"))
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
    val_files = class_tree(root / "val", "data.root val") if (root / "val").exists() else []
    if cache_dir is None:
        return _named(root, train_files, test_files, *_decode_imagefolder(root, train_files, test_files, image_size,
                                                                         channels, val_files))
    folder = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    entry = Path(cache_dir).expanduser() / \
        f"{folder}_{_folder_key(root, train_files + test_files + val_files, image_size, channels)}.safetensors"
    cached = _read_decoded(entry, image_size)
    if cached is not None:
        return _named(root, train_files, test_files, *cached)
    info, arrays, prep = _decode_imagefolder(root, train_files, test_files, image_size, channels, val_files)
    entry.parent.mkdir(parents=True, exist_ok=True)
    val = {} if arrays.val_images is None else {"val_images": arrays.val_images, "val_labels": arrays.val_labels}
    atomic_tensors(entry, {"train_images": arrays.train_images, "train_labels": arrays.train_labels,
                           "test_images": arrays.test_images, "test_labels": arrays.test_labels, **val},
                   metadata={"format": DECODED_FORMAT, "info": json.dumps(asdict(info))})
    proofs.sign(entry)
    for superseded in entry.parent.glob(f"{folder}_*.safetensors"):  # an image removed from the folder
        if superseded != entry:                                       # leaves no copy behind here
            superseded.unlink(missing_ok=True)
            proofs.sidecar(superseded).unlink(missing_ok=True)
    return _named(root, train_files, test_files, info, arrays, prep)


def _named(root: Path, train_files, test_files, info, arrays: ImageArrays, prep):
    """(info, arrays with each image's file under `root`, prep): messages name a training image by its file."""
    names = (tuple(str(path.relative_to(root)) for path, _ in files) for files in (train_files, test_files))
    return info, replace(arrays, train_files=next(names), test_files=next(names)), prep


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
    from safetensors.torch import load as load_tensors


    if not entry.is_file():
        return None
    data = entry.read_bytes()  # read once: what is checked is what is used
    if not proofs.verified(entry, data):
        proofs.discard(entry, "decoded images")
        return None
    try:
        header = int.from_bytes(data[:8], "little")
        metadata = json.loads(data[8:8 + header]).get("__metadata__") or {}
        tensors = load_tensors(data)
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
                             tensors["test_labels"], class_names=info.class_names,
                             val_images=tensors.get("val_images"), val_labels=tensors.get("val_labels")), prep


def _decode_imagefolder(root: Path, train_files, test_files, image_size: int | None, channels: int | None,
                        val_files=()):
    """The folder's images as (info, arrays, prep); val/ (optional) goes to arrays.val_*: the normalisation
    statistics, channel count and size come from train/ alone."""
    classes = sorted({name for _, name in train_files})
    if len(classes) < 2:
        raise TTPUserError(f"data.root={str(root)!r}: train/ has {len(classes)} class folder; a classifier "
                           "needs at least 2")
    for part, listed in (("test", test_files), ("val", val_files)):
        unknown = sorted({name for _, name in listed} - set(classes))
        if unknown:
            raise TTPUserError(f"data.root={str(root)!r}: {part}/ has the class folder {unknown[0]!r}, which "
                               f"train/ does not have; allowed: {', '.join(classes)}")
    files = [*train_files, *test_files, *val_files]
    decoded = [decode(open_image(path, "image"), path, "image") for path, _ in files]
    _log_conversions(root, [d.notes for d in decoded])
    if channels is None:
        channels = max(d.channels for d in decoded)
    if image_size is None:
        sizes = {(d.pixels.shape[1], d.pixels.shape[0]) for d in decoded}
        if len(sizes) != 1 or len({*next(iter(sizes))}) != 1:
            raise TTPUserError(f"data.root={str(root)!r} holds images of sizes {sorted(sizes)[:3]}; set "
                               "data.image_size=N to resize them (shorter side to N, centre crop N x N)")
        prep = Preprocess(channels, next(iter(sizes))[0])
    else:
        prep = Preprocess(channels, int(image_size), resize=True)
    index = {name: i for i, name in enumerate(classes)}
    tensors = [finish(d, path, prep, "image") for d, (path, _) in zip(decoded, files)]
    del decoded
    labels = torch.as_tensor([index[name] for _, name in files], dtype=torch.long)
    cut, end = len(train_files), len(train_files) + len(test_files)
    train_x = torch.stack(tensors[:cut])
    test_x = torch.stack(tensors[cut:end]) if test_files else train_x[:0]
    val_x, val_y = (torch.stack(tensors[end:]), labels[end:]) if val_files else (None, None)
    scaled = train_x.float().div(255.0)
    mean = tuple(round(float(v), 4) for v in scaled.mean(dim=(0, 2, 3)))
    std = tuple(round(max(float(v), 1e-3), 4) for v in scaled.std(dim=(0, 2, 3)))
    info = DatasetInfo(len(classes), channels, prep.image_size, mean, std, has_official_split=bool(test_files),
                       class_names=tuple(classes))
    return info, ImageArrays(train_x, labels[:cut], test_x, labels[cut:end], class_names=info.class_names,
                             val_images=val_x, val_labels=val_y), prep


def _log_conversions(root: Path, notes: list[tuple[str, ...]]) -> None:
    """One line per kind of conversion applied to a folder's images, with how many it touched."""
    counts: dict[str, int] = {}
    for note in (n for image in notes for n in image):
        counts[note] = counts.get(note, 0) + 1
    if counts:
        log.info("decoding %s: %s", root, "; ".join(f"{note}: {count} images" for note, count in counts.items()))


# ----------------------------------------------------------------------------------------- forget images
@dataclass
class ForgetImages:
    images: torch.Tensor       # uint8 [N, C, H, W]
    labels: torch.Tensor       # int64 [N]
    hashes: list[str]          # image_hash of each
    files: list[str]           # relative paths (kept in memory for error messages, never written out)
    notes: list[tuple[str, ...]]  # the conversions decoding applied to each (decode), recorded per image


def _labelled_files(folder: Path) -> list[tuple[Path, str]]:
    """(file, label) from `folder`/labels.csv (columns file,label) or from class subfolders."""
    table = folder / LABELS_FILE
    if not table.is_file():
        return class_tree(folder, "data.forget.images")
    try:  # utf-8-sig: a spreadsheet's byte-order mark is not part of the first column's name
        rows = list(csv.DictReader(io.StringIO(table.read_text(encoding="utf-8-sig"), newline="")))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise TTPUserError(f"{str(table)!r} cannot be read as CSV ({exc})") from None
    if not rows or not {"file", "label"} <= {str(name).strip() for name in rows[0]}:
        raise TTPUserError(f"{str(table)!r} needs the header `file,label` and one row per image")
    listed, rows_of = [], {}
    for number, row in enumerate(rows, start=2):  # line 1 is the header
        row = {str(key).strip(): value for key, value in row.items() if key is not None}
        if not row.get("file") or row.get("label") is None or not str(row["label"]).strip():
            raise TTPUserError(f"{str(table)!r} row {number} has no {'file' if not row.get('file') else 'label'}; "
                               "each row is `file,label`")
        path = (folder / row["file"]).resolve()
        if folder.resolve() not in path.parents or not path.is_file():
            raise TTPUserError(f"{str(table)!r} names {row['file']!r}, which is not a file inside {str(folder)!r}")
        if path in rows_of:
            raise TTPUserError(f"{str(table)!r} names {row['file']!r} twice (rows {rows_of[path]} and {number}); "
                               "list each image once")
        rows_of[path] = number
        listed.append((path, str(row["label"]).strip()))
    named = {path for path, _ in listed}
    stray = [p for p in sorted(folder.rglob("*")) if p.is_file() and p.resolve() not in named
             and p.name != LABELS_FILE and not any(part.startswith(".") for part in p.relative_to(folder).parts)]
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
    repeats = []
    for path, label in _labelled_files(folder):
        pixels, notes = read_file(path, prep, "forget image")
        target = class_index(label, class_names, path)
        digest = fingerprint(pixels)
        if digest in kept:
            if kept[digest][1] != target:
                raise TTPUserError(f"forget images {kept[digest][2]!r} and {str(path)!r} are the same image "
                                   "with different labels")
            repeats.append((str(path), kept[digest][2]))
            continue
        kept[digest] = (pixels, target, str(path), notes)
    if repeats:  # one line, however many
        log.warning("%d forget image(s) repeat another one and are used once (e.g. %s repeats %s)", len(repeats),
                    *repeats[0])
    values = list(kept.values())
    return ForgetImages(torch.stack([v[0] for v in values]), torch.as_tensor([v[1] for v in values]),
                        list(kept), [v[2] for v in values], [v[3] for v in values])


def match_images(hashes: list[str], images: torch.Tensor) -> dict[str, list[int]]:
    """For each hash in `hashes`, the indices of `images` with exactly those pixels."""
    wanted = set(hashes)
    found: dict[str, list[int]] = {h: [] for h in hashes}
    for i in range(len(images)):
        digest = fingerprint(images[i])
        if digest in wanted:
            found[digest].append(i)
    return found


NEAR_COPY = 8.0  # mean absolute pixel difference (of 255) below which an image is a near copy of another: JPEG
                 # at quality 50 re-encodes MNIST digits within 6.2, while two different MNIST training images
                 # are a median 15 apart (the closest pairs about 3: such pairs are refused, never merged silently)


def nearest_image(image: torch.Tensor, images: torch.Tensor, chunk: int = 4096) -> tuple[int, float] | None:
    """(index, mean absolute pixel difference) of the image in `images` closest to `image`, or None when the
    shapes differ."""
    if images.shape[1:] != image.shape or len(images) == 0:
        return None
    target = image.reshape(1, -1).to(torch.int16)
    best, where = math.inf, -1
    for start in range(0, len(images), chunk):
        block = images[start:start + chunk].reshape(min(chunk, len(images) - start), -1).to(torch.int16)
        distance = (block - target).abs().sum(dim=1, dtype=torch.int64)
        value, index = distance.min(dim=0)
        if int(value) < best:
            best, where = int(value), start + int(index)
    return where, best / target.shape[1]
