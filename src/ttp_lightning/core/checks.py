"""Value checks shared by the config validation and the methods' own checks: each raises TTPUserError
naming the key, the bad value and what is allowed (one line, before any work starts)."""

import math

from ttp_lightning.core.errors import TTPUserError


def number(value, key: str):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TTPUserError(f"{key}={value!r} is not a number")
    if math.isnan(value):
        raise TTPUserError(f"{key}=nan is not allowed; choose a number")
    return value


def positive_int(value, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TTPUserError(f"{key}={value!r} is not allowed; choose a positive integer")


def whole_number(value, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TTPUserError(f"{key}={value!r} is not allowed; choose a whole number >= 0")


def positive(value, key: str) -> None:
    if not 0 < number(value, key) < float("inf"):
        raise TTPUserError(f"{key}={value} is not allowed; choose a finite value > 0")


def choice(value, key: str, allowed) -> None:
    if value not in allowed:
        raise TTPUserError(f"{key}={value!r} is not allowed; choose one of: {', '.join(map(str, allowed))}")


def auto_or(value, key: str, check) -> None:
    """`check` unless the value is `auto`, whose error then names auto among what is allowed."""
    if value == "auto":
        return
    try:
        check(value, key)
    except TTPUserError as error:
        raise TTPUserError(str(error).replace("; choose ", "; choose auto or ", 1)) from None


def fraction(value, key: str) -> None:
    if not 0.0 < number(value, key) < 1.0:
        raise TTPUserError(f"{key}={value} is not allowed; choose a value in (0, 1)")


def unit_interval(value: float, key: str, closed: bool = True) -> None:
    inside = 0.0 <= value <= 1.0 if closed else 0.0 < value < 1.0
    if not inside:
        interval = "[0, 1]" if closed else "(0, 1)"
        raise TTPUserError(f"{key}={value} is not allowed; choose a value in {interval}")


def at_least_zero(value: float, key: str) -> None:
    if number(value, key) < 0:
        raise TTPUserError(f"{key}={value} is not allowed; choose a value >= 0")
