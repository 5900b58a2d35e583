"""A real-image stand-in that is not MNIST (issue 61): the letters A-J typeset in the fonts matplotlib ships
(notMNIST-like), each drawn with its own shift, rotation, scale, stroke weight, clutter and noise, written as an
image folder for `data=imagefolder`.

  python scripts/make_letters.py OUT [--train 10000] [--test 2000] [--val 0] [--size 28] [--seed 0]
                                     [--unseen-fonts 4]

OUT/train/<letter>/<n>.png and OUT/test/<letter>/<n>.png (and OUT/val/<letter>/<n>.png with --val), 8-bit
grayscale. Unlike MNIST's centred,
size-normalised pen strokes, these are filled glyphs of about twenty typefaces (sans, serif, mono, italic, bold,
TeX's Computer Modern) at varying size and position, with strokes thickened or thinned, a stray line or blob
beside some of them and pixel noise on all. The `--unseen-fonts` typefaces (drawn by the seed) appear only in
the test split (and val/, drawn like test/ but from its own random stream: a provider's own validation
images from the distribution the model meets), so test accuracy measures what a model has not memorised, as on
real data. The same arguments give the same files, byte for byte.
"""

import argparse
import math
import random
from pathlib import Path

import matplotlib
import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

LETTERS = "ABCDEFGHIJ"
CANVAS = 96  # glyphs are drawn large, transformed, then reduced to --size


def fonts() -> list[Path]:
    """The typefaces matplotlib ships that have Latin capitals (symbol and extension fonts left out), sorted."""
    folder = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    skip = ("STIXNonUni", "STIXSiz", "LastResort", "cmex", "cmsy", "cmmi", "Display")
    return sorted(path for path in folder.glob("*.ttf") if not path.name.startswith(skip)
                  and not any(part in path.name for part in skip))


def glyph(letter: str, font: Path, rng: random.Random) -> Image.Image:
    """The letter drawn white on black, filling about half to four fifths of the canvas, rotated and shifted."""
    size = int(CANVAS * rng.uniform(0.45, 0.8))
    face = ImageFont.truetype(str(font), size)
    image = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(image)
    left, top, right, bottom = draw.textbbox((0, 0), letter, font=face)
    x = (CANVAS - (right - left)) / 2 - left + rng.uniform(-0.12, 0.12) * CANVAS
    y = (CANVAS - (bottom - top)) / 2 - top + rng.uniform(-0.12, 0.12) * CANVAS
    draw.text((x, y), letter, fill=255, font=face)
    image = image.rotate(rng.uniform(-15, 15), resample=Image.BILINEAR)
    weight = rng.choice((-1, 0, 0, 1, 2))  # thinner, as drawn, or bolder strokes
    if weight > 0:
        image = image.filter(ImageFilter.MaxFilter(2 * weight + 1))
    elif weight < 0:
        image = image.filter(ImageFilter.MinFilter(3))
    return image


def clutter(image: Image.Image, rng: random.Random) -> Image.Image:
    """A stray stroke or blob on about a third of the images (a scan's dirt, a neighbour's edge)."""
    if rng.random() > 0.35:
        return image
    draw = ImageDraw.Draw(image)
    if rng.random() < 0.5:
        angle, length = rng.uniform(0, math.pi), rng.uniform(0.3, 0.9) * CANVAS
        cx, cy = rng.uniform(0, CANVAS), rng.uniform(0, CANVAS)
        dx, dy = math.cos(angle) * length / 2, math.sin(angle) * length / 2
        draw.line((cx - dx, cy - dy, cx + dx, cy + dy), fill=rng.randint(120, 255), width=rng.randint(2, 6))
    else:
        r, cx, cy = rng.uniform(3, 10), rng.uniform(0, CANVAS), rng.uniform(0, CANVAS)
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=rng.randint(120, 255))
    return image


def render(letter: str, font: Path, size: int, rng: random.Random, noise: np.random.Generator) -> Image.Image:
    image = clutter(glyph(letter, font, rng), rng).resize((size, size), Image.LANCZOS)
    pixels = np.asarray(image, dtype=np.float64) * rng.uniform(0.7, 1.0)  # contrast varies
    pixels += noise.normal(0.0, rng.uniform(0.0, 20.0), pixels.shape)  # sensor noise, 0-20 grey levels
    return Image.fromarray(np.clip(np.rint(pixels), 0, 255).astype(np.uint8), mode="L")


def split_fonts(seed: int, unseen: int) -> tuple[list[Path], list[Path]]:
    """(train fonts, test fonts): `unseen` typefaces drawn by the seed are the test split's alone."""
    every = fonts()
    if not 0 <= unseen < len(every):
        raise SystemExit(f"error: --unseen-fonts={unseen} is not allowed; choose 0..{len(every) - 1}")
    held = set(random.Random(seed).sample(range(len(every)), unseen))
    return [f for i, f in enumerate(every) if i not in held], every


def write(out: Path, split: str, count: int, faces: list[Path], size: int, seed: int) -> None:
    stream = {"train": 0, "test": 1, "val": 2}[split]
    rng, noise = random.Random(f"{seed}-{split}"), np.random.default_rng([seed, stream])
    for index in range(count):
        letter = LETTERS[index % len(LETTERS)]
        folder = out / split / letter
        folder.mkdir(parents=True, exist_ok=True)
        render(letter, rng.choice(faces), size, rng, noise).save(folder / f"{index:05d}.png", optimize=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--train", type=int, default=10_000)
    parser.add_argument("--test", type=int, default=2_000)
    parser.add_argument("--val", type=int, default=0, help="validation images in OUT/val (0: none)")
    parser.add_argument("--size", type=int, default=28)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--unseen-fonts", type=int, default=4)
    args = parser.parse_args(argv)
    for key in ("train", "test", "size"):
        if getattr(args, key) < 1:
            parser.error(f"--{key}={getattr(args, key)} is not allowed; choose a whole number >= 1")
    if args.val < 0:
        parser.error(f"--val={args.val} is not allowed; choose a whole number >= 0")
    if args.out.exists() and any(args.out.iterdir()):
        raise SystemExit(f"error: {args.out} is not empty; choose a new folder")
    train_fonts, test_fonts = split_fonts(args.seed, args.unseen_fonts)
    write(args.out, "train", args.train, train_fonts, args.size, args.seed)
    write(args.out, "test", args.test, test_fonts, args.size, args.seed)
    if args.val:
        write(args.out, "val", args.val, test_fonts, args.size, args.seed)
    val = f", {args.val} val" if args.val else ""
    print(f"{args.out}: {args.train} train, {args.test} test{val} images of {len(LETTERS)} letters, "
          f"{args.size}x{args.size}, {len(train_fonts)} typefaces ({len(test_fonts) - len(train_fonts)} in test only)")


if __name__ == "__main__":
    main()
