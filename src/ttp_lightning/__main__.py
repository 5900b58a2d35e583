"""`python -m ttp_lightning`: the Hydra entry point. Thin: compose config, run the pipeline."""

import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from ttp_lightning.cli_checks import check_group_choices
from ttp_lightning.errors import TTPUserError


def _fail(exc: TTPUserError) -> None:
    print(f"error: {exc}", file=sys.stderr, flush=True)
    sys.exit(2)


@hydra.main(version_base="1.3", config_path="conf", config_name="main")
def _hydra_main(cfg: DictConfig) -> None:
    from ttp_lightning.pipeline import run  # heavy imports after Hydra has parsed --help etc.

    try:
        run(cfg, HydraConfig.get().runtime.output_dir)
    except TTPUserError as exc:
        _fail(exc)


def main() -> None:
    os.environ.setdefault("WANDB_SILENT", "true")
    try:
        check_group_choices(sys.argv[1:])
    except TTPUserError as exc:
        _fail(exc)
    _hydra_main()


if __name__ == "__main__":
    main()
