"""A(D): ERM pretraining on the whole training set, cached on disk so sweeps pretrain once."""

import functools
import hashlib
import json
import logging
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

import torch
from filelock import FileLock
from safetensors.torch import load as load_tensors
from torch import nn

from ttp_lightning.assess.evaluation import evaluate
from ttp_lightning.bounds.training import ibp_initialise
from ttp_lightning.core import proofs
from ttp_lightning.core.files import atomic_tensors, atomic_text, sha256_of
from ttp_lightning.data.datamodule import TTPDataModule
from ttp_lightning.fit.checkpointing import remove as remove_checkpoints
from ttp_lightning.fit.training import RunContext, checkpoint_folder, fit
from ttp_lightning.models.certified_erm import CertifiedERMModule, phases
from ttp_lightning.models.components.checkpoint import load_checkpoint
from ttp_lightning.models.erm import ERMModule
from ttp_lightning.models.optim import optimizer_settings

CACHE_FORMAT = 3  # 3: augmentation reseeded per epoch (resumable); 2: safetensors + checksum; 1: pickled .pt

log = logging.getLogger(__name__)


def erm_module(ctx: RunContext, net: nn.Module, mixup_alpha: float = 0.0, epochs: int | None = None) -> ERMModule:
    """The ERM LightningModule with the `pretrain` settings (also used by the baselines): certified
    (models/certified_erm.py) where `pretrain.certified.gamma` > 0, its network initialised by Shi et al.'s rule
    first unless `init: default` or the model starts from pretrained weights."""
    pre = ctx.fit_settings.pretrain
    optim = optimizer_settings(pre, ctx.fit_settings.fused_policy())
    common = {"norm_bound": pre.norm_bound, "projection": pre.projection, "mixup_alpha": mixup_alpha}
    certified = pre.certified
    if not certified.enabled:
        return ERMModule(net, optim, **common)
    if certified.init == "ibp" and not model_file(ctx, "pretrained_file"):
        ibp_initialise(net)
    schedule = phases(pre.epochs if epochs is None else epochs, certified.warmup_epochs, certified.ramp_epochs)
    return CertifiedERMModule(net, optim, radius=certified.gamma / 255, schedule=schedule,
                              robust_weight=certified.robust_weight, regulariser=certified.regulariser,
                              tolerance=certified.tolerance, **common)


def train_erm(ctx: RunContext, net: nn.Module, loader, mixup_alpha: float = 0.0, epochs: int | None = None,
              key: str | None = None, stage: str = "ERM") -> float:
    """Fit `net` by ERM with the pretraining settings (`epochs` defaults to pretrain.epochs) on the loader's
    data, resumable under the checkpoint `key`; returns wall seconds."""
    epochs = ctx.fit_settings.pretrain.epochs if epochs is None else epochs
    return fit(ctx, erm_module(ctx, net, mixup_alpha, epochs), epochs, stage, key=key, train_dataloaders=loader)


# FitSettings fields a pretraining fit does not read, each with why (fit.training.FitSettings.identity)
NOT_IN_PRETRAINING = {"exposed_above": "the gate's threshold: Alg 1's fits count forget images against it (so it is in "
                                       "the method's key); pretraining does not read it"}


def cache_key(ctx: RunContext, datamodule: TTPDataModule) -> str:
    """Everything that determines A(D): training data, model, and every fit setting pretraining reads (the
    trainer's values, pretraining's, the callbacks, seed, speed settings; derived from the typed settings, so a
    setting added later is in the key unless named as not affecting results)."""
    identity = {
        "format": CACHE_FORMAT,
        "data": datamodule.data_fingerprint(),
        "data_info": asdict(datamodule.info),  # includes the normalisation the model applies
        "augment": datamodule.augment,
        "batch_size": datamodule.batch_size,
        # a provider's checkpoint and pretrained weights are named by their content, not their path
        "files_sha256": {key: _checkpoint_sha(model_file(ctx, key))
                         for key in ("checkpoint", "pretrained_file") if model_file(ctx, key)},
        # the trainer (process layout, precision, clipping, accumulation, ...), model, pretrain, callbacks, seed and
        # performance settings: read from the config, never the environment, so every rank computes the same key
        "fit": ctx.fit_settings.identity(leave_out=NOT_IN_PRETRAINING),
        # intra-op threads change the order of floating-point sums, and training amplifies the difference
        "threads": torch.get_num_threads(),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:24]


