"""A stop asked for while one long computation runs inside a Lightning fit. Lightning stops a fit on SIGTERM only
between batches, and one certified Newton step is a single batch that can run for many minutes (the solver, the
estimator's chains, Lanczos, the Hessian-vector products over the data). fit/interrupts' SIGTERM handler calls
`request()` inside a fit; those loops call `check()` between iterations, which raises Lightning's SIGTERMException
(the same stop, one line and exit 143, as between batches). Under DDP every rank gets the signal (SLURM, torchrun),
so every rank stops at its next check."""

_REQUESTED = [False]


def request() -> None:
    _REQUESTED[0] = True


def clear() -> None:
    _REQUESTED[0] = False


def requested() -> bool:
    return _REQUESTED[0]


def check() -> None:
    """Raise SIGTERMException when a stop was asked for; nothing otherwise (a flag read: free in any loop)."""
    if _REQUESTED[0]:
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        raise SIGTERMException
