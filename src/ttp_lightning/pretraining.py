"""A(D): ERM pretraining on the whole training set, cached on disk so sweeps pretrain once."""

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch import nn

from ttp_lightning.data.datamodule import TTPDataModule
from ttp_lightning.modules.erm import ERMModule
from ttp_lightning.training import RunContext, make_trainer, timed_fit

CACHE_FORMAT = 1


def erm_module(ctx: RunContext, net: nn.Module, mixup_alpha: float = 0.0) -> ERMModule:
    """The ERM LightningModule with the `pretrain` settings (also used by the baselines)."""
    pre = ctx.cfg.pretrain
    optim = {k: pre[k] for k in ("optimizer", "lr", "weight_decay", "momentum", "schedule")}
    return ERMModule(net, optim, norm_bound=pre.norm_bound, projection=pre.projection, mixup_alpha=mixup_alpha)


def train_erm(ctx: RunContext, net: nn.Module, loader, mixup_alpha: float = 0.0, epochs: int | None = None) -> float:
    """Fit `net` by ERM with the pretraining settings (`epochs` defaults to pretrain.epochs) on the loader's
    data; returns wall seconds."""
    trainer = make_trainer(ctx, ctx.cfg.pretrain.epochs if epochs is None else epochs)
    return timed_fit(trainer, erm_module(ctx, net, mixup_alpha), train_dataloaders=loader)


def cache_key(ctx: RunContext, datamodule: TTPDataModule) -> str:
    """Everything that determines A(D): training data, model, pretraining settings, seed."""
    identity = {
        "format": CACHE_FORMAT,
        "data": datamodule.data_fingerprint(),
        "data_info": asdict(datamodule.info),  # includes the normalisation the model applies
        "augment": datamodule.augment,
        "batch_size": datamodule.batch_size,
        "model": OmegaConf.to_container(ctx.cfg.model, resolve=True),
        "pretrain": OmegaConf.to_container(ctx.cfg.pretrain, resolve=True),
        "seed": ctx.cfg.seed,
        # the process layout changes batching (each DDP rank takes its own batch), so it is part of the key;
        # read from the config, never the environment, so every rank computes the same key
        "processes": {k: ctx.cfg.trainer.get(k) for k in ("accelerator", "devices", "num_nodes", "strategy")},
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def pretrained_model(ctx: RunContext, net: nn.Module, datamodule: TTPDataModule, is_global_zero) -> dict:
    """Load A(D) into `net` from the cache, or train it and store it. Returns {wall_s, cached, cache_file}.
    D is the training set before any forget instances from outside it are added."""
    return _cached_fit(ctx, net, cache_key(ctx, datamodule), is_global_zero,
                       lambda: train_erm(ctx, net, datamodule.training_loader("pretrain")))


def absorb_outside_forget(ctx: RunContext, net: nn.Module, datamodule: TTPDataModule, is_global_zero) -> dict:
    """Finetune A(D) in `net` by ERM on D plus the forget instances from outside it (data.forget.source
    test or mixed) for pretrain.absorb_epochs, the paper's first step for protecting test instances (App.
    "Ensuring Test-Time Privacy for Test Instances"); the method then starts from this model. Cached like A(D)."""
    epochs = int(ctx.cfg.pretrain.absorb_epochs)
    identity = {"start": cache_key(ctx, datamodule), "forget": datamodule.forget_fingerprint(), "epochs": epochs}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]
    info = _cached_fit(ctx, net, f"{key}_absorbed", is_global_zero,
                       lambda: train_erm(ctx, net, datamodule.training_loader("train"), epochs=epochs))
    return {"absorb_epochs": epochs, "absorb_wall_s": info["wall_s"], "absorb_cached": info["cached"]}


def _cached_fit(ctx: RunContext, net: nn.Module, key: str, is_global_zero, fit) -> dict:
    """Load `net` from the cache entry `key`, or run `fit()` (which trains `net`, returns seconds) and store it."""
    path = Path(ctx.cfg.paths.cache_dir).expanduser() / "pretrain" / f"{key}.pt"
    if ctx.cfg.pretrain.use_cache and path.is_file():
        entry = torch.load(path, map_location="cpu", weights_only=True)
        net.load_state_dict(entry["state_dict"])
        return {"wall_s": float(entry["wall_s"]), "cached": True, "cache_file": str(path)}
    wall = fit()
    if ctx.cfg.pretrain.use_cache and is_global_zero():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save({"state_dict": net.state_dict(), "wall_s": wall}, tmp)
        os.replace(tmp, path)
    return {"wall_s": round(wall, 3), "cached": False, "cache_file": str(path)}
