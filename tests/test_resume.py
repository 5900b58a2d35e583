"""Resume after a stop: a run stopped after epoch N and rerun gives the results of a run never stopped."""

import logging
import random

import numpy as np
import pytest
import torch
from omegaconf import open_dict

from ttp_lightning.alg1 import callbacks as alg1_callbacks_module
from ttp_lightning.core import proofs
from ttp_lightning.fit import callbacks as callbacks_module
from ttp_lightning.fit.checkpointing import LAST, RandomState, SignedCheckpointIO, resume_from
from ttp_lightning.run.pipeline import run

TIMING = ("wall", "per_s", "elapsed")


class Stopped(Exception):
    """Stands in for a kill: raised inside a fit, after the checkpoint of the previous epoch was written."""


def _untimed(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not any(t in k for t in TIMING) and k not in ("cache_file", "cached")}


def _job(compose_cfg, tmp_path, name: str, *overrides: str) -> dict:
    out = tmp_path / name
    out.mkdir()
    cfg = compose_cfg(f"paths.output_dir={out}", f"paths.cache_dir={tmp_path / 'cache'}", "attacks.enabled=false",
                      *overrides)
    with open_dict(cfg):
        del cfg["hydra"]
    return run(cfg, str(out)).to_json()


def _stop_at(monkeypatch, stage_word: str, epoch: int) -> None:
    """Make the fit whose stage name contains `stage_word` stop at the end of `epoch` (before its checkpoint)."""
    original = callbacks_module.FiniteGuard.on_train_epoch_end

    def stopping(self, trainer, pl_module):
        original(self, trainer, pl_module)
        if stage_word in self.stage and trainer.current_epoch + 1 == epoch:
            raise Stopped

    monkeypatch.setattr(callbacks_module.FiniteGuard, "on_train_epoch_end", stopping)


def _same(first: dict, second: dict) -> None:
    for stage in first["metrics"]:
        assert _untimed(first["metrics"][stage]) == _untimed(second["metrics"][stage]), stage
    for method, rows in first["history"].items():
        assert [_untimed(r) for r in rows] == [_untimed(r) for r in second["history"][method]]


@pytest.mark.parametrize("mode", ["minibatch", "fullbatch"])
def test_alg1_stopped_and_rerun_equals_an_uninterrupted_run(compose_cfg, tmp_path, monkeypatch, mode):
    overrides = (f"method.mode={mode}", "method.epochs=10", "method.early_stopping.patience=null")
    whole = _job(compose_cfg, tmp_path, "whole", *overrides, "checkpoint_every_n_epochs=0")
    with monkeypatch.context() as patch:
        _stop_at(patch, "method", 6)
        with pytest.raises(Stopped):
            _job(compose_cfg, tmp_path, "stopped", *overrides)
    assert list((tmp_path / "cache" / "checkpoints").glob(f"*_alg1/{LAST}"))
    resumed = _job(compose_cfg, tmp_path, "resumed", *overrides)
    assert resumed["resumed"] == {"Alg 1 finetuning": 5}
    assert whole["resumed"] == {}
    _same(whole, resumed)
    assert not any((tmp_path / "cache" / "checkpoints").iterdir())  # results written: checkpoints deleted
    # the wall time counts the stopped run's epochs too (it counted only the resumed ones)
    alg1 = next(m for m in resumed["metrics"].values() if "wall_to_best_s" in m)
    assert alg1["wall_s"] >= resumed["history"]["pareto"][-1]["elapsed_s"] > resumed["history"]["pareto"][4]["elapsed_s"]


def _released_weights(results: dict, out) -> str:
    from ttp_lightning.core.files import sha256_of

    return sha256_of(out / results["weights_file"])


