"""Algs 2-4 as a LightningModule (manual optimisation): one training step is one Newton step, one per forget
request (Alg 4) or a single one (Algs 2-3), from the previous step's projected weights.

Under DDP every rank takes every step, but the full-data gradient, the Hessian-vector products (Lanczos,
the residual, the exact Hessian's chunks) run on each rank's own shard and are all-reduced, and the
estimator's b chains are split across the ranks (rank r advances chains r, r + world, ...; all ranks draw
the same random stream, so each chain sees the samples it would see in one process). Every rank ends with
the same noise-free weights. The secret noise seed is drawn once, on rank 0, and broadcast, so every rank
holds the same release. The step runs in float64 (Alg 2) or float32 (Algs 3-4) with autocast off,
whatever `trainer.precision` the other stages train in.
"""

import contextlib
import warnings

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader

from ttp_lightning.certified.maths.newton import (
    NewtonPath,
    curvature,
    newton_step,
    resolve_lam,
    step_dtype,
    step_generator,
)
from ttp_lightning.certified.maths.residual_step import residual_step
from ttp_lightning.core.batching import ImageBatchDataset
from ttp_lightning.dp.noise import fresh_seed


class CertifiedStepModule(L.LightningModule):
    """The Newton step(s) of a certified learner; with `settings.bound=residual` each step solves the head to
    stationarity instead (residual_step.py, the same on every rank); otherwise `kind` is newton.EXACT (Cholesky on the explicit Hessian,
    Alg 2) or newton.ESTIMATED (the stochastic inverse-Hessian estimator, Algs 3-4). After the fit, `path`
    holds the noise-free weights and the certificate record of every step, `noise_seed` the release's
    secret seed and `instances` the images this process ran through the curvature (its share of the work)."""

    def __init__(self, net: nn.Module, parts: list[tuple[ImageBatchDataset, ImageBatchDataset]], settings,
                 kind: str, norm_bound: float, projection: str):
        super().__init__()
        self.net, self.parts, self.settings, self.kind = net, parts, settings, kind
        self.norm_bound, self.projection = norm_bound, projection
        self.automatic_optimization = False
        self.path = NewtonPath()
        self.noise_seed: str | None = None
        self.instances = 0
        self.world_size = 1  # the processes that shared the work (the trainer's, once fitting)
        self._generator: torch.Generator | None = None

    def train_dataloader(self) -> DataLoader:
        return DataLoader(range(len(self.parts)), batch_size=None)  # request indices; every rank takes every step

    def configure_optimizers(self):
        return None  # the step writes the weights itself

    def on_fit_start(self) -> None:
        self._generator = step_generator(self.settings, self.kind)
        self.world_size = self.trainer.world_size

    def training_step(self, request, batch_idx) -> None:
        retain, forget = self.parts[int(request)]
        if self.settings.bound == "residual":
            weights, record = residual_step(self.net, self.settings, resolve_lam(self.settings), retain, forget,
                                            self.norm_bound)
            self.path.noise_free.append(weights)
            self.path.steps.append(record)
            self.path.extras.append({})
            self.instances += len(retain) + len(forget)
            self.log_dict({"certified/stationarity": record["stationarity"],
                           "certified/distance_bound": record["distance_bound"]},
                          on_step=True, on_epoch=False, sync_dist=False, batch_size=1)
            return
        with torch.autocast(self.device.type, enabled=False):
            curv = curvature(self.net, self.settings, retain, forget, dtype=step_dtype(self.kind), sharded=True)
            newton_step(curv, self.settings, self.kind, self._generator, self.norm_bound, self.projection, self.path)
        self.instances += curv.instances
        record = self.path.steps[-1]
        self.log_dict({"certified/newton_residual": record["residual"], "certified/step_norm": record["step_norm"]},
                      on_step=True, on_epoch=False, sync_dist=False, batch_size=1)

    def on_train_end(self) -> None:
        self.noise_seed = self.trainer.strategy.broadcast(fresh_seed() if self.trainer.is_global_zero else None, 0)


@contextlib.contextmanager
def quiet_no_optimizer():
    """The certified step has no optimizer on purpose; Lightning's warning about it says nothing to a user
    (silenced for this fit only)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*configure_optimizers.*returned `None`.*")
        yield
