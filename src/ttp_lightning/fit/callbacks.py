"""Generic callbacks every fit can use: per-epoch history and training-step timing (built by Hydra from the
`callbacks` config group), the divergence guard and the speed settings every fit gets, and a user's own
callbacks. Alg 1's own (constrained early stopping, warm-up, back-off, the radius rule): alg1/callbacks.py."""

import logging
import time

import torch
from lightning.pytorch.callbacks import Callback

from ttp_lightning.config.build import Part
from ttp_lightning.core.batching import ImageBatchDataset
from ttp_lightning.core.errors import TTPUserError

log = logging.getLogger(__name__)


class EpochHistory(Callback):
    """Records every validation epoch's val/* metrics with the wall time since fit start."""

    def __init__(self):
        self.rows: list[dict] = []
        self._start = time.perf_counter()

    def state_dict(self) -> dict:
        return {"rows": self.rows}

    def load_state_dict(self, state_dict: dict) -> None:
        """Resumed: the rows so far; elapsed time continues from the last one."""
        self.rows = list(state_dict["rows"])

    def on_fit_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()

    def on_train_start(self, trainer, pl_module) -> None:  # after a checkpoint's states are restored
        self._start = time.perf_counter() - (self.rows[-1]["elapsed_s"] if self.rows else 0.0)

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        row = {"epoch": trainer.current_epoch + 1, "elapsed_s": round(time.perf_counter() - self._start, 3)}
        for key, value in trainer.callback_metrics.items():
            if key.startswith("val/"):
                row[key[4:]] = float(value)
        self.rows.append(row)


class StepTimer(Callback):
    """Wall time of the training part of every epoch (its steps and the loading between them, not the
    evaluation after it), with the steps and images it took: a steps- and images-per-second figure free of
    monitoring. On a GPU it waits for the device at the two ends of an epoch only, so the host still queues
    steps ahead of the device (a wait after every step would cost small models their speed)."""

    def __init__(self):
        self.seconds, self.steps, self.images = 0.0, 0, 0
        self._t0: float | None = None

    def state_dict(self) -> dict:
        return {"seconds": self.seconds, "steps": self.steps, "images": self.images}

    def load_state_dict(self, state_dict: dict) -> None:
        self.seconds, self.steps = float(state_dict["seconds"]), int(state_dict["steps"])
        self.images = int(state_dict.get("images", 0))

    def summary(self) -> dict:
        """{train_steps, train_images, train_s, train_steps_per_s, train_images_per_s} (None without time)."""
        rate = (lambda count: round(count / self.seconds, 3) if self.seconds and count else None)
        return {"train_steps": self.steps, "train_images": self.images, "train_s": round(self.seconds, 3),
                "train_steps_per_s": rate(self.steps), "train_images_per_s": rate(self.images)}

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        _wait_for(pl_module.device)
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps += 1
        self.images += _rows(batch)

    def on_validation_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._stop(pl_module.device)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._stop(pl_module.device)

    def _stop(self, device) -> None:
        if self._t0 is not None:
            _wait_for(device)
            self.seconds += time.perf_counter() - self._t0
            self._t0 = None


