"""Pre-flight check of config-group choices on the command line, for a one-line error on a typo."""

import os
import re
from pathlib import Path

from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.core.files import RUN_LOCK, release_removing

CONF_DIR = Path(__file__).parents[1] / "conf"
GROUPS = ("data", "model", "method", "trainer", "logger", "attacks/suite", "attacks", "experiment", "optimizer", "schedule",
          "callbacks", "workflow")
_OVERRIDE = re.compile(r"^[+~]{0,2}(?P<group>" + "|".join(GROUPS) + r")(@[\w.]+)?=(?P<value>[^\s]*)$")


SELECTED_PER_SECTION = ("optimizer", "schedule")  # config groups that pretrain and the method each select
SUITE_GROUP, OLD_SUITE_GROUP = "attacks/suite@", "attack@"  # the attacks attacks.suite can hold (conf/attacks/suite)


def normalize_overrides(argv: list[str]) -> list[str]:
    """Shorter spellings of group choices, as Hydra's own: `+experiment=X` (the older spelling) as
    `experiment=X` (and `+workflow=X`; the defaults list holds `experiment: null`, and Hydra refuses to append a group that is
    already there); `pretrain.optimizer=sgd` / `method.schedule=cosine` as the choice of the `optimizer` /
    `schedule` group at that key (`optimizer@pretrain.optimizer=sgd`); the attack group's earlier name
    (`+attack@attacks.suite.fgsm=fgsm`) as its own (`+attacks/suite@attacks.suite.fgsm=fgsm`)."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        section, _, group = key.partition(".")
        bare = arg.lstrip("+~")
        if arg.startswith(("+experiment=", "+workflow=")):
            arg = arg[1:]
        elif bare.startswith(OLD_SUITE_GROUP):  # the group's name before conf/attacks/suite/
            arg = arg[:len(arg) - len(bare)] + SUITE_GROUP + bare[len(OLD_SUITE_GROUP):]
        elif sep and section in ("pretrain", "method") and group in SELECTED_PER_SECTION:
            arg = f"{group}@{key}={value}"
        out.append(arg)
    return out


def searchpath_dirs(argv: list[str]) -> list[Path]:
    """Config folders added with `hydra.searchpath=[file://DIR,...]` (where a user keeps their own methods,
    data sets or experiments without touching the package)."""
    folders = []
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        if key == "hydra.searchpath":
            folders += [Path(item.strip()[len("file://"):]) for item in value.strip("[]").split(",")
                        if item.strip().startswith("file://")]
    return folders


def group_options(group: str, extra: list[Path] = ()) -> list[str]:
    return sorted({p.stem for folder in (CONF_DIR, *extra) for p in (folder / group).glob("*.yaml")})


def check_group_choices(argv: list[str]) -> None:
    """Raise TTPUserError for `group=name` overrides whose config file does not exist."""
    extra = searchpath_dirs(argv)
    for arg in argv:
        match = _OVERRIDE.match(arg)
        if not match or any(ch in match["value"] for ch in "()[]{}*$"):
            continue  # sweep functions and interpolations are left to Hydra
        options = group_options(match["group"], extra)
        for value in match["value"].split(","):
            if value and value not in options:
                what = "attack" if match["group"] == SUITE_GROUP[:-1] else match["group"]
                raise TTPUserError(f"unknown {what} {value!r}; choose one of: {', '.join(options)}")


def check_launcher(argv: list[str]) -> None:
    """hydra/launcher=submitit_* needs the submitit plugin (the `slurm` extra); without it Hydra would fail
    with a traceback when it builds the launcher."""
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        if key == "hydra/launcher" and value.startswith("submitit"):
            try:
                import hydra_plugins.hydra_submitit_launcher  # noqa: F401
            except ImportError:
                raise TTPUserError(f"hydra/launcher={value} needs Hydra's submitit launcher, which is not "
                                   "installed; pip install -e '.[slurm]' (or hydra-submitit-launcher)") from None


def nearest_existing(path: Path) -> Path:
    """`path` or its nearest parent that exists (where a folder to be created would go)."""
    return next(p for p in (path, *path.parents) if p.exists())


def check_output_dir(argv: list[str], cwd: Path | None = None) -> None:
    """Raise TTPUserError when the run's output folder (hydra.run.dir / hydra.sweep.dir, default under the
    current folder) cannot be created or written, before Hydra fails on it with a traceback."""
    wanted = {"outputs"}
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        if key in ("hydra.run.dir", "hydra.sweep.dir") and value and "$" not in value:
            wanted.add(value)
    for target in sorted(wanted):
        path = (cwd or Path.cwd()) / target
        if path.resolve() == Path(path.resolve().anchor):
            raise TTPUserError(f"output folder {target!r} is the file system's root; give a run its own folder "
                               "(hydra.run.dir=<folder>)")
        longest = max((part for part in path.parts), key=len)
        if len(longest.encode()) > 255 or len(str(path).encode()) > 4000:
            raise TTPUserError(f"output folder {target[:60]!r}... has a name longer than the file system allows "
                               "(255 bytes a folder name); choose a shorter hydra.run.dir")
        existing = nearest_existing(path)
        if not existing.is_dir():
            raise TTPUserError(f"output folder {str(path)!r} cannot be made: {str(existing)!r} is a file, not a "
                               "folder; set hydra.run.dir=<folder> elsewhere (the file is left as it is)")
        if not os.access(existing, os.W_OK):
            raise TTPUserError(f"output folder {str(path)!r} cannot be written ({str(existing)!r} is read-only); "
                               "run from a writable folder or set hydra.run.dir=<writable folder>")
        if existing == path:
            check_not_busy(path)


RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID")  # set in a DDP run's processes (Lightning, SLURM, torchrun)


def check_not_busy(folder: Path) -> None:
    """A run folder another run holds (its lock, core.files.run_folder_lock) is refused before Hydra writes its
    .hydra/ files there, so the first run's record of its own settings is never overwritten."""
    from filelock import FileLock, Timeout

    if any(os.environ.get(key, "0") != "0" for key in RANK_VARIABLES) or not (folder / RUN_LOCK).exists():
        return  # a DDP run's other processes share the folder with its first, which holds the lock
    lock = FileLock(str(folder / RUN_LOCK))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise TTPUserError(f"run folder {str(folder)!r} is in use by another run (it holds {RUN_LOCK}); wait for it "
                           "to end, or give this run its own folder (hydra.run.dir=...)") from None
    release_removing(lock)  # a killed run's file: nobody holds it


