import json

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import MNIST_ROOT, needs_mnist, registered_loader
from ttp_lightning.core import batching
from ttp_lightning.core.batching import ShardedBatchSampler, random_crop_flip
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.data import TTPDataModule, build_datamodule
from ttp_lightning.data.forget import select_forget, select_forget_requests


def digits(**kwargs) -> TTPDataModule:
    dm = TTPDataModule(name="digits", loader=registered_loader("digits"), split="paper", **kwargs)
    dm.setup()
    return dm


def test_digits_paper_split_is_70_30_and_deterministic():
    a, b = digits(forget={"size": 20}), digits(forget={"size": 20})
    assert len(a.train_labels) == 1258 and len(a.test_labels) == 539
    assert torch.equal(a.train_images, b.train_images) and torch.equal(a.forget_indices, b.forget_indices)
    assert a.train_images.dtype == torch.uint8 and a.train_images.shape[1:] == (1, 8, 8)
    c = digits(forget={"size": 20}, split_seed=1)
    assert not torch.equal(a.train_labels, c.train_labels)


def test_forget_and_retain_partition_the_training_set():
    dm = digits(forget={"size": 30, "seed": 3})
    forget, retain = set(dm.forget_indices.tolist()), set(dm.retain_indices.tolist())
    assert len(forget) == 30 and not forget & retain and len(forget | retain) == len(dm.train_labels)
    assert len(dm.dataset("forget")) == 30 and len(dm.dataset("retain")) == len(dm.train_labels) - 30
    other_seed = digits(forget={"size": 30, "seed": 4})
    assert not torch.equal(dm.forget_indices, other_seed.forget_indices)


def test_retain_split_holds_out_a_seeded_slice_of_the_retain_set():
    dm = digits(forget={"size": 20})
    fit, holdout = dm.retain_split(0.1)
    retain = set(dm.retain_indices.tolist())
    assert len(holdout) == round(0.1 * len(retain)) and not set(fit.tolist()) & set(holdout.tolist())
    assert set(fit.tolist()) | set(holdout.tolist()) == retain  # no forget image on either side
    again_fit, again_holdout = digits(forget={"size": 20}).retain_split(0.1)
    assert torch.equal(fit, again_fit) and torch.equal(holdout, again_holdout)
    assert not torch.equal(holdout, digits(forget={"size": 20}, seed=1).retain_split(0.1)[1])
    assert len(dm.retain_split(0.0)[1]) == 0 and len(dm.retain_split(1e-9)[1]) == 1
    images, labels = dm.subset(holdout).everything()
    assert torch.equal(labels, dm.train_labels[holdout]) and len(images) == len(holdout)
    with pytest.raises(TTPUserError, match="holds out all"):
        dm.retain_split(1.0)


def test_forget_source_test_moves_test_instances_into_the_training_data():
    plain, outside = digits(forget={"size": 20}), digits(forget={"size": 20, "source": "test"})
    assert outside.outside_forget_count == 20 and len(outside.test_labels) == len(plain.test_labels) - 20
    assert len(outside.train_labels) == len(plain.train_labels) + 20
    assert outside.forget_indices.tolist() == list(range(len(plain.train_labels), len(plain.train_labels) + 20))
    assert torch.equal(outside.retain_indices, torch.arange(len(plain.train_labels)))
    # A(D) trains on the original training set only: same part `pretrain`, same cache fingerprint
    assert torch.equal(outside.dataset("pretrain").everything()[0], plain.dataset("train").everything()[0])
    assert outside.data_fingerprint() == plain.data_fingerprint()
    def rows(images):
        return sorted(tuple(row.tolist()) for row in images.flatten(1))

    # the forget instances left the test set: together with what stayed they are the original test set
    moved = outside.train_images[outside.forget_indices]
    assert rows(torch.cat([moved, outside.test_images])) == rows(plain.test_images)


