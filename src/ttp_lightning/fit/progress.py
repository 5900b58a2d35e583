"""Console output a person can read: each fit is a labelled phase ("pretraining A(D)", "Alg 1 finetuning")
with `epoch N/total` and an estimate of the phase's time left. On a terminal that is one progress bar per
phase (no validation bars); when stdout is a file or a pipe (`make run > log.txt`, a cluster job) it is one
line per phase, when it ends. Lightning's tips, device lines and "fit stopped" lines, printed for every Trainer,
are silenced; so are two warnings every fit of a small data set would repeat."""

import logging
import sys
import time
import warnings

from lightning.pytorch.callbacks import Callback, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm, convert_inf

from ttp_lightning.core.console import Pace, wrapped

REPEATED_WARNINGS = (
    r"(?s).*isinstance\(treespec, LeafSpec\)",             # Lightning's own use of a deprecated torch API
    r"(?s).*is smaller than the logging interval",          # small data sets: fewer batches than 50 per epoch
    r"(?s).*does not have many workers",                    # in-memory tensors need no loader workers
    r"(?s).*Checkpoint directory .* exists and is not empty",  # the project's own keyed folders, resumed on purpose
)


def quiet_lightning() -> None:
    """Lightning's INFO lines (tips, "GPU available", "`Trainer.fit` stopped") and the warnings each fit
    repeats; Lightning's warnings about anything else still print, and so does the one line a DDP start
    prints ("Starting with N processes", from lightning.fabric)."""
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")  # every rank_zero_info goes here
    rank_zero.setLevel(logging.INFO)
    if not any(isinstance(f, _KeepDistributedStart) for f in rank_zero.filters):
        rank_zero.addFilter(_KeepDistributedStart())
    for pattern in REPEATED_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)


class _KeepDistributedStart(logging.Filter):
    """Of Lightning's INFO lines, only DDP's "All distributed processes registered. Starting with N
    processes" (once per run, and the proof that the ranks started)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or "Starting with" in record.getMessage()


def _eta(started: float, done: int, total: int) -> str:
    """`, ~N s left` from the mean epoch time so far (at most: early stopping may end a phase sooner)."""
    if done <= 0 or done >= total:
        return ""
    left = (time.perf_counter() - started) / done * (total - done)
    return f", ~{left:.0f} s left" if left >= 1 else ", <1 s left"


SHOWN = (("loss", "train/loss"), ("loss", "train/pareto_loss"), ("retain acc", "val/retain_acc"),
         ("test acc", "val/test_acc"), ("forget CD", "val/forget_conf_dist"))
EVERY_S = 60.0  # without a terminal, a line at least this often while a phase runs


def _metrics(trainer) -> str:
    values = trainer.callback_metrics
    shown = [(name, key) for name, key in SHOWN if key in values]
    return "  ".join(f"{name} {float(values[key]):.4f}" for name, key in shown)


def _loss(trainer) -> dict:
    values = trainer.callback_metrics
    key = next((key for name, key in SHOWN if name == "loss" and key in values), None)
    return {} if key is None else {"loss": f"{float(values[key]):.4f}"}


def _ended(phase: str, trainer, first: int, started: float) -> str:
    """`<phase>: N epochs in T s`, and `(stopped at epoch N of M)` where it ended before max_epochs."""
    epochs = trainer.current_epoch - first
    early = f" (stopped at epoch {trainer.current_epoch} of {trainer.max_epochs})" \
        if trainer.current_epoch < (trainer.max_epochs or 0) else ""
    return f"{phase}: {epochs} epoch{'s' if epochs != 1 else ''} in {time.perf_counter() - started:.1f} s{early}"


class PhaseBar(TQDMProgressBar):
    """One bar per phase, described `<phase>: epoch N/total` with the phase's time left; no validation or
    sanity-check bars (the per-dataloader bars Lightning draws for every validation)."""

    def __init__(self, phase: str, refresh_rate: int = 20):
        super().__init__(refresh_rate=refresh_rate)
        self.phase = phase
        self._started = time.perf_counter()

    def init_validation_tqdm(self):
        return Tqdm(disable=True)  # created disabled: a bar disabled afterwards has already printed its line

    def init_sanity_tqdm(self):
        return Tqdm(disable=True)

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        self._started, self._first = time.perf_counter(), trainer.current_epoch

    @property
    def train_description(self) -> str:
        return self.phase

    def on_train_epoch_start(self, trainer, *_) -> None:
        # Lightning's own hook, with the phase's description in place of its "Epoch N" (which would draw first)
        if self._leave:
            self.train_progress_bar = self.init_train_tqdm()
        self.train_progress_bar.reset()
        self.train_progress_bar.total = convert_inf(self.total_train_batches)
        self.train_progress_bar.initial = 0
        done = trainer.current_epoch - self._first
        self.train_progress_bar.set_description(
            f"{self.phase}: epoch {trainer.current_epoch + 1}/{trainer.max_epochs}"
            f"{_eta(self._started, done, trainer.max_epochs - self._first)}")

    def get_metrics(self, trainer, pl_module) -> dict:
        """The bar's postfix: one number, the forget CD where the phase has one, else the loss (Lightning's
        would show every logged key, cut off at a 100-column terminal's edge; the phase's end line has them)."""
        values = trainer.callback_metrics
        if "val/forget_conf_dist" in values:
            return {"forget CD": f"{float(values['val/forget_conf_dist']):.4f}"}
        return _loss(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        """The bar's last state says where the phase ended (early stopping may end it before max_epochs)."""
        if self.train_progress_bar is not None and not self.train_progress_bar.disable:
            self.train_progress_bar.set_description(_ended(self.phase, trainer, self._first, self._started))
            self.train_progress_bar.refresh()
        super().on_train_end(trainer, pl_module)


class StageLine(Callback):
    """Without a terminal: a line when the phase ends, `<phase>: N epochs in T s  <metrics>`, and while it runs
    one at least every `every` seconds, `<phase>: epoch N/total, T s, ~L s left  <metrics>` (a log file or a
    cluster job's output shows the run is alive and how far it is; each epoch's metrics are in results.json's
    history and the logger)."""

    def __init__(self, phase: str, stream=None, every: float = EVERY_S):
        self.phase, self.stream, self.every = phase, stream, every

    def on_train_start(self, trainer, pl_module) -> None:
        self._pace = Pace(self.every, done=trainer.current_epoch)
        self._first = trainer.current_epoch

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        epoch = trainer.current_epoch + 1
        if trainer.global_rank != 0 or (due := self._pace.due(epoch, trainer.max_epochs or 0)) is None:
            return
        elapsed, left = due
        self._print(f"{self.phase}: epoch {epoch}/{trainer.max_epochs}, {elapsed:.0f} s"
                    f"{f', ~{left:.0f} s left' if left >= 1 else ''}  {_metrics(trainer)}")

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.global_rank == 0:
            ended = _ended(self.phase, trainer, self._first, self._pace.started)
            self._print(f"{ended.partition(' (stopped')[0]}  {_metrics(trainer)}")

    def _print(self, line: str) -> None:
        print(wrapped(line.rstrip()), file=self.stream or sys.stdout, flush=True)


def progress_callbacks(phase: str, refresh_rate: int, enabled: bool) -> list:
    """The phase's progress display: a bar on a terminal, one line at its end otherwise, nothing if disabled."""
    if not enabled:
        return []
    return [PhaseBar(phase, refresh_rate)] if sys.stdout.isatty() else [StageLine(phase)]
