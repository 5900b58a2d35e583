"""CIFAR10 / CIFAR100 read from their official python files without unpickling them (data/cifar.py): the same
arrays torchvision reads, a hostile file refused before its payload runs, and the pipeline on CIFAR-shaped
files written in the official layout."""

import json
import pickle
import re

import numpy as np
import pytest
import torch

from conftest import finished, registered_loader, release_of
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.data import cifar


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_the_official_layout_reads_as_torchvision_reads_it(tmp_path, monkeypatch, name):
    import torchvision.datasets as tvd
    import torchvision.datasets.cifar as tv_cifar

    root = cifar.write_synthetic(name, tmp_path, train=203, test=41)
    info, arrays = registered_loader(name).load(name, root, download=False)
    assert arrays.train_images.shape == (203, 3, 32, 32) and arrays.test_images.shape == (41, 3, 32, 32)
    assert arrays.train_images.dtype == torch.uint8 and int(arrays.train_labels.max()) < info.num_classes
    monkeypatch.setattr(tv_cifar, "check_integrity", lambda *a, **k: True)  # not the official files' MD5s
    for train, images, labels in ((True, arrays.train_images, arrays.train_labels),
                                  (False, arrays.test_images, arrays.test_labels)):
        reference = getattr(tvd, name.upper())(str(root), train=train)  # torchvision's pickle.load, on our files
        assert torch.equal(torch.as_tensor(reference.data).permute(0, 3, 1, 2), images)
        assert reference.targets == labels.tolist()
    assert info.class_names == tuple(reference.classes) and len(info.class_names) == info.num_classes


def test_without_a_meta_file_the_classes_are_their_indices_and_a_bad_one_is_corrupt(tmp_path):
    root = cifar.write_synthetic("cifar10", tmp_path, train=20, test=10)
    meta = root / "cifar-10-batches-py" / "batches.meta"
    meta.unlink()
    info, _ = registered_loader("cifar10").load("cifar10", root, download=False)
    assert info.names() == tuple(str(i) for i in range(10))
    for content, message in (({"label_names": ["a", "b"]}, "names 2 classes; it has 10"),
                             ({"label_names": "airplane"}, "'label_names' must be a list of class names"),
                             ({"label_names": [_Payload(tmp_path / "marker")]}, "which a CIFAR file never holds")):
        meta.write_bytes(pickle.dumps(content, protocol=2))
        with pytest.raises(TTPUserError, match=message):
            registered_loader("cifar10").load("cifar10", root, download=False)
    assert not (tmp_path / "marker").exists()


def _write_marker(path: str) -> None:
    from pathlib import Path

    Path(path).write_text("pwned")


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (_write_marker, (str(self.marker),))


def test_a_hostile_cifar_file_is_refused_and_its_payload_never_runs(tmp_path):
    root = cifar.write_synthetic("cifar10", tmp_path / "data", train=50, test=10)
    marker = tmp_path / "marker.txt"
    batch = root / "cifar-10-batches-py" / "data_batch_3"
    batch.write_bytes(pickle.dumps({"data": np.zeros((1, 3072), np.uint8), "labels": [_Payload(marker)]}, protocol=2))
    with pytest.raises(TTPUserError, match=r"names \S+\._write_marker, which a CIFAR file never holds \(refused"):
        registered_loader("cifar10").load("cifar10", root, download=False)
    assert not marker.exists()
    pickle.loads(batch.read_bytes())  # the same file through pickle.load does run its payload
    assert marker.read_text() == "pwned"


@pytest.mark.parametrize("content, message", [
    ({"data": np.zeros((4, 3072), np.float32), "labels": [0] * 4}, r"'data' must be a uint8 N x 3072 array, found float32"),
    ({"data": np.zeros((4, 1024), np.uint8), "labels": [0] * 4}, r"found uint8 \[4, 1024\]"),
    ({"data": np.zeros((4, 3072), np.uint8), "labels": [0] * 3}, r"'labels' must be 4 integers"),
    ({"data": np.zeros((4, 3072), np.uint8), "labels": ["cat"] * 4}, r"'labels' must be 4 integers"),
    ([1, 2, 3], r"holds a list, not a CIFAR batch"),
    (b"truncated", None),
])
def test_a_malformed_cifar_file_is_called_corrupt_in_one_error(tmp_path, content, message):
    root = cifar.write_synthetic("cifar10", tmp_path, train=50, test=10)
    batch = root / "cifar-10-batches-py" / "test_batch"
    batch.write_bytes(content if isinstance(content, bytes) else pickle.dumps(content, protocol=2))
    with pytest.raises(TTPUserError) as error:
        registered_loader("cifar10").load("cifar10", root, download=False)
    text = str(error.value)
    assert "could not be read; its files look corrupt" in text and len(text.splitlines()) == 1
    if message:
        assert re.search(message, text), text


def test_missing_cifar_files_are_not_found_not_corrupt(tmp_path):
    with pytest.raises(TTPUserError, match=r"data set 'cifar100' not found under .* and data.download=false"):
        registered_loader("cifar100").load("cifar100", tmp_path, download=False)


def test_alg1_on_cifar_shaped_files_with_crop_flip_runs_end_to_end(run_job, tmp_path):
    root = cifar.write_synthetic("cifar10", tmp_path / "data", train=400, test=100)
    job, results = run_job("data=cifar10", f"data.root={root}", "data.augment=crop_flip", "model=mlp",
                           "pretrain.epochs=6", "method.epochs=6", "attacks.enabled=false")
    finished(job.returncode, results, job.stderr)
    assert results["experiment"] == "cifar10_mlp"  # named by its data and model, not the default job
    pretrained, finetuned = results["metrics"]["pretrain"], results["metrics"]["pareto"]
    assert pretrained["test_acc"] > 0.5  # the class templates are learnable; chance is 0.1
    assert finetuned["forget_conf_dist"] < pretrained["forget_conf_dist"]
    released = json.loads((release_of(tmp_path / "out") / "config.json").read_text())
    assert released["input"]["class_names"] == [f"class{i}" for i in range(10)]  # from the meta file