def test_forget_source_mixed_draws_the_test_fraction_from_the_test_set():
    dm = digits(forget={"size": 20, "source": "mixed", "test_fraction": 0.25})
    assert dm.outside_forget_count == 5 and len(dm.forget_indices) == 20
    assert (dm.forget_indices < dm.pretrain_size).sum() == 15
    assert digits(forget={"size": 20, "source": "mixed", "test_fraction": 0.0}).outside_forget_count == 0
    assert digits(forget={"size": 20, "source": "mixed", "test_fraction": 1.0}).outside_forget_count == 20
    with pytest.raises(TTPUserError, match=r"data.forget.test_fraction=1.5 is not allowed; choose a value in \[0, 1\]"):
        digits(forget={"size": 20, "source": "mixed", "test_fraction": 1.5})
    with pytest.raises(TTPUserError, match="data.forget.size=600 is not allowed; choose 1..538 \\(test set size 539\\)"):
        digits(forget={"size": 600, "source": "test"})
    with pytest.raises(TTPUserError, match=r"data.forget.source: Invalid value 'holdout', expected one of \[train, test, mixed\]"):
        digits(forget={"source": "holdout"})
    with pytest.raises(TTPUserError, match="data.forget.requests needs data.forget.source=train"):
        digits(forget={"requests": [5, 5], "source": "test"})


def test_forget_index_files(tmp_path):
    (tmp_path / "f.txt").write_text("5, 3\n9")
    (tmp_path / "f.json").write_text(json.dumps([1, 2]))
    np.save(tmp_path / "f.npy", np.array([7, 0]))
    assert select_forget(10, None, 0, str(tmp_path / "f.txt")).tolist() == [3, 5, 9]
    assert select_forget(10, None, 0, str(tmp_path / "f.json")).tolist() == [1, 2]
    assert select_forget(10, None, 0, str(tmp_path / "f.npy")).tolist() == [0, 7]
    (tmp_path / "bad.txt").write_text("3 10")
    with pytest.raises(TTPUserError, match="forget index 10 out of range; allowed 0..9"):
        select_forget(10, None, 0, str(tmp_path / "bad.txt"))
    (tmp_path / "dup.txt").write_text("3 3")
    with pytest.raises(TTPUserError, match="repeats"):
        select_forget(10, None, 0, str(tmp_path / "dup.txt"))
    with pytest.raises(TTPUserError, match="does not exist"):
        select_forget(10, None, 0, str(tmp_path / "missing.txt"))
    with pytest.raises(TTPUserError, match=r"data.forget.size=10 is not allowed; choose 1..9"):
        select_forget(10, 10, 0, None)


def test_forget_requests_are_disjoint_and_build_cumulative_parts(tmp_path):
    (tmp_path / "r.txt").write_text("1 2 3")
    dm = digits(forget={"requests": [5, str(tmp_path / "r.txt"), 4], "seed": 1})
    first, second, third = dm.forget_requests
    assert len(first) == 5 and second.tolist() == [1, 2, 3] and len(third) == 4
    assert len(set(torch.cat(dm.forget_requests).tolist())) == 12
    assert torch.equal(dm.forget_indices, torch.cat(dm.forget_requests).sort().values)
    retain, forget = dm.request_parts(2)
    assert len(forget) == 8 and len(retain) == len(dm.train_labels) - 8
    retain, forget = dm.request_parts(3)
    assert torch.equal(forget.labels.sort().values, dm.dataset("forget").labels.sort().values)
    assert len(retain) == len(dm.dataset("retain"))
    with pytest.raises(TTPUserError, match="forget request 2 .* repeats index 1 of an earlier request"):
        select_forget_requests(10, [str(tmp_path / "r.txt"), str(tmp_path / "r.txt")], 0)
    with pytest.raises(TTPUserError, match=r"forget request 2 = 8 is not allowed; choose a size in 1..7"):
        select_forget_requests(10, [2, 8], 0)
    with pytest.raises(TTPUserError, match="requests is empty"):
        select_forget_requests(10, [], 0)


def test_bad_data_settings_name_the_value():
    with pytest.raises(TTPUserError, match="data set 'nope' names no loader"):
        TTPDataModule(name="nope").setup()
    with pytest.raises(TTPUserError, match=r"data.split: Invalid value 'random', expected one of \[official, paper\]"):
        build_datamodule(OmegaConf.create({"_target_": "ttp_lightning.data.TTPDataModule", "name": "digits",
                                           "split": "random"}))
    with pytest.raises(TTPUserError, match=r"data.forget.source: Invalid value 'holdout'"):
        TTPDataModule(name="digits", loader=registered_loader("digits"), forget={"source": "holdout"})
    with pytest.raises(TTPUserError, match="no official test split"):
        TTPDataModule(name="digits", loader=registered_loader("digits"), split="official").setup()


