"""Resumable fits. Every fit of a run (pretraining A(D), absorbing outside forget instances, Alg 1, the
certified warm-up, the baselines' ERM) writes a Lightning checkpoint at the end of every
`checkpoint_every_n_epochs`-th epoch into `paths.cache_dir/checkpoints/<key>/`, where the key hashes
everything that determines the fit (Hydra's run folders are timestamped, so they cannot be the key).
Rerunning the same command finds the newest checkpoint and resumes from it; `resume=false` deletes it and
starts afresh. A run that writes its results deletes its checkpoints.

On a SLURM cluster Lightning's requeue handler saves `hpc_ckpt_N.ckpt` into the same folder (it is the
Trainer's `default_root_dir`) before it requeues the job; the requeued job resumes from whichever of the
two checkpoints is newer.

Checkpoints hold the weights, optimizer and scheduler states, the loop counters, the callbacks' states
(early-stopping record, history) and the global random generators' states, so that a resumed run takes the
same steps as one that was never stopped. They are written by SignedCheckpointIO: into a temporary file
beside the target, renamed over it (atomic on every file system: never a copy across file systems) and
given a keyed MAC (core/proofs.py); they are read with `weights_only=True`, from the same bytes whose MAC was
checked. One without a valid MAC (edited, swapped, or written without this user's key) or that cannot be
read is reported in one warning line, deleted and the fit starts afresh."""

import io
import logging
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_only

from ttp_lightning.core import proofs
from ttp_lightning.core.files import atomic_write
from ttp_lightning.fit import interrupts

log = logging.getLogger(__name__)

LAST = "last.ckpt"
HPC_PATTERN = "hpc_ckpt_*.ckpt"


@dataclass(frozen=True)
class Found:
    """A checkpoint a fit resumes from, and how many epochs it had finished."""

    path: str
    epochs_done: int


class RandomState(Callback):
    """Puts the global torch / numpy / random (and CUDA) generator states into every checkpoint and back
    on resume: Alg 1's robust inner attack, mixup and dropout draw from them. A resumed fit sets them when its
    training starts (on_train_start), not when the checkpoint is read: whatever runs in between (a sanity check's
    loaders, the fit-start hooks) then draws as it likes, and the first resumed epoch starts from exactly the
    state the stopped run's next epoch started from. (The other streams need no state: data order and
    augmentation are seeded per epoch, the validation attack by a fixed seed.)"""

    def __init__(self):
        self._restore: dict | None = None

    def state_dict(self) -> dict:
        kind, keys, position, has_gauss, cached = np.random.get_state()
        version, state, gauss_next = random.getstate()
        states = {"torch": torch.get_rng_state(), "numpy": [kind, torch.from_numpy(keys.astype(np.int64)),
                                                             position, has_gauss, cached],
                  "python": [version, list(state), gauss_next]}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            states["cuda"] = torch.cuda.get_rng_state_all()
        return states

    def load_state_dict(self, state_dict: dict) -> None:
        self._restore = state_dict

    def on_train_start(self, trainer, pl_module) -> None:
        if self._restore is not None:
            self.apply(self._restore)
            self._restore = None

    @staticmethod
    def apply(state_dict: dict) -> None:
        """Set the global generators to a saved state."""
        torch.set_rng_state(state_dict["torch"])
        kind, keys, position, has_gauss, cached = state_dict["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))
        version, state, gauss_next = state_dict["python"]
        random.setstate((version, tuple(state), gauss_next))
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        interrupts.note_checkpoint(int(checkpoint.get("epoch", trainer.current_epoch)) + 1,
                                   str(trainer.default_root_dir))


class WallClock(Callback):
    """A fit's wall time across resumes: every checkpoint carries the seconds spent up to it, and a resumed fit
    counts on from them (the time a stopped run spent after its last checkpoint is lost with its epochs)."""

    def __init__(self):
        self.before, self._start = 0.0, time.perf_counter()

    def start(self) -> None:
        """The fit starts (or resumes) now."""
        self._start = time.perf_counter()

    def seconds(self) -> float:
        """Seconds of this fit so far, earlier runs of it included."""
        return self.before + time.perf_counter() - self._start

    def state_dict(self) -> dict:
        return {"seconds": self.seconds()}

    def load_state_dict(self, state_dict: dict) -> None:
        self.before = float(state_dict.get("seconds", 0.0))


def epoch_checkpoint(directory: Path, every_n_epochs: int) -> ModelCheckpoint:
    """Lightning's ModelCheckpoint keeping only `last.ckpt`, written at the end of every N-th training epoch
    (after that epoch's validation, so the early-stopping record in it is up to date)."""
    return ModelCheckpoint(dirpath=str(directory), filename=Path(LAST).stem, monitor=None, save_top_k=1,
                           every_n_epochs=every_n_epochs, save_on_train_epoch_end=True,
                           enable_version_counter=False)


class SignedCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint files, written atomically beside their target with a keyed MAC, and loaded only
    from bytes that carry one (every checkpoint Lightning writes: the epoch ones and SLURM's requeue ones)."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        data, path = buffer.getvalue(), Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda tmp: tmp.write_bytes(data))
        proofs.sign(path, data)

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        path = Path(path)
        data = path.read_bytes()
        if not proofs.verified(path, data):  # resume_from checked it; it changed since
            raise RuntimeError(f"checkpoint {path} carries no valid proof; rerun to start this fit afresh")
        return torch.load(io.BytesIO(data), map_location=map_location or "cpu", weights_only=True)

    def remove_checkpoint(self, path) -> None:
        super().remove_checkpoint(path)
        proofs.sidecar(Path(path)).unlink(missing_ok=True)


def _readable(path: Path) -> tuple[int, int] | None:
    """(global step, epoch) of a checkpoint; None (after a warning naming it, and deleting it) when it
    carries no valid proof or cannot be read."""
    if not proofs.verified(path):
        proofs.discard(path, "checkpoint")
        return None
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return int(checkpoint["global_step"]), int(checkpoint["epoch"])
    except Exception as exc:  # noqa: BLE001 -- any unreadable checkpoint is discarded; the fit starts afresh
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        log.warning("checkpoint %s is unreadable or corrupt (%s); discarding it", path, reason)
        path.unlink(missing_ok=True)
        return None


def resume_from(directory: Path, resume: bool, stage: str) -> Found | None:
    """The newest readable checkpoint in `directory` (last.ckpt or a SLURM hpc_ckpt), or None to start
    afresh; with `resume=False` the folder's checkpoints are deleted first."""
    candidates = [directory / LAST, *sorted(directory.glob(HPC_PATTERN))]
    if not resume:
        for path in candidates:
            path.unlink(missing_ok=True)
            proofs.sidecar(path).unlink(missing_ok=True)
        return None
    newest, newest_step = None, -1
    for path in candidates:
        if not path.exists():
            continue
        found = _readable(path)
        if found is not None and found[0] > newest_step:
            newest, newest_step = (path, found[1]), found[0]
    if newest is None:
        return None
    path, epoch = newest
    if rank_zero_only.rank == 0:  # every DDP rank resumes; one says so
        log.info("resuming %s from %s (saved after epoch %d)", stage, path, epoch + 1)
    interrupts.note_checkpoint(epoch + 1, str(directory))
    return Found(str(path), epoch + 1)


def remove(directories) -> None:
    """Delete the checkpoint folders of a run that has written its results."""
    for directory in directories:
        shutil.rmtree(directory, ignore_errors=True)