def model_file(ctx: RunContext, key: str) -> str | None:
    """A file the model config names (`checkpoint`: the provider's trained weights, used as A(D) in place of
    pretraining; `pretrained_file`), with ~ expanded; None when unset."""
    path = ctx.fit_settings.model.get(key) if ctx.fit_settings.model is not None else None
    return str(Path(str(path)).expanduser()) if path else None


def pretrained_model(ctx: RunContext, net: nn.Module, datamodule: TTPDataModule, is_global_zero) -> dict:
    """Load A(D) into `net` from model.checkpoint, or from the cache, or train it and store it. Returns
    {wall_s, cached, cache_file} (and the checkpoint's SHA-256 when one is given). D is the training set
    before any forget instances from outside it are added."""
    checkpoint = model_file(ctx, "checkpoint")
    if checkpoint:
        load_checkpoint(net, checkpoint, str(ctx.fit_settings.model.get("_target_", "")).rsplit(".", 1)[-1])
        log.info("A(D) = model.checkpoint %s (no pretraining)", checkpoint)
        if is_global_zero():
            warn_if_near_chance(net, datamodule, checkpoint, ctx.fit_settings.model.get("checkpoint_test_acc"))
        return {"wall_s": 0.0, "cached": False, "cache_file": None, "checkpoint_sha256": _checkpoint_sha(checkpoint)}
    key = cache_key(ctx, datamodule)
    stage = "pretraining A(D)"
    info = _cached_fit(ctx, net, key, is_global_zero, lambda: train_erm(
        ctx, net, datamodule.training_loader("pretrain"), key=f"{key}_fit", stage=stage))
    if not info["cached"] and stage in ctx.journal.speed:  # this run trained it: its images per second
        info["train_images_per_s"] = ctx.journal.speed[stage]["train_images_per_s"]
    return info


def absorb_outside_forget(ctx: RunContext, net: nn.Module, datamodule: TTPDataModule, is_global_zero) -> dict:
    """Finetune A(D) in `net` by ERM on D plus the forget instances from outside it (data.forget.source
    test or mixed) for pretrain.absorb_epochs, the paper's first step for protecting test instances (App.
    "Ensuring Test-Time Privacy for Test Instances"); the method then starts from this model. Cached like A(D)."""
    epochs = int(ctx.fit_settings.pretrain.absorb_epochs)
    identity = {"start": cache_key(ctx, datamodule), "forget": datamodule.forget_fingerprint(), "epochs": epochs}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]
    stage = "absorbing the outside forget instances"
    info = _cached_fit(ctx, net, f"{key}_absorbed", is_global_zero, lambda: train_erm(
        ctx, net, datamodule.training_loader("train"), epochs=epochs, key=f"{key}_absorbed_fit", stage=stage),
        stage=stage)
    return {"absorb_epochs": epochs, "absorb_wall_s": info["wall_s"], "absorb_cached": info["cached"]}


def retrained_model(ctx: RunContext, net: nn.Module, datamodule: TTPDataModule, is_global_zero) -> dict:
    """A(D_r) in `net`: a fresh model trained on the retain set with the pretraining settings (method=retrain's
    model; the relearning attack's floor), cached like A(D) under a key of A(D)'s key and the forget set."""
    identity = {"start": cache_key(ctx, datamodule), "forget": datamodule.forget_fingerprint(), "retrain": True}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]
    stage = "retraining A(D_r) (the relearning floor)"
    return _cached_fit(ctx, net, f"{key}_retrained", is_global_zero, lambda: train_erm(
        ctx, net, datamodule.training_loader("retain"), key=f"{key}_retrained_fit", stage=stage), stage=stage)


def warn_if_near_chance(net: nn.Module, datamodule: TTPDataModule, checkpoint: str, stated: float | None = None
                        ) -> None:
    """A provider's checkpoint that loads but classifies the test set (or, without one, the training set) near
    chance, or more than STATED_GAP below the test accuracy its provider states (`model.checkpoint_test_acc`), was
    most likely trained on other inputs: one warning line naming the two usual causes."""
    measured = evaluate(net, datamodule)
    on_test = len(datamodule.test_labels) > 0
    accuracy = measured["test_acc"] if on_test else measured["retain_acc"]
    chance = 1.0 / datamodule.info.num_classes
    below = stated is not None and on_test and accuracy < float(stated) - STATED_GAP
    if accuracy <= NEAR_CHANCE * chance or below:
        how = (f"stated {float(stated):.1%}, model.checkpoint_test_acc: far below it" if below else
               f"chance {100 * chance:.0f} %: near chance")
        log.warning("model.checkpoint %s classifies %s of the %s images correctly (%s); check the input "
                    "normalisation (data.normalize, data.mean, data.std) and the class order (class folders sorted by "
                    "name: %s)", checkpoint, f"{accuracy:.1%}", "test" if on_test else "training", how,
                    ", ".join(datamodule.info.names()[:10]))


