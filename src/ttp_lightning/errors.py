"""User-facing errors: raised for bad input, printed as one line by the entry point."""


EXIT_NOT_PROTECTED = 4  # the run finished, but its release gate failed (protection.py): not released as protected


class TTPUserError(Exception):
    """A problem with the user's input (config values, files, names) rather than a bug."""


def build_part(config, key: str, expected: type, **kwargs):
    """`config`'s `_target_` built by Hydra as the part at `key` (`attacks.suite.apgd`, `data.loader`): an
    unimportable or wrong target, or an object that is not an `expected`, is one line naming it."""
    from hydra.utils import instantiate as hydra_instantiate

    return _built(config.get("_target_"), key, expected, lambda: hydra_instantiate(config, **kwargs))


def build_class(target, key: str, expected: type, *args, **kwargs):
    """The class `target` names (a `_target_` string) called with `args` and `kwargs`: a part whose settings
    were checked and typed already (a method given its schema object, the data module). The same one-line
    errors as build_part; a TTPUserError the constructor raises comes out as it is."""
    from hydra.utils import get_class

    return _built(target, key, expected, lambda: get_class(str(target))(*args, **kwargs))


def _built(target, key: str, expected: type, make):
    try:
        part = make()
    except TTPUserError:
        raise
    except Exception as exc:  # an unimportable or wrong target: one line naming it
        cause = exc.__cause__ or exc
        raise TTPUserError(f"{key}._target_={target} cannot be built ({type(cause).__name__}: "
                           f"{str(cause).splitlines()[0] if str(cause) else ''})") from exc
    if not isinstance(part, expected):
        raise TTPUserError(f"{key}._target_={target} is not a {expected.__module__}.{expected.__qualname__} subclass")
    return part


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
