"""Value checks shared by the config validation and the methods' own checks: each raises TTPUserError
naming the key, the bad value and what is allowed (one line, before any work starts)."""

import math
from collections.abc import Mapping

from ttp_lightning.errors import TTPUserError


def number(value, key: str):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TTPUserError(f"{key}={value!r} is not a number")
    if math.isnan(value):
        raise TTPUserError(f"{key}=nan is not allowed; choose a number")
    return value


def positive_int(value, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TTPUserError(f"{key}={value!r} is not allowed; choose a positive integer")


def positive(value, key: str) -> None:
    if not 0 < number(value, key) < float("inf"):
        raise TTPUserError(f"{key}={value} is not allowed; choose a finite value > 0")


def choice(value, key: str, allowed) -> None:
    if value not in allowed:
        raise TTPUserError(f"{key}={value!r} is not allowed; choose one of: {', '.join(map(str, allowed))}")


def optim(section, prefix: str) -> None:
    positive_int(section["epochs"], f"{prefix}.epochs")
    positive(section["lr"], f"{prefix}.lr")
    if number(section["weight_decay"], f"{prefix}.weight_decay") < 0:
        raise TTPUserError(f"{prefix}.weight_decay={section['weight_decay']} is not allowed; choose a value >= 0")
    if not isinstance(section.get("optimizer"), Mapping) or "_target_" not in section["optimizer"]:
        raise TTPUserError(f"{prefix}.optimizer is not an optimizer config; choose one of conf/optimizer (e.g. "
                           f"{prefix}.optimizer=sgd)")


def uniformity(method) -> None:
    from ttp_lightning.objectives import UNIFORMITY_LOSSES

    choice(method.uniformity, "method.uniformity", list(UNIFORMITY_LOSSES))
    positive(method.forget_temperature, "method.forget_temperature")


def auto_or(value, key: str, check) -> None:
    if value != "auto":
        check(value, key)


def fraction(value, key: str) -> None:
    if not 0.0 < number(value, key) < 1.0:
        raise TTPUserError(f"{key}={value} is not allowed; choose a value in (0, 1)")
