"""What a dashboard needs to slice runs: the resolved config as flat keys (`method.theta`, `data.forget.size`),
a run name that carries the values a sweep varies, one group per multirun sweep and the method as job type.

The swept keys come from the command line of the process that started the sweep (`main` puts them in the
environment variable TTP_SWEPT, which every job inherits: in-process, submitit local and SLURM jobs alike)
and from a sweep an experiment file carries (`hydra.sweeper.params`).
"""

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ttp_lightning.cli_checks import is_sweep

SWEPT_ENV = "TTP_SWEPT"
MAX_GROUP = 120  # wandb's limit is 128 characters


def flat_config(cfg: DictConfig) -> dict:
    """The resolved config as {"method.theta": 0.75, "data.forget.size": 20, ...} (lists stay lists)."""
    container = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    flat: dict = {}

    def walk(value, prefix: str) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(item, f"{prefix}.{key}" if prefix else str(key))
        else:
            flat[prefix] = value

    walk(container, "")
    return flat


def swept_keys_from_argv(argv: list[str]) -> list[str]:
    """The keys a multirun command line sweeps (`method.theta=0.25,0.75` -> method.theta)."""
    keys = []
    for arg in argv:
        key = arg.lstrip("+~").partition("=")[0]
        if "=" in arg and is_sweep(arg) and not key.startswith("hydra."):
            keys.append(key)
    return keys


def _multirun():
    """Hydra's config of this job when it is a job of a multirun sweep, else None."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    return hydra_cfg if str(hydra_cfg.mode) == "RunMode.MULTIRUN" else None


def swept_values(cfg: DictConfig) -> dict:
    """{key: this job's value} for every swept key (empty outside a multirun)."""
    hydra_cfg = _multirun()
    if hydra_cfg is None:
        return {}
    keys = [k for k in os.environ.get(SWEPT_ENV, "").split(",") if k]
    keys += [str(k) for k in (hydra_cfg.sweeper.get("params") or {}) if str(k) not in keys]
    values = {}
    for key in keys:
        group = key.split("@")[0]
        if group in hydra_cfg.runtime.choices:  # a config group (method=pareto,retrain): its choice
            values[key] = hydra_cfg.runtime.choices[group]
        else:
            value = OmegaConf.select(cfg, key, default=None)
            values[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return values


def sweep_group(cfg: DictConfig) -> str | None:
    """The wandb group of a multirun job: the sweep's output folder (every job of one sweep shares it)."""
    hydra_cfg = _multirun()
    if hydra_cfg is None:
        return None
    folder = Path(str(hydra_cfg.sweep.dir))
    try:
        folder = folder.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    name = str(folder)
    return name if len(name) <= MAX_GROUP else "..." + name[-(MAX_GROUP - 3):]


def short_value(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def run_identity(cfg: DictConfig) -> dict:
    """{name, group, job_type, swept}: the run's name is `<experiment>-<method>` plus the swept values
    (`digits_mlp-pareto-theta=0.25`); a single run with a theta names it too."""
    swept = swept_values(cfg)
    parts = [f"{key.rsplit('.', 1)[-1]}={short_value(value)}" for key, value in swept.items()]
    theta = cfg.method.get("theta")
    if not parts and theta is not None:
        parts = [f"theta={short_value(float(theta))}"]
    name = "-".join([str(cfg.experiment_name), str(cfg.method.name), *parts])
    return {"name": name, "group": sweep_group(cfg), "job_type": str(cfg.method.name), "swept": swept}
