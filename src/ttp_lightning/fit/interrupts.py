"""Who handles a SIGTERM. Inside a Lightning fit, Lightning does: its handler (which runs this one after its
own) stops the fit at the next batch, with the epoch checkpoints kept, and raises SIGTERMException (and
under SLURM it requeues). Anywhere else (loading data, evaluating, attacking, writing the release) nothing
of Lightning's would stop the run, so this handler stops it at once. `python -m ttp_lightning` ends either
with the same one error line and exit code 143; every file a run writes is written atomically, so an exit
at any point leaves no half-written file under its real name."""

import contextlib
import signal
from collections.abc import Callable

from ttp_lightning.core import stopping

_FITS = [0]  # Lightning fits in progress in this process
_RESUME: dict = {}  # the newest checkpoint this process wrote or resumed from: {"epoch", "folder"}


def note_checkpoint(epochs_done: int, folder: str) -> None:
    """A fit wrote a checkpoint after `epochs_done` epochs into `folder`, or resumed from it: the line a stop
    prints names it."""
    _RESUME.update(epoch=epochs_done, folder=folder)


def resume_hint() -> str:
    """What the line a stop prints says about resuming."""
    if not _RESUME:
        return "no epoch had finished; rerun the same command to start again"
    return (f"rerun the same command to resume from the checkpoint after epoch {_RESUME['epoch']} in "
            f"{_RESUME['folder']}")


@contextlib.contextmanager
def fitting():
    """Marks a Lightning fit: a SIGTERM inside it is Lightning's to handle (and the long loops' of one step,
    core.stopping)."""
    if not _FITS[0]:
        stopping.clear()  # a fit starts with no stop asked for (a SIGTERM outside fits ends the process at once)
    _FITS[0] += 1
    try:
        yield
    finally:
        _FITS[0] -= 1


def install(stop: Callable[[], None]) -> None:
    """On SIGTERM outside a fit, call `stop` (which prints the error line and ends the process)."""

    def on_sigterm(signum, frame) -> None:
        if not _FITS[0]:
            stop()
        stopping.request()  # inside a fit: Lightning stops at the next batch, long steps at their next check

    signal.signal(signal.SIGTERM, on_sigterm)