def _wait_for(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rows(batch) -> int:
    """Images in a training batch: (images, labels), or a dict / list of such batches (Alg 1's retain and
    forget batches)."""
    if isinstance(batch, torch.Tensor):
        return len(batch)
    if isinstance(batch, dict):
        return sum(_rows(part) for part in batch.values())
    if isinstance(batch, (list, tuple)) and batch:
        if isinstance(batch[0], torch.Tensor):
            return len(batch[0])
        return sum(_rows(part) for part in batch)
    return 0


class FiniteGuard(Callback):
    """Stops a diverging fit with one error line naming the stage, the epoch and the setting to change:
    a non-finite training loss or non-finite weights (checked every epoch, which also covers
    manual-optimisation steps that return no loss). Nothing is evaluated, written or released.

    On the CPU the loss is checked every step. On an accelerator reading it would make the host wait for
    the device after every step, so it could not queue the next steps while the device works; each step
    only folds "was it finite" into a flag on the device, read every `every` steps and at the
    epoch's end: a diverged fit stops at most that many steps later, with the first bad loss."""

    def __init__(self, stage: str, settings: str, lr: float, every: int | None = None):
        self.stage, self.settings, self.lr = stage, settings, lr
        self.every = every  # steps between reads; None: every step on the CPU, every 50 on an accelerator
        self._bad: torch.Tensor | None = None  # on the device: a non-finite loss was seen since the last read
        self._first: torch.Tensor | None = None  # the first such loss
        self._pending = 0

    def _fail(self, trainer, what: str) -> None:
        raise TTPUserError(f"{self.stage} diverged at epoch {trainer.current_epoch + 1}: {what}; nothing was "
                           f"released. Lower {self.settings}.lr (now {self.lr:g})")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if not isinstance(loss, torch.Tensor):
            return
        loss = loss.detach().float().mean()
        bad = ~torch.isfinite(loss)
        if self._bad is None:
            self._bad, self._first = bad, loss
        else:
            self._first = torch.where(self._bad, self._first, loss)
            self._bad = self._bad | bad
        self._pending += 1
        every = self.every or (1 if loss.device.type == "cpu" else 50)
        if self._pending >= every:
            self._read(trainer)

    def _read(self, trainer) -> None:
        bad, first = self._bad, self._first
        self._bad, self._first, self._pending = None, None, 0
        if bad is not None and bool(bad):
            self._fail(trainer, f"the training loss is {float(first)}")

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._read(trainer)
        for name, param in pl_module.named_parameters():
            if not bool(torch.isfinite(param.detach()).all()):
                self._fail(trainer, f"weight {name} is not finite")


METHOD_CALLBACKS = ("best_model", "history", "timer")  # conf/callbacks entries Alg 1 reads back


def extra_callbacks(callbacks: dict[str, Part | None] | None) -> list:
    """The other entries of the `callbacks` group (a user's own Lightning callbacks), fresh for every fit."""
    return [entry.build() for name, entry in (callbacks or {}).items()
            if name not in METHOD_CALLBACKS and entry is not None]


class Performance(Callback):
    """performance.channels_last, performance.compile and performance.data_on_device for one fit, applied
    once the network is on its device: `channels_last` (auto: on a GPU, for networks with convolutions)
    converts the network's weights to the channels_last memory format, which convolutions then also give
    their outputs; `compile` compiles the network in place (nn.Module.compile: the state_dict keeps its
    names); `data_on_device` (auto: on a GPU, when the fit's images take under a quarter of its free
    memory) moves the in-memory data sets behind the fit's loaders to the network's device once, so batches
    are gathered there instead of copied from host memory every step."""

    DEVICE_SHARE = 0.25

    def __init__(self, channels_last: str = "auto", compile: str = "false", data_on_device: str = "auto"):
        self.channels_last, self.compile = str(channels_last).lower(), str(compile).lower() == "true"
        self.data_on_device = str(data_on_device).lower()
        self._held: list = []

    def on_fit_start(self, trainer, pl_module) -> None:
        from torch import nn

        net = getattr(pl_module, "net", pl_module)
        convolutional = any(isinstance(m, nn.Conv2d) for m in net.modules())
        on_gpu = pl_module.device.type == "cuda"
        if convolutional and (self.channels_last == "true" or (self.channels_last == "auto" and on_gpu)):
            net.to(memory_format=torch.channels_last)
        if self.compile and not getattr(net, "_compiled_call_impl", None):
            net.compile()

    def on_train_start(self, trainer, pl_module) -> None:
        self._hold(trainer.train_dataloader, pl_module.device)

    def on_validation_start(self, trainer, pl_module) -> None:
        self._hold(trainer.val_dataloaders, pl_module.device)

    def on_fit_end(self, trainer, pl_module) -> None:
        self.release()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.release()

    def _hold(self, loaders, device) -> None:
        if self.data_on_device == "false" or (self.data_on_device == "auto" and device.type != "cuda"):
            return
        datasets = [d for d in in_memory_datasets(loaders) if d.images.device != device]
        if not datasets:
            return
        if self.data_on_device == "auto":
            needed = sum(d.images.nbytes + d.labels.nbytes for d in datasets)
            if needed > self.DEVICE_SHARE * torch.cuda.mem_get_info(device)[0]:
                return
        for dataset in datasets:
            self._held.append((dataset, dataset.images, dataset.labels))
            dataset.images, dataset.labels = dataset.images.to(device), dataset.labels.to(device)

    def release(self) -> None:
        """The held data sets get their own host tensors back (no copy), so what runs after the fit
        (evaluations, attacks, fingerprints, the release) sees what it always sees."""
        for dataset, images, labels in self._held:
            dataset.images, dataset.labels = images, labels
        self._held = []


def in_memory_datasets(loaders) -> list:
    """The ImageBatchDatasets behind a loader, a CombinedLoader, or a list / dict of them."""
    found, stack = [], [loaders]
    while stack:
        item = stack.pop()
        if item is None:
            continue
        if hasattr(item, "flattened"):  # Lightning's CombinedLoader
            stack.extend(item.flattened)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(getattr(item, "dataset", None), ImageBatchDataset) and not item.num_workers and \
                all(item.dataset is not seen for seen in found):  # workers cannot gather from GPU tensors
            found.append(item.dataset)
    return found
