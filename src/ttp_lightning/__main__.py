"""`python -m ttp_lightning`: the Hydra entry point. Thin: compose config, run the pipeline."""

import contextlib
import io
import os
import signal
import sys
import warnings

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from ttp_lightning.config.choices import (
    check_composition,
    check_group_choices,
    check_launcher,
    check_output_dir,
    check_renamed,
    check_unknown_additions,
    normalize_overrides,
)
from ttp_lightning.core.console import fold_long_lines
from ttp_lightning.core.errors import EXIT_NOT_PROTECTED, TTPUserError
from ttp_lightning.core.files import run_folder_lock
from ttp_lightning.fit import interrupts


def _fail(exc: TTPUserError) -> None:
    print(f"error: {exc}", file=sys.stderr, flush=True)
    sys.exit(2)


_RECEIVED: dict[str, str] = {}
_NOT_PROTECTED: list[str] = []  # multirun jobs whose release gate failed (the sweep goes on; exit 4 at its end)


def _on_sigint(signum, frame) -> None:
    _RECEIVED["signal"] = "SIGINT"
    raise KeyboardInterrupt


def _stopped_by(name: str, code: int, at_once: bool = False) -> None:
    """A signal ends the run: one error line and the shell's code for it (128 + signal number), so a
    scheduler never records a killed run as a success. Nothing half-written is left (results.json and
    weights are written atomically at the very end); the line names the checkpoint a rerun resumes from.
    `at_once` (a SIGTERM outside a fit, from the signal handler) exits without unwinding: an exception raised
    in a handler can land in library code that swallows it (an import's bare `except`), and the run would
    go on."""
    print(f"error: received {name}; the run stopped before writing its results ({interrupts.resume_hint()})",
          file=sys.stderr, flush=True)
    if at_once:
        sys.stdout.flush()
        os._exit(code)
    sys.exit(code)


@hydra.main(version_base="1.3", config_path="conf", config_name="main")
def _hydra_main(cfg: DictConfig) -> None:
    from hydra.types import RunMode
    from lightning.pytorch.utilities import rank_zero_only
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from ttp_lightning.assess.protection import gate_line

    # the entry point's one deferral: the pipeline (torch, Lightning: seconds) is imported only after the
    # pre-flight checks and Hydra's --help, so that bad input gets its one line in under a second
    from ttp_lightning.run.pipeline import run

    try:
        with run_folder_lock(HydraConfig.get().runtime.output_dir, rank_zero_only.rank):
            record = run(cfg, HydraConfig.get().runtime.output_dir)
        if record is not None and not record.gate.passed:
            print(f"error: {gate_line(record.gate)}", file=sys.stderr, flush=True)
            if HydraConfig.get().mode != RunMode.MULTIRUN:
                sys.exit(EXIT_NOT_PROTECTED)
            _NOT_PROTECTED.append(HydraConfig.get().runtime.output_dir)
    except TTPUserError as exc:
        _fail(exc)
    except SIGTERMException:  # Lightning's SIGTERM handling exits with code 0 unless caught
        _stopped_by("SIGTERM", 128 + signal.SIGTERM)
    except KeyboardInterrupt:
        _stopped_by("SIGINT", 128 + signal.SIGINT)
    except SystemExit:
        if _RECEIVED.get("signal") == "SIGINT":  # Lightning turns Ctrl-C during a fit into exit code 1
            _stopped_by("SIGINT", 128 + signal.SIGINT)
        raise


def _help() -> None:
    """Hydra's --help, with the config-group lines it writes (one line a group, however many options) folded
    within the console's 100 columns."""
    text = io.StringIO()
    try:
        with contextlib.redirect_stdout(text):
            _hydra_main()
    finally:
        print(fold_long_lines(text.getvalue()), end="", flush=True)


def main() -> None:
    _NOT_PROTECTED.clear()
    os.environ.setdefault("WANDB_SILENT", "true")
    # conf/hydra/launcher/submitit_*.yaml replace the submitit plugin's configs of the same names (with this
    # project's defaults); Hydra 1.3 then checks them against the plugin's schemas, as intended, and warns
    # that this matching by name is deprecated (it stays in hydra-core < 1.4, which pyproject.toml pins)
    warnings.filterwarnings("ignore", message=r"(?s).*is validated against ConfigStore schema with the same name")
    signal.signal(signal.SIGINT, _on_sigint)
    interrupts.install(lambda: _stopped_by("SIGTERM", 128 + signal.SIGTERM, at_once=True))  # outside fits
    sys.argv[1:] = normalize_overrides(sys.argv[1:])
    try:
        check_renamed(sys.argv[1:])
        check_group_choices(sys.argv[1:])
        check_unknown_additions(sys.argv[1:])
        check_launcher(sys.argv[1:])
        check_output_dir(sys.argv[1:])
        check_composition(sys.argv[1:])
    except TTPUserError as exc:
        _fail(exc)
    if {"--help", "-h"} & set(sys.argv[1:]):
        _help()
        return
    _hydra_main()
    if _NOT_PROTECTED:  # a sweep whose every job ran, some of them leaving a forget image unprotected
        print(f"error: {len(_NOT_PROTECTED)} job(s) of the sweep are not protected: {', '.join(_NOT_PROTECTED)}",
              file=sys.stderr, flush=True)
        sys.exit(EXIT_NOT_PROTECTED)


if __name__ == "__main__":
    main()
