"""Pre-flight check of config-group choices on the command line, for a one-line error on a typo."""

import re
from pathlib import Path

from ttp_lightning.errors import TTPUserError

CONF_DIR = Path(__file__).parent / "conf"
GROUPS = ("data", "model", "method", "trainer", "logger", "attacks", "experiment")
_OVERRIDE = re.compile(r"^[+~]{0,2}(?P<group>" + "|".join(GROUPS) + r")=(?P<value>[^\s]*)$")


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def check_group_choices(argv: list[str]) -> None:
    """Raise TTPUserError for `group=name` overrides whose config file does not exist."""
    for arg in argv:
        match = _OVERRIDE.match(arg)
        if not match or any(ch in match["value"] for ch in "()[]{}*$"):
            continue  # sweep functions and interpolations are left to Hydra
        options = group_options(match["group"])
        for value in match["value"].split(","):
            if value and value not in options:
                raise TTPUserError(f"unknown {match['group']} {value!r}; choose one of: {', '.join(options)}")
