"""TinyImageNet as the official zip unpacks it (val labels in val_annotations.txt) or with val in class
folders, read by the project's own image reader: labels follow the annotations, grey JPEGs become RGB, and
every bad file or line is one error naming it."""

import re

import pytest
import torch
from PIL import Image

from conftest import registered_loader
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.data.tinyimagenet import load_tinyimagenet


def colour(k: int) -> tuple[int, int, int]:
    return (20 + 70 * (k % 3), 30 + 50 * (k // 3 % 4), 200 - 9 * (k % 20))


def write_tiny(root, classes: int = 3, per_class: int = 2, official: bool = True, grey: bool = False):
    """A TinyImageNet-shaped tree: each class's images are one flat colour (class k: colour(k)); with `grey`,
    the first training image of class 0 is a grey-scale JPEG."""
    base = root / "tiny-imagenet-200"
    wnids = [f"n{k:08d}" for k in range(classes)]
    for k, wnid in enumerate(wnids):
        folder = base / "train" / wnid / "images"
        folder.mkdir(parents=True)
        for i in range(per_class):
            image = Image.new("RGB", (64, 64), colour(k))
            (image.convert("L") if grey and k == 0 and i == 0 else image).save(folder / f"{wnid}_{i}.JPEG",
                                                                                 quality=95)
        (base / "train" / wnid / f"{wnid}_boxes.txt").write_text(f"{wnid}_0.JPEG\t0\t0\t63\t63\n")
    lines = []
    for n, k in enumerate(reversed(range(classes))):  # val order is not class order
        if official:
            (base / "val" / "images").mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (64, 64), colour(k)).save(base / "val" / "images" / f"val_{n}.JPEG", quality=95)
            lines.append(f"val_{n}.JPEG\t{wnids[k]}\t0\t0\t63\t63")
        else:
            (base / "val" / wnids[k]).mkdir(parents=True)
            Image.new("RGB", (64, 64), colour(k)).save(base / "val" / wnids[k] / f"val_{n}.JPEG", quality=95)
    if official:
        (base / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return base, wnids


def assert_labels_follow_pixels(images, labels):
    for image, label in zip(images, labels, strict=True):
        assert image.shape == (3, 64, 64) and image.dtype == torch.uint8
        found = image.float().mean(dim=(1, 2))
        assert torch.allclose(found, torch.tensor(colour(int(label)), dtype=torch.float), atol=3), int(label)


@pytest.mark.parametrize("official", [True, False])
def test_labels_follow_the_annotations_or_the_class_folders(tmp_path, official):
    write_tiny(tmp_path, official=official)
    train_x, train_y, val_x, val_y, names = load_tinyimagenet(tmp_path, download=False)
    assert names == ("n00000000", "n00000001", "n00000002")  # the WordNet ids, sorted
    assert train_y.tolist() == [0, 0, 1, 1, 2, 2] and sorted(val_y.tolist()) == [0, 1, 2]
    assert_labels_follow_pixels(train_x, train_y)
    assert_labels_follow_pixels(val_x, val_y)  # a val image's label is its annotation's wnid


def test_a_grey_jpeg_among_the_colour_ones_becomes_rgb(tmp_path):
    write_tiny(tmp_path, grey=True)
    train_x, *_ = load_tinyimagenet(tmp_path, download=False)
    grey = train_x[0]
    assert grey.shape == (3, 64, 64) and torch.equal(grey[0], grey[1]) and torch.equal(grey[1], grey[2])
    assert not torch.equal(train_x[1][0], train_x[1][2])  # its colour sibling stays colour


def _annotations(base):
    return base / "val" / "val_annotations.txt"


@pytest.mark.parametrize("damage, message", [
    (lambda base: _annotations(base).write_text("val_0.JPEG\tn99999999\t0\t0\t1\t1\n"),
     r"line 1 labels 'val_0.JPEG' with 'n99999999', which is not a class of train/"),
    (lambda base: _annotations(base).write_text(_annotations(base).read_text() + "val_9.JPEG\tn00000000\n"),
     r"line 4 names 'val_9.JPEG', which is not a file in"),
    (lambda base: _annotations(base).write_text("../../train/n00000000/images/n00000000_0.JPEG\tn00000000\n"),
     r"line 1 is '\.\./\.\./train/.*'; expected <file name>"),
    (lambda base: _annotations(base).write_text("val_0.JPEG\tn00000002\n"),
     r"val image '.*val_1.JPEG' has no line in val_annotations.txt"),
    (lambda base: Image.new("RGB", (32, 32)).save(base / "train" / "n00000001" / "images" / "n00000001_0.JPEG"),
     r"TinyImageNet image '.*n00000001_0.JPEG' is 32x32 pixels; the data's images are 64x64"),
    (lambda base: (base / "train" / "n00000002" / "images" / "n00000002_1.JPEG").write_bytes(b"not a jpeg"),
     r"TinyImageNet image '.*n00000002_1.JPEG' cannot be read as an image"),
    (lambda base: [p.unlink() for p in (base / "train" / "n00000001" / "images").iterdir()],
     r"TinyImageNet train folder '.*n00000001' holds no JPEG or PNG images"),
])
def test_a_bad_file_or_line_is_one_error_naming_it(tmp_path, damage, message):
    base, _ = write_tiny(tmp_path)
    damage(base)
    with pytest.raises(TTPUserError, match=message):
        load_tinyimagenet(tmp_path, download=False)


def test_load_source_names_the_200_classes_and_a_missing_folder_is_not_found(tmp_path):
    with pytest.raises(TTPUserError, match=r"data set 'tinyimagenet' not found under .* and data.download=false "
                                           r"\(expected tiny-imagenet-200/train/<wnid>/images/\*\.JPEG"):
        registered_loader("tinyimagenet").load("tinyimagenet", tmp_path, download=False)
    _, wnids = write_tiny(tmp_path, classes=200, per_class=1)
    info, arrays = registered_loader("tinyimagenet").load("tinyimagenet", tmp_path, download=False)
    assert info.class_names == tuple(wnids) and info.num_classes == 200 and info.image_size == 64
    assert arrays.train_images.shape == (200, 3, 64, 64) and arrays.test_images.shape == (200, 3, 64, 64)
    assert_labels_follow_pixels(arrays.test_images, arrays.test_labels)
    with pytest.raises(TTPUserError, match=re.escape("has no automatic download; set data.download=false")):
        registered_loader("tinyimagenet").load("tinyimagenet", tmp_path, download=True)
