"""data=imagefolder keeps the decoded images between runs (data.decoded_cache): an unchanged folder decodes
nothing, any changed, added or removed file or a changed setting decodes again, and an unreadable entry is
decoded again with one warning."""

import logging
import os
import re

import numpy as np
import pytest
import torch

from conftest import finished
from test_protect import write_png, write_two_class_tree
from ttp_lightning.data import images


def _arrays_equal(a, b) -> bool:
    return all(torch.equal(getattr(a, k), getattr(b, k)) for k in
               ("train_images", "train_labels", "test_images", "test_labels")) and a.class_names == b.class_names


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "pets"
    write_two_class_tree(root, np.random.default_rng(0))
    return root


def _no_decoding(monkeypatch):
    def refuse(path, what, decode=True):
        raise AssertionError(f"decoded {path}")
    monkeypatch.setattr(images, "open_image", refuse)


def test_an_unchanged_folder_is_read_from_the_cache_without_decoding(tree, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    info, arrays, prep = images.load_imagefolder(tree, 12, None, cache)
    assert len(list(cache.glob("*.safetensors"))) == 1
    with monkeypatch.context() as patch:
        _no_decoding(patch)
        info2, arrays2, prep2 = images.load_imagefolder(tree, 12, None, cache)
    assert info2 == info and prep2 == prep and _arrays_equal(arrays2, arrays)
    uncached = images.load_imagefolder(tree, 12, None, None)  # the same as decoding without a cache
    assert uncached[0] == info and _arrays_equal(uncached[1], arrays)


@pytest.mark.parametrize("change", ["new_pixels", "added", "removed", "setting"])
def test_a_changed_folder_or_setting_is_decoded_again(tree, tmp_path, change):
    cache = tmp_path / "cache"
    _, before, _ = images.load_imagefolder(tree, 12, None, cache)
    size = 12
    victim = tree / "train" / "cat" / "0.png"
    if change == "new_pixels":
        write_png(victim, np.full((16, 16, 3), 255, np.uint8), "RGB")
        os.utime(victim, ns=(victim.stat().st_atime_ns, victim.stat().st_mtime_ns + 10**9))
    elif change == "added":
        write_png(tree / "train" / "dog" / "extra.png", np.zeros((12, 12, 3), np.uint8), "RGB")
    elif change == "removed":
        victim.unlink()
    else:
        size = 8
    _, after, _ = images.load_imagefolder(tree, size, None, cache)
    fresh = images.load_imagefolder(tree, size, None, None)[1]
    assert _arrays_equal(after, fresh) and not _arrays_equal(after, before)
    assert len(list(cache.glob("*.safetensors"))) == 1  # the entry it replaced is gone


def test_an_image_removed_from_the_folder_leaves_no_copy_in_the_cache(tree, tmp_path):
    """A provider who deletes an image (a deletion request) must not find its pixels in the cache after the
    next run; another folder's entry stays."""
    cache = tmp_path / "cache"
    other = tmp_path / "other"
    write_two_class_tree(other, np.random.default_rng(1))
    images.load_imagefolder(other, 12, None, cache)
    victim = tree / "train" / "cat" / "3.png"
    _, before, _ = images.load_imagefolder(tree, 12, None, cache)
    pixels = images.read_file(victim, images.Preprocess(3, 12, True), "image")[0]
    assert any(torch.equal(pixels, image) for image in before.train_images)
    assert any(pixels.numpy().tobytes() in entry.read_bytes() for entry in cache.glob("*.safetensors"))
    victim.unlink()
    images.load_imagefolder(tree, 12, None, cache)
    assert len(list(cache.glob("*.safetensors"))) == 2  # this folder's new entry and the other folder's
    assert not any(pixels.numpy().tobytes() in entry.read_bytes() for entry in cache.glob("*.safetensors"))


@pytest.mark.parametrize("tamper", ["unreadable", "edited pixels"])
def test_an_unreadable_or_edited_entry_is_decoded_again_with_one_warning(tree, tmp_path, caplog, tamper):
    """A shared cache folder: someone without this user's key rewrites an entry (a valid safetensors file with
    other pixels, as one would to change what a run trains on). Its keyed MAC fails; it is decoded again."""
    from safetensors.torch import load_file, save_file

    cache = tmp_path / "cache"
    _, arrays, _ = images.load_imagefolder(tree, 12, None, cache)
    entry = next(cache.glob("*.safetensors"))
    if tamper == "unreadable":
        entry.write_bytes(b"not a safetensors file")
    else:
        from safetensors import safe_open

        with safe_open(str(entry), framework="pt") as handle:
            metadata = handle.metadata()
        tensors = load_file(str(entry))
        tensors["train_images"][0] = 255 - tensors["train_images"][0]
        save_file(tensors, str(entry), metadata=metadata)
    with caplog.at_level(logging.WARNING):
        _, again, _ = images.load_imagefolder(tree, 12, None, cache)
    assert _arrays_equal(again, arrays)
    warnings = [r.message for r in caplog.records if "no valid proof" in r.message]
    assert len(warnings) == 1 and "computing it again" in warnings[0] and str(entry) in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _, third, _ = images.load_imagefolder(tree, 12, None, cache)  # rewritten and signed: used again
    assert _arrays_equal(third, arrays) and not caplog.records


def test_the_decoded_cache_is_used_by_a_run_when_asked_for_and_is_off_by_default(run_main, tree, tmp_path):
    args = ("data=imagefolder", f"data.root={tree}", "data.image_size=12", "data.forget.size=4", "method.epochs=2",
            "pretrain.epochs=2", "attacks.enabled=false")
    code, _, err, results = run_main(*args)
    finished(code, results, err)
    entry = re.compile(r"[0-9a-f]{16}_[0-9a-f]{32}\.safetensors")
    assert not any(entry.fullmatch(path.name) for path in tmp_path.rglob("*"))  # off by default
    code, _, err, results = run_main(*args, f"data.decoded_cache={tmp_path / 'decoded'}")
    finished(code, results, err)
    assert len(list((tmp_path / "decoded").glob("*.safetensors"))) == 1
    assert results["config"]["data"]["decoded_cache"] == str(tmp_path / "decoded")


def test_decoded_cache_is_refused_for_a_registered_data_set(run_job, tmp_path):
    job, results = run_job("data.decoded_cache=" + str(tmp_path))
    assert job.returncode == 2 and results is None
    assert job.stderr.strip() == ("error: data.decoded_cache is only for data=imagefolder; data set 'digits' is "
                                  "read from its own files every run")
