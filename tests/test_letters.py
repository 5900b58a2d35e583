"""scripts/make_letters.py (issue 61): a stand-in that is not MNIST, written as an image folder that data=imagefolder
reads; the same arguments give the same bytes; some typefaces are the test split's alone."""

import hashlib
import importlib.util

import pytest

from conftest import REPO
from ttp_lightning.data import images


@pytest.fixture(scope="module")
def letters():
    spec = importlib.util.spec_from_file_location("make_letters", REPO / "scripts" / "make_letters.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _digest(folder):
    return hashlib.sha256(b"".join(path.relative_to(folder).as_posix().encode() + path.read_bytes()
                                   for path in sorted(folder.rglob("*.png")))).hexdigest()


def test_the_letters_are_an_image_folder_the_same_arguments_write_again(letters, tmp_path):
    letters.main([str(tmp_path / "a"), "--train", "40", "--test", "20", "--seed", "3"])
    letters.main([str(tmp_path / "b"), "--train", "40", "--test", "20", "--seed", "3"])
    letters.main([str(tmp_path / "c"), "--train", "40", "--test", "20", "--seed", "4"])
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b") != _digest(tmp_path / "c")
    info, arrays, _ = images.load_imagefolder(tmp_path / "a", None, None)
    assert info.num_classes == 10 and info.channels == 1 and info.image_size == 28 and info.class_names[0] == "A"
    assert arrays.train_images.shape == (40, 1, 28, 28) and arrays.test_images.shape == (20, 1, 28, 28)
    assert sorted(set(arrays.train_labels.tolist())) == list(range(10))
    spread = (arrays.train_images.flatten(1).double() / 255).std(0).mean()  # glyphs move: no fixed pixel
    assert spread > 0.1


def test_some_typefaces_are_the_test_splits_alone_and_bad_arguments_are_one_line(letters, tmp_path):
    train, test = letters.split_fonts(0, 4)
    assert set(train) < set(test) and len(test) - len(train) == 4 and len(train) >= 10
    assert letters.split_fonts(0, 4) == (train, test) and letters.split_fonts(1, 4) != (train, test)
    with pytest.raises(SystemExit, match="--unseen-fonts=99 is not allowed"):
        letters.split_fonts(0, 99)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(SystemExit, match="is not empty"):
        letters.main([str(tmp_path / "full")])