STATED_GAP = 0.05  # five accuracy points below the provider's own measurement
NEAR_CHANCE = 2.0  # at most twice chance accuracy


def _cached_fit(ctx: RunContext, net: nn.Module, key: str, is_global_zero, fit, stage: str = "pretraining A(D)") -> dict:
    """Load `net` from the cache entry `key`, or run `fit()` (which trains `net`, returns seconds) and store it.

    An entry is `<key>.safetensors` (the weights, never pickled) and `<key>.json` (its SHA-256 and the
    training time), written in that order through temporary files, so the record marks a complete entry, each
    with its keyed MAC (core/proofs.py). An entry without valid MACs, unreadable, or whose checksum does not match
    is reported in one warning naming the file, deleted and trained again. Single-process runs hold a file lock on the key from the check to the store,
    so two jobs started together on an empty cache (a sweep's parallel jobs, a shared filesystem) train
    once: the second waits and loads. Multi-process (DDP) runs train in every rank together and cannot
    wait on each other's lock; they only lock the store."""
    directory = Path(ctx.fit_settings.cache_dir).expanduser() / "pretrain"
    weights = directory / f"{key}.safetensors"
    if not ctx.fit_settings.pretrain.use_cache:
        return {"wall_s": round(fit(), 3), "cached": False, "cache_file": None}
    directory.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(directory / f"{key}.lock"))
    with lock if _single_process(ctx) else nullcontext():
        wall = _load_entry(net, weights)
        if wall is not None:
            log.info("%s: from the cache (%s)", stage, weights)
            return {"wall_s": wall, "cached": True, "cache_file": str(weights)}
        wall = fit()
        if is_global_zero():
            with lock:
                _store_entry(net, wall, weights)
            remove_checkpoints([checkpoint_folder(ctx, f"{key}_fit", register=False)])  # the entry supersedes them
    return {"wall_s": round(wall, 3), "cached": False, "cache_file": str(weights)}


def _single_process(ctx: RunContext) -> bool:
    trainer = ctx.fit_settings.trainer
    devices = trainer.get("devices", 1)
    return "ddp" not in str(trainer.get("strategy", "auto")) and devices in (1, "1", "auto", None) \
        and int(trainer.get("num_nodes", 1) or 1) == 1


def _record(weights: Path) -> Path:
    return weights.with_suffix(".json")


@functools.lru_cache(maxsize=8)
def _checkpoint_sha_cached(path: str, size: int, mtime: float) -> str:
    return sha256_of(Path(path))


def _checkpoint_sha(path: str) -> str:
    stat = Path(path).stat()
    return _checkpoint_sha_cached(path, stat.st_size, stat.st_mtime)


def _load_entry(net: nn.Module, weights: Path) -> float | None:
    """The entry's training seconds after loading it into `net`; None when there is no usable entry."""
    if not weights.exists() and not _record(weights).exists():
        return None
    try:  # read once: what is checked is what is used
        data, text = weights.read_bytes(), _record(weights).read_bytes()
    except OSError:
        data, text = None, None
    if data is None or not (proofs.verified(weights, data) and proofs.verified(_record(weights), text)):
        proofs.discard(weights, "pretraining cache entry", extra=(_record(weights), proofs.sidecar(_record(weights))))
        return None
    try:
        record = json.loads(text)
        if hashlib.sha256(data).hexdigest() != record["sha256"]:
            raise ValueError("its SHA-256 does not match the one recorded when it was written")
        net.load_state_dict(load_tensors(data))
        return float(record["wall_s"])
    except Exception as exc:  # noqa: BLE001 -- any unreadable or corrupt entry is discarded and rebuilt
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        log.warning("cache entry %s is unreadable or corrupt (%s); discarding it and training again", weights, reason)
        for path in (weights, _record(weights)):
            path.unlink(missing_ok=True)
        return None


def _store_entry(net: nn.Module, wall: float, weights: Path) -> None:
    atomic_tensors(weights, net.state_dict())
    proofs.sign(weights)
    atomic_text(_record(weights), json.dumps({"sha256": sha256_of(weights), "wall_s": wall, "format": CACHE_FORMAT}))
    proofs.sign(_record(weights))