@pytest.mark.parametrize("stragglers", [None, 1.0])
def test_robust_alg1_stopped_and_rerun_equals_an_uninterrupted_run(compose_cfg, tmp_path, monkeypatch, stragglers):
    """Robust Alg 1 draws from the inner attack's generator and attacks towards the starting model's predictions:
    a resumed fit must attack towards those, not towards the predictions of the weights it resumed from
    (issue 36: the history first differed at the epoch after the stop), and the per-image table and the
    released weights must be an uninterrupted run's, bit for bit. stragglers=1.0: the bound term acts on every
    unproven image (interval_focus=unproven with no cap), so the images it covers at the stop must come back
    from the checkpoint too."""
    if stragglers is not None:
        monkeypatch.setattr("ttp_lightning.alg1.module.STRAGGLERS", stragglers)
    overrides = ("method=pareto_robust", "method.epochs=6", "method.early_stopping.patience=null",
                 "release_gate.require=[clean]", "method.adversarial.eval_steps=5",
                 "trainer.num_sanity_val_steps=1")  # a sanity check draws before the first (resumed) epoch
    whole = _job(compose_cfg, tmp_path, "whole", *overrides, "checkpoint_every_n_epochs=0")
    with monkeypatch.context() as patch:
        _stop_at(patch, "method", 4)
        with pytest.raises(Stopped):
            _job(compose_cfg, tmp_path, "stopped", *overrides)
    resumed = _job(compose_cfg, tmp_path, "resumed", *overrides)
    assert resumed["resumed"] == {"Alg 1 finetuning": 3}
    _same(whole, resumed)
    assert whole["forget_per_image"] == resumed["forget_per_image"]
    assert _released_weights(whole, tmp_path / "whole") == _released_weights(resumed, tmp_path / "resumed")
    if stragglers is not None:  # the term covered images when the run stopped (after epoch 3)
        assert whole["history"]["pareto_robust"][2]["forget_unproven"] > 0


def test_pretraining_resumes_and_a_run_stopped_by_patience_stays_stopped(compose_cfg, tmp_path, monkeypatch, caplog):
    overrides = ("pretrain.epochs=6", "method.epochs=30", "method.early_stopping.patience=2",
                 "method.early_stopping.retain_acc_drop_at_most=null")
    whole = _job(compose_cfg, tmp_path, "whole", *overrides, "pretrain.use_cache=false", "checkpoint_every_n_epochs=0")
    stopped_at = whole["metrics"]["pareto"]["epochs_run"]
    assert stopped_at < 30  # patience ended it
    with monkeypatch.context() as patch:
        _stop_at(patch, "pretraining", 4)
        with pytest.raises(Stopped):
            _job(compose_cfg, tmp_path, "stopped_pretraining", *overrides)
    with monkeypatch.context() as patch:  # resumes pretraining, then stops in Alg 1 after patience ran out
        _stop_at(patch, "method", stopped_at + 1)
        fit_end = alg1_callbacks_module.ConstrainedBestModel.on_fit_end

        def end_then_stop(self, trainer, pl_module):  # a kill between the last checkpoint and the results
            raise Stopped

        patch.setattr(alg1_callbacks_module.ConstrainedBestModel, "on_fit_end", end_then_stop)
        with pytest.raises(Stopped), caplog.at_level(logging.INFO, logger="ttp_lightning.fit.checkpointing"):
            _job(compose_cfg, tmp_path, "stopped_finetuning", *overrides)
        assert "resuming pretraining A(D) from" in caplog.text and "(saved after epoch 3)" in caplog.text
        patch.setattr(alg1_callbacks_module.ConstrainedBestModel, "on_fit_end", fit_end)
    resumed = _job(compose_cfg, tmp_path, "resumed", *overrides)
    assert resumed["resumed"] == {"Alg 1 finetuning": stopped_at}
    assert resumed["metrics"]["pareto"]["epochs_run"] == stopped_at  # no epoch trained past the stop
    _same(whole, resumed)


def test_a_corrupt_checkpoint_is_reported_and_the_fit_starts_afresh(tmp_path, caplog):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / LAST).write_bytes(b"PK\x03\x04 truncated")
    proofs.sign(folder / LAST)  # ours, but cut short
    with caplog.at_level(logging.WARNING):
        assert resume_from(folder, resume=True, stage="test") is None
    assert "unreadable or corrupt" in caplog.text and str(folder / LAST) in caplog.text
    assert not (folder / LAST).exists()