RENAMED = {  # settings a release renamed: their old spelling gets one line saying what replaced it
    "attacks.names": "attacks.suite (each attack a conf/attacks/suite YAML: +attacks/suite@attacks.suite.fgsm=fgsm adds one, "
                     "attacks.suite.gaussian=null leaves one out)",
}


def check_renamed(argv: list[str]) -> None:
    """Raise TTPUserError for a setting under the name it had before a release renamed it."""
    for arg in argv:
        key = arg.lstrip("+~").partition("=")[0]
        if key in RENAMED:
            raise TTPUserError(f"{key} is no longer a setting; use {RENAMED[key]}")


ADDABLE = ("experiment", "trainer.", "logger.", "hydra.", "callbacks.", "attacks/suite@attacks.suite.")  # `+key=`
# may add these (passed to Lightning/Hydra; callbacks.NAME adds a Lightning callback, attacks/suite@attacks.suite.NAME
# an attack)


def check_unknown_additions(argv: list[str]) -> None:
    """Raise TTPUserError for `+key=value` that adds a key the application never reads (a typo or a
    feature that does not exist would otherwise be accepted and silently ignored)."""
    for arg in argv:
        if not arg.startswith("+") or arg.startswith("++") or "=" not in arg:
            continue
        key = arg[1:].split("=", 1)[0]
        if not key.startswith(ADDABLE):
            raise TTPUserError(f"unknown key {key!r}: `+{key}=...` adds a setting ttp_lightning never reads; "
                               "see `--cfg job` for the settings there are (only trainer.*, logger.*, callbacks.*, hydra.*, "
                               "attacks/suite@attacks.suite.* and experiment can be added)")


def is_sweep(arg: str) -> bool:
    """A multirun value list (`a=1,2`): a comma outside brackets and quotes (`a=[1,2]` is one list value)."""
    depth, quote = 0, None
    for char in arg.partition("=")[2]:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            return True
    return False


