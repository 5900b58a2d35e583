"""User-facing errors: raised for bad input, printed as one line by the entry point."""


EXIT_NOT_PROTECTED = 4  # the run finished, but its release gate failed (protection.py): not released as protected


class TTPUserError(Exception):
    """A problem with the user's input (config values, files, names) rather than a bug."""


def instantiate(config, **kwargs):
    """hydra.utils.instantiate, with a TTPUserError raised inside the constructor coming out unwrapped (Hydra
    wraps constructor errors), so bad user input still ends in the usual one-line error."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate as hydra_instantiate

    try:
        return hydra_instantiate(config, **kwargs)
    except InstantiationException as exc:
        if isinstance(exc.__cause__, TTPUserError):
            raise exc.__cause__ from None
        raise
