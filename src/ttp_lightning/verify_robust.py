"""`python -m ttp_lightning.verify robust RELEASE_DIR IMAGES_DIR [--gamma 8]`: re-check a release's certified
uniformity without the training data.

For every image under IMAGES_DIR (PNG or JPEG, in any subfolders; labels are not needed) it computes, from the
release's weights alone, an upper bound on the confidence distance (CD) anywhere in the L-inf ball of radius
gamma / 255 around the image (interval bound propagation in float64, ttp_lightning.ibp): no perturbation of
the image within that radius can make the released model more confident than that. A provider, an auditor
or a data subject holding the images can run it; nothing is trusted but the weights file, whose SHA-256 must
match the release's config.json, and the images.

When the images are exactly the release's forget set (their set digest matches config.json), the release's
own per-image claims (worst certified CD, shares certified at most 0.05 and 0.1) are compared with the
recomputed ones too.

Exit status: 0 every image is certified at most the threshold (--at-most; default the release gate's); 1 an
image is above it, or the release's claims do not match what is recomputed (one FAIL line each); 2 unusable
or hostile input (a release folder or config.json outside the format, weights that are not the file
config.json names, an unreadable image, an image of the wrong shape, a network the bound does not support).
"""

import argparse
import sys
from pathlib import Path

from ttp_lightning.certificates.schema import SchemaError
from ttp_lightning.data.forget import fingerprint, set_digest
from ttp_lightning.data.images import IMAGE_SUFFIXES, Preprocess, inside, read_file
from ttp_lightning.errors import TTPUserError
from ttp_lightning.ibp import UnsupportedLayer, certified_conf_dist
from ttp_lightning.metrics import conf_dist_of_probs
from ttp_lightning.protection import stage_summary
from ttp_lightning.release import load_released, read_release_config

EXIT_OK, EXIT_FAIL, EXIT_UNUSABLE = 0, 1, 2
CLAIM_TOLERANCE = 1e-4
DEFAULT_AT_MOST = 0.1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ttp_lightning.verify robust",
                                     description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n")[-1], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("release", type=Path, help="the release folder (model.safetensors, config.json)")
    parser.add_argument("images", type=Path, help="a folder of the images to check (PNG or JPEG, any subfolders)")
    parser.add_argument("--gamma", type=float, default=None, metavar="G",
                        help="L-inf radius in units of 1/255 (default: the release's own, else 8)")
    parser.add_argument("--at-most", type=float, default=None, metavar="CD",
                        help="every image's certified CD must be at most this (default: the release gate's, else 0.1)")
    parser.add_argument("--resize", action="store_true",
                        help="resize (shorter side) and centre-crop each image to the model's input size, as "
                             "data.image_size did; without it every image must already have that size")
    return parser


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


def claim_failures(claimed: dict, measured: dict, gamma: float) -> list[str]:
    """The release's per-image claims (config.json protection.per_image) against the recomputed values."""
    if claimed.get("gamma") is None or abs(float(claimed["gamma"]) - gamma) > 1e-9:
        return []
    failures = []
    for key, value in measured.items():
        stated = claimed.get(key)
        if not isinstance(stated, (int, float)) or abs(stated - value) > CLAIM_TOLERANCE:
            failures.append(f"config.json claims {key} = {stated}; recomputed from the weights: {value:.6f}")
    return failures


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)

    import torch

    try:
        config = read_release_config(args.release)
        protection = config["protection"] if isinstance(config.get("protection"), dict) else {}
        gate = protection.get("release_gate") if isinstance(protection.get("release_gate"), dict) else {}
        claimed = protection.get("per_image") if isinstance(protection.get("per_image"), dict) else {}
        gamma = args.gamma if args.gamma is not None else float(claimed.get("gamma") or 8.0)
        at_most = args.at_most if args.at_most is not None else float(gate.get("conf_dist_at_most") or DEFAULT_AT_MOST)
        if not (gamma >= 0 and 0 <= at_most < 1):
            raise TTPUserError(f"--gamma={gamma:g} and --at-most={at_most:g} are not allowed; choose gamma >= 0 "
                               "and at-most in [0, 1)")
        model = load_released(args.release)
        files = image_files(args.images)
        given = config["input"]
        pixels = read_images(files, given["channels"], given["image_size"], args.resize)
        images = pixels.float() / 255.0
        bounds = certified_conf_dist(model, images, gamma)
        with torch.no_grad():
            probs = model(images).softmax(-1).double()
        clean = conf_dist_of_probs(probs)
    except (OSError, ValueError, KeyError, TypeError, RecursionError, TTPUserError, SchemaError,
            UnsupportedLayer) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"error: cannot verify: {message}", file=sys.stderr)
        return EXIT_UNUSABLE

    failures = []
    print(f"{'image':<40}  {'clean CD':>8}  {'certified CD':>12}  (L-inf {gamma:g}/255, at most {at_most:g})")
    for path, value, bound in zip(files, clean.tolist(), bounds.tolist()):
        name = str(path.relative_to(args.images))
        print(f"{name[-40:]:<40}  {value:8.4f}  {bound:12.4f}  {'ok' if bound <= at_most else 'ABOVE'}")
        if bound > at_most:
            failures.append(f"{name}: certified CD {bound:.4f} > {at_most:g} within {gamma:g}/255")
    same_set = set_digest(fingerprint(image) for image in pixels) == protection.get("forget_set_digest")
    if same_set:
        summary = stage_summary({"certified": bounds.tolist()}, at_most)
        measured = {key: summary[key] for key in ("forget_certified_worst_conf_dist", "forget_certified_share_05",
                                                  "forget_certified_share_10")}
        failures += claim_failures(claimed, measured, gamma)
        print(f"these {len(files)} images are the release's forget set (its set digest matches config.json)")
    else:
        print(f"these {len(files)} images are not exactly the release's forget set (set digest differs from "
              "config.json); each bound above is still a proof for its own image")
    for failure in failures:
        print(f"FAIL: {failure}")
    if failures:
        return EXIT_FAIL
    print(f"verified: every one of the {len(files)} images has certified CD <= {at_most:g} anywhere within "
          f"{gamma:g}/255 (worst {max(bounds.tolist()):.4f}), from the weights alone")
    return EXIT_OK
