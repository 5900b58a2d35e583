"""A provider's own validation images (issue 61): data=imagefolder reads <data.root>/val/<class>/<image>, which
is never trained on (not by pretraining, not by finetuning, in either data.split); robust Alg 1's retain rule
reads its accuracy there by default (retain_holdout=auto), finetuning on the whole retain set, and results.json
and the card say so."""

import importlib.util

import pytest
import torch
from omegaconf import open_dict

from conftest import REPO
from ttp_lightning.alg1.method import retain_parts
from ttp_lightning.alg1.schema import EarlyStoppingSchema
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.data import images


def _letters():
    spec = importlib.util.spec_from_file_location("make_letters", REPO / "scripts" / "make_letters.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("letters") / "data"
    _letters().main([str(root), "--train", "300", "--test", "100", "--val", "80", "--seed", "5"])
    return root


def _rows(tensor) -> set[bytes]:
    return {bytes(image.numpy()) for image in tensor}


def test_val_is_read_beside_train_and_test_and_cached_with_them(folder, tmp_path):
    info, arrays, _ = images.load_imagefolder(folder, None, None)
    assert arrays.val_images.shape == (80, 1, 28, 28) and sorted(set(arrays.val_labels.tolist())) == list(range(10))
    assert not _rows(arrays.val_images) & _rows(arrays.train_images)
    cached = [images.load_imagefolder(folder, None, None, tmp_path / "cache")[1] for _ in range(2)]  # write, read
    for again in cached:
        assert torch.equal(again.val_images, arrays.val_images) and torch.equal(again.val_labels, arrays.val_labels)
    # the statistics are train/'s alone: a val/ folder does not move the normalisation
    without = tmp_path / "without"
    without.mkdir()
    (without / "train").symlink_to(folder / "train")
    (without / "test").symlink_to(folder / "test")
    plain_info, plain, _ = images.load_imagefolder(without, None, None)
    assert plain_info == info and plain.val_images is None


def test_a_val_class_that_train_lacks_is_one_line(folder, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train").symlink_to(folder / "train")
    (bad / "val" / "Z").mkdir(parents=True)
    (bad / "val" / "Z" / "0.png").write_bytes((folder / "val" / "A" / "00000.png").read_bytes())
    with pytest.raises(TTPUserError, match=r"val/ has the class folder 'Z', which train/ does not have; allowed: A, B"):
        images.load_imagefolder(bad, None, None)


def _datamodule(compose_cfg, *overrides):
    from ttp_lightning.data import build_datamodule
    from ttp_lightning.run.validation import validate_config

    cfg = compose_cfg("data.forget.size=10", *overrides)
    with open_dict(cfg):
        del cfg["hydra"]
    return build_datamodule(validate_config(cfg).data)


@pytest.mark.parametrize("split", ["official", "paper"])
def test_auto_reads_val_and_finetunes_on_the_whole_retain_set(compose_cfg, folder, split):
    datamodule = _datamodule(compose_cfg, "data=imagefolder", f"data.root={folder}", f"data.split={split}")
    parts = retain_parts(datamodule, EarlyStoppingSchema(retain_holdout="auto", retain_acc_drop_at_most=0.2))
    assert parts.source == "val" and parts.reference(datamodule) == "val" and parts.key == "val/retain_holdout_acc"
    # val/ in two halves: the rules select on one, the cost is confirmed on the other (issue 79); a 20-point
    # budget is 8 images of a 40-image half (1 point would be 0.4 of an image: left whole)
    whole = retain_parts(datamodule, EarlyStoppingSchema(retain_holdout="auto"))
    assert len(whole.holdout) == 80 and whole.confirm is None
    assert len(parts.fit) == len(datamodule.retain_indices) and len(parts.holdout) == len(parts.confirm) == 40
    held, confirm = _rows(parts.holdout.everything()[0]), _rows(parts.confirm.everything()[0])
    assert not held & confirm and len(held | confirm) == 80 and parts.eval_parts[-1] == "retain_confirm"
    trained = _rows(datamodule.train_images)  # split=paper mixes train and test; val stays out of both
    assert not (held | confirm) & (trained | _rows(datamodule.test_images))
    sliced = retain_parts(datamodule, EarlyStoppingSchema(retain_holdout=0.2, retain_acc_drop_at_most=0.2))  # a fraction is the slice asked for
    assert sliced.source == "slice" and \
        len(sliced.fit) + len(sliced.holdout) + len(sliced.confirm) == len(datamodule.retain_indices)
    assert retain_parts(datamodule, EarlyStoppingSchema(retain_holdout=0.0)).holdout is None


def test_retain_holdout_val_without_val_images_is_one_line(compose_cfg):
    datamodule = _datamodule(compose_cfg, "data=digits")
    assert len(datamodule.val_labels) == 0
    assert retain_parts(datamodule, EarlyStoppingSchema(retain_holdout="auto")).source == "slice"
    with pytest.raises(TTPUserError, match=r"retain_holdout=val needs validation images, <data.root>/val/"):
        retain_parts(datamodule, EarlyStoppingSchema(retain_holdout="val"))
    with pytest.raises(TTPUserError, match=r"retain_holdout=every is not allowed; choose auto, val or a fraction"):
        EarlyStoppingSchema(retain_holdout="every")


def _pareto(stopping: EarlyStoppingSchema):
    from types import SimpleNamespace

    from ttp_lightning.alg1.method import Pareto

    return Pareto(SimpleNamespace(name="pareto", early_stopping=stopping))


@pytest.mark.parametrize("setting", ["auto", 0.1])
def test_where_this_run_pretrains_the_slice_leaves_d_before_a_d_trains(compose_cfg, setting):
    """Pareto.hold_out (issue 61): where this run trains A(D), the retain rule's slice is taken out of D whole
    (pretraining, finetuning, the floor's retraining and Alg 4's requests leave it out) and read as val/ is; the
    cache key of A(D) changes with it. A provider's checkpoint, a val/ folder or the paper's rule take nothing."""
    def method(holdout):  # hold_out reads the method's early stopping alone
        return _pareto(EarlyStoppingSchema(retain_holdout=holdout))

    datamodule = _datamodule(compose_cfg, "data=digits")
    retain, pretrain = datamodule.retain_indices.clone(), _rows(datamodule.dataset("pretrain").everything()[0])
    fingerprint = datamodule.data_fingerprint()
    expected = datamodule.retain_split(0.2 if setting == "auto" else setting)[1]  # digits: a fifth by rule
    method(setting).hold_out(datamodule, pretrains=False)  # a provider's checkpoint: A(D) saw the slice
    method(0.0).hold_out(datamodule, pretrains=True)  # the paper's rule reads the retain set
    assert len(datamodule.val_labels) == 0 and torch.equal(datamodule.retain_indices, retain)
    method(setting).hold_out(datamodule, pretrains=True)
    assert datamodule.val_source == "withheld" and torch.equal(datamodule.withheld, expected)
    held = _rows(datamodule.dataset("val").everything()[0])
    assert len(held) == len(expected) and held <= pretrain
    for part in ("pretrain", "train", "retain"):
        assert not _rows(datamodule.dataset(part).everything()[0]) & held, part
    assert len(datamodule.retain_indices) == len(retain) - len(expected)
    assert not _rows(datamodule.request_parts(1)[0].everything()[0]) & held
    assert datamodule.data_fingerprint() != fingerprint  # A(D) is another model: another cache entry
    parts = retain_parts(datamodule, EarlyStoppingSchema(retain_holdout=setting, retain_acc_drop_at_most=0.1))
    assert (parts.source, parts.reference(datamodule)) == ("withheld", "val")
    assert len(parts.holdout) + len(parts.confirm) == len(expected)
    whole = retain_parts(datamodule, EarlyStoppingSchema(retain_holdout=setting))  # 1 point: too few a half
    assert len(whole.holdout) == len(expected) and whole.confirm is None
    assert len(parts.fit) == len(datamodule.retain_indices)
    with pytest.raises(TTPUserError, match="already has .* validation images"):
        datamodule.withhold(0.1)


def test_a_val_folder_is_not_withheld_from(compose_cfg, folder):
    datamodule = _datamodule(compose_cfg, "data=imagefolder", f"data.root={folder}")
    retain = datamodule.retain_indices.clone()
    _pareto(EarlyStoppingSchema()).hold_out(datamodule, pretrains=True)
    assert datamodule.val_source == "folder" and len(datamodule.val_labels) == 80
    assert torch.equal(datamodule.retain_indices, retain) and len(datamodule.withheld) == 0


def test_robust_alg1_reads_its_retain_rule_on_val_and_says_so(compose_cfg, folder, tmp_path, monkeypatch):
    from ttp_lightning.run.pipeline import run

    monkeypatch.setenv("TTP_CACHE_DIR", str(tmp_path / "cache"))
    cfg = compose_cfg("data=imagefolder", f"data.root={folder}", "data.forget.size=10", "method=pareto_robust",
                      f"paths.output_dir={tmp_path}", "method.epochs=3", "attacks.enabled=false",
                      "release_gate.require=[clean]", "method.lr=0.01",
                      "method.early_stopping.retain_acc_drop_at_most=0.2")  # 8 images of a 40-image half
    with open_dict(cfg):
        del cfg["hydra"]
    result = run(cfg, str(tmp_path)).to_json()
    metrics, history = result["metrics"]["pareto_robust"], result["history"]["pareto_robust"]
    assert result["data"]["val_size"] == 80
    assert (metrics["retain_holdout_source"], metrics["retain_holdout_size"], metrics["retain_reference"]) == \
        ("val", 40, "val")  # the selection half of val/; the other 40 confirm the cost
    confirmed = metrics["retain_confirmed"]
    assert confirmed["images"] == 40 and confirmed["paired"] and confirmed["cost_upper"] >= confirmed["cost"]
    assert metrics["retain_rule_reads"] == "retain_holdout_acc" and "retain_holdout_acc >= " in metrics["stopping_rule"]
    kept = history[metrics["best_epoch"] - 1]
    # val/ is outside the retain set: the accuracy on the images trained on is the retain set's own
    assert metrics["retain_fit_acc"] == pytest.approx(kept["retain_acc"], abs=1e-6)
    assert metrics["retain_holdout_acc"] == pytest.approx(kept["retain_holdout_acc"], abs=1e-6)
    assert all(round(row["retain_holdout_acc"] * 40, 3) == round(row["retain_holdout_acc"] * 40) for row in history)
    # tau_r is relative to A(D)'s accuracy on val/, not on the test split
    assert metrics["retain_acc_threshold"] == pytest.approx(metrics["retain_rule_start_acc"] - 0.2, abs=1e-6)
    folders = [f for f in tmp_path.iterdir() if f.name.startswith("release")]
    card = (folders[0] / "README.md").read_text()
    assert f"{metrics['retain_holdout_acc']:.2%} on the 40 validation images of the provider's own (val/)" in card
    assert f"on {confirmed['images']} more such images that no rule chose the kept epoch by" in card