def test_an_edited_checkpoint_is_reported_and_the_run_equals_an_untampered_one(compose_cfg, tmp_path, monkeypatch,
                                                                                caplog):
    """Someone who can write to the cache edits a weight of a resume checkpoint (a valid checkpoint, as one
    would to plant a model). Its keyed MAC fails: one warning, deleted, the fit starts afresh, and the results
    are an uninterrupted run's."""
    overrides = ("method.epochs=6", "method.early_stopping.patience=null")
    whole = _job(compose_cfg, tmp_path, "whole", *overrides, "checkpoint_every_n_epochs=0")
    with monkeypatch.context() as patch:
        _stop_at(patch, "method", 4)
        with pytest.raises(Stopped):
            _job(compose_cfg, tmp_path, "stopped", *overrides)
    path = next((tmp_path / "cache" / "checkpoints").glob(f"*_alg1/{LAST}"))
    checkpoint = torch.load(path, weights_only=True)
    name = next(iter(checkpoint["state_dict"]))
    checkpoint["state_dict"][name] += 0.5
    torch.save(checkpoint, path)
    with caplog.at_level(logging.WARNING):
        rerun = _job(compose_cfg, tmp_path, "rerun", *overrides)
    assert "checkpoint " + str(path) + " carries no valid proof" in caplog.text
    assert rerun["resumed"] == {}
    _same(whole, rerun)


def test_a_swapped_pretraining_cache_entry_with_its_record_rewritten_is_trained_again(compose_cfg, tmp_path, caplog):
    import hashlib
    import json

    from safetensors.torch import load_file, save_file

    first = _job(compose_cfg, tmp_path, "first", "method.epochs=3")
    weights = next((tmp_path / "cache" / "pretrain").glob("*.safetensors"))
    planted = {name: torch.zeros_like(tensor) for name, tensor in load_file(str(weights)).items()}
    save_file(planted, str(weights))
    record = weights.with_suffix(".json")
    text = json.loads(record.read_text())
    record.write_text(json.dumps({**text, "sha256": hashlib.sha256(weights.read_bytes()).hexdigest()}))
    with caplog.at_level(logging.WARNING):
        second = _job(compose_cfg, tmp_path, "second", "method.epochs=3")
    assert "pretraining cache entry " + str(weights) + " carries no valid proof" in caplog.text
    assert second["metrics"]["pretrain"]["cached"] is False
    _same(first, second)


def test_the_newest_of_last_and_a_slurm_requeue_checkpoint_is_resumed_and_resume_false_deletes(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    io = SignedCheckpointIO()  # how Lightning writes both
    io.save_checkpoint({"global_step": 40, "epoch": 3}, folder / LAST)
    io.save_checkpoint({"global_step": 47, "epoch": 4}, folder / "hpc_ckpt_1.ckpt")  # SLURM's signal, mid-epoch 5
    assert resume_from(folder, resume=True, stage="test").path == str(folder / "hpc_ckpt_1.ckpt")
    io.save_checkpoint({"global_step": 50, "epoch": 4}, folder / LAST)
    assert resume_from(folder, resume=True, stage="test").path == str(folder / LAST)
    assert resume_from(folder, resume=False, stage="test") is None
    assert not list(folder.iterdir())


def test_random_state_round_trips_every_global_generator_when_training_starts():
    """Restored as training starts, so draws between reading the checkpoint and the first resumed epoch (a sanity
    check's loaders, fit-start hooks) do not shift the resumed epochs' random numbers."""
    callback = RandomState()
    saved = callback.state_dict()
    first = (torch.rand(3), np.random.rand(3), random.random())
    callback.load_state_dict(saved)
    torch.rand(5), np.random.rand(5), random.random()  # what runs between the checkpoint's load and training
    callback.on_train_start(None, None)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(first[0], again[0]) and np.array_equal(first[1], again[1]) and first[2] == again[2]
    torch.rand(1)
    callback.on_train_start(None, None)  # applied once: a later start of the same fit draws on
    assert not torch.equal(torch.rand(3), again[0])


def test_a_cache_key_others_can_read_or_change_is_named_in_one_warning(tmp_path, monkeypatch, caplog):
    """Issue 36, case 7: whoever can read the key can sign a planted cache entry or checkpoint; a world-readable key
    file got no warning. 0600 (or 0640, to share a cache with a group) gets none."""
    key = tmp_path / "cache.key"
    monkeypatch.setenv(proofs.KEY_ENV, str(key))
    for mode, warned in ((0o600, False), (0o640, False), (0o644, True), (0o602, True)):
        proofs._key.cache_clear()
        key.unlink(missing_ok=True)
        proofs.mac_of(b"x")  # creates the key, 0600
        key.chmod(mode)
        proofs._key.cache_clear()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ttp_lightning.core.proofs"):
            proofs.mac_of(b"x")
        assert ("can be " in caplog.text and str(key) in caplog.text and "chmod 600" in caplog.text) == warned, mode
    proofs._key.cache_clear()
