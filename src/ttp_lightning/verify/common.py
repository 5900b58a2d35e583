"""What the three verifiers share (`python -m ttp_lightning.verify certificate | robust | attack`): their exit
codes, how a release's images are read (every PNG or JPEG under a folder, decoded as the pipeline decodes forget
images, each distinct image once), the arguments `robust` and `attack` share, a release that says it is not
protected, and the ending: one FAIL line per failure, or the verdict."""

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from ttp_lightning.config.allowlist import FormatError
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.core.metrics import conf_dist_of_probs
from ttp_lightning.data.forget import fingerprint, set_digest
from ttp_lightning.data.images import IMAGE_SUFFIXES, Preprocess, inside, read_file
from ttp_lightning.release import network_of, not_protected_line
from ttp_lightning.release.format import card_name

EXIT_OK, EXIT_FAIL, EXIT_UNUSABLE, EXIT_VACUOUS = 0, 1, 2, 3
CLAIM_TOLERANCE = 1e-4
DEFAULT_GAMMA, DEFAULT_AT_MOST, MAX_GAMMA = 8.0, 0.1, 255.0
# unusable or hostile input: one `error: cannot verify:` line and exit 2
INPUT_ERRORS = (OSError, ValueError, KeyError, TypeError, RecursionError, TTPUserError, FormatError)


def check_arguments(gamma: float, at_most: float) -> None:
    """The radius and threshold a verifier judges by: finite, in range (argparse reads 'nan' as a float)."""
    if not 0.0 <= gamma <= MAX_GAMMA:
        raise TTPUserError(f"--gamma={gamma:g} is not allowed; choose a radius in [0, {MAX_GAMMA:g}] (units of 1/255)")
    if not 0.0 <= at_most < 1.0:
        raise TTPUserError(f"--at-most={at_most:g} is not allowed; choose a CD in [0, 1)")


def image_files(folder: Path) -> list[Path]:
    """Every PNG or JPEG file under `folder` (sorted; hidden files skipped; symbolic links are not followed
    out of it)."""
    if not folder.is_dir():
        raise TTPUserError(f"{str(folder)!r} is not a folder of images")
    files = [inside(path, folder, "image") for path in sorted(folder.rglob("*"))
             if not path.name.startswith(".") and path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        raise TTPUserError(f"{str(folder)!r} holds no PNG or JPEG images")
    return files


def read_images(files: list[Path], channels: int, image_size: int, resize: bool):
    """uint8 [N, C, H, W] pixels of `files`, decoded as the pipeline decodes forget images."""
    import torch

    prep = Preprocess(channels, image_size, resize=resize)
    return torch.stack([read_file(path, prep, "image")[0] for path in files])


@dataclass(frozen=True)
class Subjects:
    """A release's network and the images a verifier judges it on: each distinct image once (`files`, `pixels`,
    uint8), as [0, 1] floats, and its clean CD under the network as load_released runs it (float32)."""

    files: list
    pixels: object
    model: object
    images: object
    clean: list


def load_subjects(release: Path, config: dict, images_dir: Path, resize: bool) -> Subjects:
    """The network (from the weights alone, their SHA-256 checked) and the images (the release's input size)."""
    import torch

    card = card_name(config["format"])
    if not (release / card).is_file():
        raise TTPUserError(f"{str(release)!r} holds no {card}; a release folder holds model.safetensors, config.json "
                           f"and {card} (its card)")
    model = network_of(release, config)
    given = config["input"]
    files = image_files(images_dir)
    files, pixels = distinct_images(files, read_images(files, given["channels"], given["image_size"], resize))
    images = pixels.float() / 255.0
    with torch.no_grad():
        clean = conf_dist_of_probs(model(images).softmax(-1).double()).tolist()
    return Subjects(files, pixels, model, images, clean)


def distinct_images(files: list[Path], pixels) -> tuple:
    """Each distinct image once (the first file that holds it), with a line naming every file that repeats
    another's pixels: the forget set is a set, so its counts and means are over distinct images, as the run's."""
    first: dict[str, int] = {}
    keep = []
    for i, image in enumerate(pixels):
        digest = fingerprint(image)
        if digest in first:
            print(f"{files[i]} holds the same pixels as {files[first[digest]]}: checked once, as one image")
            continue
        first[digest] = i
        keep.append(i)
    return [files[i] for i in keep], pixels[keep]


def add_release_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments `verify robust` and `verify attack` share after their own: how the images are read and
    whether a release that says it is not protected is checked anyway."""
    parser.add_argument("--resize", action="store_true",
                        help="resize (shorter side) and centre-crop each image to the model's input size, as "
                             "data.image_size did; without it every image must already have that size")
    parser.add_argument("--allow-unprotected", action="store_true",
                        help='check a release whose config.json says "protected": false (its gate failed)')


def cannot_verify(exc: BaseException) -> int:
    """One `error:` line for unusable or hostile input; the exit status to return."""
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    print(f"error: cannot verify: {message}", file=sys.stderr)
    return EXIT_UNUSABLE


def unprotected_failures(args, config: dict, anyway: str) -> list[str]:
    """A release whose config.json says it is not protected fails, unless --allow-unprotected (said either way)."""
    unprotected = not_protected_line(args.release, config)
    if not unprotected:
        return []
    print(f"{'checked as asked (--allow-unprotected): ' if args.allow_unprotected else 'FAIL: '}{unprotected}")
    return [] if args.allow_unprotected else [f"{unprotected}; --allow-unprotected {anyway}"]


def is_forget_set(pixels, config: dict) -> bool:
    """The images are exactly the release's forget set: their set digest is the one config.json states."""
    return set_digest(fingerprint(image) for image in pixels) == config["protection"]["forget_set_digest"]


def failed(failures: list[str]) -> bool:
    """Print one FAIL line per failure; whether there was any (every verifier ends this way)."""
    for failure in failures:
        print(f"FAIL: {failure}")
    return bool(failures)
