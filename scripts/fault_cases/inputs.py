"""Fault cases: hostile or broken input files: forget-index files, MNIST files, forget images and labels.csv."""

import os
import shutil
from pathlib import Path

import numpy as np
import torch

from fault_cases.jobs import FINISHED, MNIST_RAW, QUICK, protect_args, provider, refused, run


def _index_file(work: Path, name: str, content) -> Path:
    path = work / "inputs" / name
    path.parent.mkdir(exist_ok=True)
    if name.endswith(".json"):
        path.write_text(content)
    elif name.endswith(".npy"):
        np.save(path, content)
    else:
        torch.save(content, path)
    return path


def bad_index(name, content):
    def case(work, reference):
        path = _index_file(work, name, content)
        return refused(run(work, f"index_{name}", work / "cache_quick",
                           [*QUICK, f"data.forget.indices_file={path}"]))
    return case


def case_hostile_pickle(work, reference):
    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {work / 'pwned'}",))

    path = _index_file(work, "hostile.pt", Payload())
    result = refused(run(work, "index_hostile", work / "cache_quick", [*QUICK, f"data.forget.indices_file={path}"]))
    result["ok"] = result["ok"] and not (work / "pwned").exists()
    result["lost"] += "; the pickle's code did not run" if not (work / "pwned").exists() else "; CODE RAN"
    return result


def mnist_copy(work: Path, name: str, damage) -> Path:
    root = work / name
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for path in MNIST_RAW.glob("*-ubyte"):
        shutil.copy(path, raw / path.name)
    damage(raw)
    return root


def case_mnist_label(work, reference):
    def damage(raw):
        labels = bytearray((raw / "train-labels-idx1-ubyte").read_bytes())
        labels[20] = 200
        (raw / "train-labels-idx1-ubyte").write_bytes(bytes(labels))
    root = mnist_copy(work, "mnist_label", damage)
    return refused(run(work, "mnist_label", work / "cache_mnist", [*QUICK, "data=mnist", f"data.root={root}"]))


def case_mnist_truncated(work, reference):
    def damage(raw):
        path = raw / "train-images-idx3-ubyte"
        path.write_bytes(path.read_bytes()[:1000])
    root = mnist_copy(work, "mnist_truncated", damage)
    return refused(run(work, "mnist_truncated", work / "cache_mnist", [*QUICK, "data=mnist", f"data.root={root}"]))


def _forget_copy(work: Path, name: str, write) -> Path:
    """A forget folder holding one image written by `write(folder, training image pixels, its class)`."""
    from PIL import Image

    folder = provider(work)
    source = min((folder / "digits" / "train").glob("*/*.png"))
    target = work / f"forget_{name}"
    shutil.rmtree(target, ignore_errors=True)
    (target / source.parent.name).mkdir(parents=True)
    write(target / source.parent.name, np.asarray(Image.open(source)), source)
    return target


def forget_image_case(name: str, write, expect: str):
    """`expect`: matched (the training image is protected), refused (one error line) or a text in the line."""
    def case(work, reference):
        forget = _forget_copy(work, name, write)
        job = run(work, f"forget_{name}", work / "cache_provider", protect_args(provider(work), forget))
        if expect == "matched":
            images = (job.results or {}).get("data", {}).get("forget_images", [])
            matched = bool(images) and all(image["training_indices"] and not image["outside"] for image in images)
            notes = [note for image in images for note in image.get("decoded", [])]
            return {"exit": job.proc.returncode, "happened": f"matched to its training image: {matched}; decoded: "
                    f"{', '.join(notes) or 'as is'}", "lost": "nothing: the training copy is protected",
                    "ok": job.proc.returncode in FINISHED and matched}
        row = refused(job)
        row["ok"] = row["ok"] and all(text in row["happened"] for text in ([expect] if isinstance(expect, str)
                                                                             else expect))
        return row
    return case


def _sixteen_bit(folder, pixels, source):
    from PIL import Image

    Image.fromarray(pixels.astype(np.uint16) * 257).save(folder / "sixteen.png")


def _exif(suffix: str):
    def write(folder, pixels, source):
        from PIL import Image

        exif = Image.Exif()
        exif[0x0112] = 6
        Image.fromarray(np.rot90(pixels, k=1).copy()).save(folder / f"rotated{suffix}", exif=exif.tobytes(),
                                                            **({"quality": 95} if suffix == ".jpg" else {}))
    return write


def _palette(folder, pixels, source):
    from PIL import Image

    Image.fromarray(pixels).convert("P").save(folder / "palette.png")


def _transparent(folder, pixels, source):
    from PIL import Image

    image = Image.fromarray(pixels).convert("LA")
    image.putpixel((0, 0), (0, 10))
    image.save(folder / "alpha.png")


def _cmyk(folder, pixels, source):
    from PIL import Image

    colour = np.dstack([pixels, np.zeros_like(pixels), pixels])  # magenta: colour content
    Image.fromarray(colour).convert("CMYK").save(folder / "cmyk.jpg", quality=95)


def _linked(folder, pixels, source):
    folder.rmdir()
    folder.symlink_to(source.parent, target_is_directory=True)  # "forget every image of this class"


def case_labels_csv(name: str, text: str, expect: str):
    def case(work, reference):
        folder = provider(work)
        forget = work / f"forget_labels_{name}"
        shutil.rmtree(forget, ignore_errors=True)
        forget.mkdir()
        source = min((folder / "forget").glob("*/*.png"))
        shutil.copy(source, forget / "face.png")
        (forget / "labels.csv").write_text(text.format(label=source.parent.name), encoding="utf-8")
        job = run(work, f"labels_{name}", work / "cache_provider", protect_args(folder, forget))
        if expect == "read":
            lines = len((job.stdout + job.stderr).splitlines())
            ok = job.proc.returncode in FINISHED and job.results is not None
            return {"exit": job.proc.returncode, "happened": f"read; {lines} lines of output",
                    "lost": "nothing", "ok": ok and lines < 200}
        row = refused(job)
        row["ok"] = row["ok"] and expect in row["happened"]
        return row
    return case
