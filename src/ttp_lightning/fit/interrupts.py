"""Who handles a SIGTERM. Inside a Lightning fit, Lightning does: its handler (which runs this one after its
own) stops the fit at the next batch, with the epoch checkpoints kept, and raises SIGTERMException (and
under SLURM it requeues). Anywhere else (loading data, evaluating, attacking, writing the release) nothing
of Lightning's would stop the run, so this handler stops it at once. `python -m ttp_lightning` ends either
with the same one error line and exit code 143; every file a run writes is written atomically, so an exit
at any point leaves no half-written file under its real name."""

import contextlib
import signal
from collections.abc import Callable

_FITS = [0]  # Lightning fits in progress in this process


@contextlib.contextmanager
def fitting():
    """Marks a Lightning fit: a SIGTERM inside it is Lightning's to handle."""
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

    signal.signal(signal.SIGTERM, on_sigterm)