def test_missing_files_give_one_line_with_path_and_expected_files(tmp_path):
    with pytest.raises(TTPUserError) as info:
        TTPDataModule(name="mnist", loader=registered_loader("mnist"), root=str(tmp_path)).setup()
    message = str(info.value)
    assert "\n" not in message and str(tmp_path) in message and "train-images-idx3-ubyte" in message


@needs_mnist
def test_mnist_official_split_and_subset():
    dm = TTPDataModule(name="mnist", loader=registered_loader("mnist"), root=str(MNIST_ROOT), forget={"size": 100}, max_test_size=500)
    dm.setup()
    assert len(dm.train_labels) == 60000 and len(dm.test_labels) == 500
    images, _labels = dm.dataset("forget")[[0, 1]]
    assert images.shape == (2, 1, 28, 28) and 0.0 <= images.min() and images.max() <= 1.0
    assert dm.info.num_classes == 10


def test_eval_shards_are_disjoint_and_complete(monkeypatch):
    seen = []
    for rank in range(3):
        monkeypatch.setattr(batching, "_rank_and_world", lambda rank=rank: (rank, 3))
        sampler = ShardedBatchSampler(10, 4, shuffle=False, drop_last=False, equal_shards=False)
        seen += [i for batch in sampler for i in batch]
    assert sorted(seen) == list(range(10))


def test_training_shards_have_equal_length_and_reshuffle(monkeypatch):
    monkeypatch.setattr(batching, "_rank_and_world", lambda: (1, 2))
    sampler = ShardedBatchSampler(11, 2, shuffle=True, drop_last=False, seed=0)
    first, second = list(sampler), list(sampler)
    assert sum(map(len, first)) == 5 and len(first) == len(sampler) == 3
    assert first != second


def test_crop_flip_keeps_shape_and_content_scale():
    images = torch.rand(5, 3, 8, 8)
    out = random_crop_flip(images, torch.Generator().manual_seed(0))
    assert out.shape == images.shape and out.max() <= images.max()


def test_crop_flip_is_a_per_image_crop_of_the_padded_image_flipped_or_not_from_the_generator_alone():
    images = torch.rand(64, 3, 10, 12)
    out = random_crop_flip(images, torch.Generator().manual_seed(5))
    again = random_crop_flip(images, torch.Generator().manual_seed(5))
    assert torch.equal(out, again)
    padded = torch.nn.functional.pad(images, (4,) * 4)
    draws = torch.Generator().manual_seed(5)
    offsets, flips = torch.randint(0, 9, (64, 2), generator=draws), torch.rand(64, generator=draws) < 0.5
    for i in range(64):
        top, left = offsets[i].tolist()
        crop = padded[i, :, top:top + 10, left:left + 12]
        assert torch.equal(out[i], crop.flip(-1) if flips[i] else crop)
    assert 10 < int(flips.sum()) < 54 and len({tuple(o) for o in offsets.tolist()}) > 20


def test_nearest_test_neighbours_of_the_forget_set():
    dm = digits(forget={"size": 7, "seed": 2})
    nearest = dm.nearest_test_indices(chunk_size=3)
    for position, train_index in enumerate(dm.forget_indices):
        distances = (dm.test_images.flatten(1).float() - dm.train_images[train_index].flatten().float()).norm(dim=1)
        assert distances[nearest[position]] == distances.min()
    _, labels = dm.dataset("forget_nn")[list(range(7))]
    assert torch.equal(labels, dm.test_labels[nearest]) and "forget_nn" in dm.eval_parts()


def test_a_data_root_the_embedded_data_set_does_not_read_is_warned_about(compose_cfg, caplog):
    """data.root on the embedded digits would be silently ignored: one warning names it; the default and a data set
    that reads its files say nothing."""
    import logging

    from omegaconf import open_dict

    from ttp_lightning.run.validation import validate_config

    def warnings(*overrides):
        cfg = compose_cfg(*overrides)
        with open_dict(cfg):
            del cfg["hydra"]
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            validate_config(cfg)
        return [r.getMessage() for r in caplog.records if "data.root" in r.getMessage()]

    assert warnings("data.root=/nonexistent") == [
        "data.root=/nonexistent is ignored: data=digits reads no files, it needs nothing (bundled with scikit-learn)"]
    assert warnings() == []
    assert warnings("paths.data_dir=/elsewhere") == []  # the root follows paths.data_dir: not set by hand
    assert warnings("data=mnist", "data.root=/nonexistent") == []  # read there (and refused there if missing)