def check_composition(argv: list[str]) -> None:
    """Compose the config as Hydra will and turn a failure (an unknown key, a value of the wrong type) into
    one TTPUserError line. Skipped for multirun sweeps and Hydra's own flags (Hydra reports those)."""
    if any(arg.startswith("-") for arg in argv) or any(is_sweep(arg) for arg in argv):
        return
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = [arg for arg in argv if "=" in arg and (not arg.startswith("hydra.") or
                                                         arg.startswith("hydra.searchpath="))]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            composed = compose(config_name="main", overrides=overrides)
    except Exception as exc:
        text = str(exc) + ("\n" + str(exc.__cause__) if exc.__cause__ else "")
        lines = [line.strip() for line in text.splitlines()
                 if line.strip() and not line.strip().startswith(("To append", "full_key", "object_type", "reference_type"))]
        hint = did_you_mean(text, overrides)  # the `with` above has put Hydra's global state back already
        raise TTPUserError(" ".join(lines) + (f"; did you mean {hint!r}?" if hint else "")
                           + " (see `--cfg job` for every setting)") from exc
    finally:
        GlobalHydra.instance().clear()
    check_devices(composed.trainer)  # before Hydra's job starts a process per device


def did_you_mean(error: str, overrides: list[str]) -> str | None:
    """The setting a mistyped override most likely meant: the closest key (difflib) beside the unknown one, in
    the config composed without it; None when Hydra's `error` names no unknown key or nothing is close."""
    import difflib

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import DictConfig

    wrong, bad = re.search(r"Could not override '([^']+)'", error), re.search(r"Key '([^']+)' not in", error)
    parts = wrong.group(1).lstrip("+~").split(".") if wrong else []
    if bad is None or bad.group(1) not in parts:
        return None
    at = parts.index(bad.group(1))
    rest = [o for o in overrides if o.lstrip("+~").partition("=")[0] != wrong.group(1)]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            node = compose(config_name="main", overrides=rest)
    except Exception:  # noqa: BLE001 -- the other overrides fail too: Hydra's own message is all there is
        return None
    finally:
        GlobalHydra.instance().clear()
    for part in parts[:at]:
        node = node.get(part) if isinstance(node, DictConfig) else None
    if not isinstance(node, DictConfig):
        return None
    close = difflib.get_close_matches(parts[at], [str(key) for key in node], n=1, cutoff=0.6)
    return ".".join([*parts[:at], close[0], *parts[at + 1:]]) if close else None


def check_devices(trainer) -> None:
    """trainer.devices within what this machine has (CPU cores, or CUDA GPUs for a GPU trainer), checked
    before any process starts: Lightning would start one process per device, and a thousand of them outlive a
    parent that fails."""
    from omegaconf import OmegaConf

    devices, accelerator = trainer.get("devices", 1), str(trainer.get("accelerator", "cpu"))
    if devices in (None, "auto", -1, "-1"):
        return
    on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and _cuda_count() > 0)
    have = _cuda_count() if on_gpu else (os.cpu_count() or 1)
    kind = "CUDA GPU" if on_gpu else "CPU core"
    allowed = f"choose 1..{have}, -1 (all) or auto; this machine has {have} {kind}{'s' if have != 1 else ''}"
    if isinstance(devices, str) and "," in devices:
        devices = [part for part in devices.split(",") if part.strip()]
    if OmegaConf.is_list(devices) or isinstance(devices, list):
        indices = [str(d).strip() for d in devices]
        bad = [d for d in indices if not d.isdigit() or int(d) >= have]
        if bad or len(set(indices)) != len(indices) or not indices:
            raise TTPUserError(f"trainer.devices={list(devices)} is not allowed; list distinct device indices "
                               f"0..{have - 1} ({allowed})")
        return
    text = str(devices).strip()
    if not text.isdigit() or not 1 <= int(text) <= have:
        raise TTPUserError(f"trainer.devices={devices} is not allowed; {allowed}")


def check_cache_dir(cache_dir) -> None:
    """paths.cache_dir (pretraining entries, checkpoints) must be writable: else one line before any work."""
    existing = nearest_existing(Path(str(cache_dir)).expanduser().absolute())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise TTPUserError(f"paths.cache_dir={str(cache_dir)!r} cannot be written ({str(existing)!r} is "
                           f"{'not a folder' if not existing.is_dir() else 'read-only'}); set TTP_CACHE_DIR or "
                           "paths.cache_dir to a writable folder")


def _cuda_count() -> int:
    import torch  # only for a GPU or auto trainer: a CPU trainer is checked without it

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
