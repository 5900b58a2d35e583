"""The default experiment name, `<data>_<model>` of the run (`cifar10_resnet8`, `imagefolder_timm_resnet50`):
the console title, the output folder, wandb's run name and results.json say what ran even when no
experiment file named it (an experiment file or workflow sets `experiment_name` itself)."""

import re
from functools import cache

from ttp_lightning.config.build import is_node, load_file, register_resolver, to_plain
from ttp_lightning.config.choices import CONF_DIR

NOT_ARCHITECTURE = {"checkpoint", "pretrained", "pretrained_file"}  # where weights come from, not what they are


@cache
def registered_models() -> tuple[tuple[str, dict], ...]:
    """(name, plain config) of every conf/model file, sorted by name; read once per process."""
    return tuple((path.stem, to_plain(load_file(path)))
                 for path in sorted((CONF_DIR / "model").glob("*.yaml")))


def model_name(model) -> str:
    """The registered model config (conf/model) that `model` is, or is closest to (the same `_target_`, the
    most equal settings; `timm` adds its architecture's name); else the target's own name."""
    config = to_plain(model) if is_node(model) else dict(model or {})
    target = config.get("_target_", "")
    scored = [(sum(config.get(k) == v for k, v in base.items() if k not in NOT_ARCHITECTURE), -order, choice)
              for order, (choice, base) in enumerate(registered_models()) if base.get("_target_") == target]
    if scored:
        choice = max(scored)[2]
        label = f"{choice}_{config['name']}" if choice == "timm" and config.get("name") else choice
    else:
        label = str(target).rsplit(".", 1)[-1].lower() or "model"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", label)


def register() -> None:
    """`${ttp.model_name:${model}}` (conf/main.yaml's experiment_name)."""
    register_resolver("ttp.model_name", model_name)
