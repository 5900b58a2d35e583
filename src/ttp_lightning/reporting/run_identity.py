"""What a dashboard needs to slice runs: the resolved config as flat keys (`method.theta`, `data.forget.size`),
a run name that carries the values a sweep varies, one group per multirun sweep and the method as job type.

The swept keys come from Hydra's own record of the sweep: the overrides of the command line that started
it, which Hydra saves in the sweep folder's multirun.yaml before it launches a job (in process, submitit
local and SLURM jobs alike read the same file), parsed by Hydra's override parser (`method.theta=0.25,0.75`,
`method=pareto,retrain`, `data.forget.size=range(10,40,10)`), and a sweep an experiment file carries
(`hydra.sweeper.params`). A job's own `hydra.overrides.task` holds only its values, not which were swept.
"""

from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

MAX_GROUP = 120  # wandb's limit is 128 characters
SWEEP_RECORD = "multirun.yaml"  # what Hydra's sweeper writes into the sweep folder


def flat_config(container: dict) -> dict:
    """The resolved config (a plain container, results.json's `config`) as {"method.theta": 0.75,
    "data.forget.size": 20, ...} (lists stay lists)."""
    flat: dict = {}

    def walk(value, prefix: str) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(item, f"{prefix}.{key}" if prefix else str(key))
        else:
            flat[prefix] = value

    walk(container, "")
    return flat


def swept_keys(overrides: list[str]) -> list[str]:
    """The keys that sweep overrides vary (`method.theta=0.25,0.75` -> method.theta; `method=pareto,retrain`
    -> method), by Hydra's override parser; Hydra's own settings are not the run's."""
    keys = []
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group if override.package is None else f"{override.key_or_group}@{override.package}"
        if override.is_sweep_override() and not key.startswith("hydra."):
            keys.append(key)
    return keys


def _sweep_folder(hydra_cfg) -> Path:
    folder = Path(str(hydra_cfg.sweep.dir))
    return folder if folder.is_absolute() else Path(str(hydra_cfg.runtime.cwd)) / folder


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
    record = _sweep_folder(hydra_cfg) / SWEEP_RECORD
    keys = swept_keys(list(OmegaConf.load(record).hydra.overrides.task)) if record.is_file() else []
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
    folder = _sweep_folder(hydra_cfg)
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
    (`digits_mlp-pareto-theta=0.25`); a single run with a theta names it too. The group is the sweep's folder for
    a multirun job, else the experiment (a dashboard groups single runs of one experiment together)."""
    swept = swept_values(cfg)
    parts = [f"{key.rsplit('.', 1)[-1]}={short_value(value)}" for key, value in swept.items()]
    theta = cfg.method.get("theta")
    if not parts and theta is not None:
        parts = [f"theta={theta if theta == 'auto' else short_value(float(theta))}"]
    name = "-".join([str(cfg.experiment_name), str(cfg.method.name), *parts])
    return {"name": name, "group": sweep_group(cfg) or str(cfg.experiment_name), "job_type": str(cfg.method.name),
            "swept": swept}
