"""Shared fixtures: the one composed test config (tiny, fast, offline) and a CLI runner."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from ttp_lightning.config.choices import normalize_overrides

# pytest's environment carries COLUMNS (80) into every run the tests start; the console folds its tables to the
# terminal's width (core/console.py), so the tests read the console as a pipe does: 100 columns
for _size in ("COLUMNS", "LINES"):
    os.environ.pop(_size, None)

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "src" / "ttp_lightning" / "conf"
MNIST_ROOT = REPO.parent / "shared" / "data"
HAVE_MNIST = (MNIST_ROOT / "MNIST" / "raw" / "train-images-idx3-ubyte").is_file()
needs_mnist = pytest.mark.skipif(not HAVE_MNIST, reason=f"MNIST files not found under {MNIST_ROOT}")

# Tiny, fast, offline: every test run of the application starts from these overrides.
TINY = [
    "logger=none",
    "trainer.enable_progress_bar=false",
    "pretrain.epochs=8",
    "method.epochs=15",
    "data.forget.size=20",
    # one relearning run per stage (the default is 2 sources x 3 rates up to 1,000 steps; tests/test_relearn.py)
    "attacks.relearn.steps=[1,10,100]",
    "attacks.relearn.lrs=[0.001]",
    "attacks.relearn.data=[test]",
    "attacks.relearn.floor=false",
]
def registered_loader(name: str):
    """conf/data/<name>.yaml's loader (a data.sources.Source), built as Hydra builds it."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    return instantiate(OmegaConf.load(CONF_DIR / "data" / f"{name}.yaml").loader)


TINY_WITHOUT_METHOD = [o for o in TINY if not o.startswith("method.")]  # for methods without Alg 1 epochs


def runs_robust(overrides) -> bool:
    """Whether `overrides` select robust Alg 1 (method=pareto_robust, +workflow=protect or a *_robust
    experiment, unless a later method= names another method)."""
    method = None
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key == "method":
            method = value
        elif (key == "workflow" and value == "protect") or (key == "experiment" and value.endswith("_robust")):
            method = method or "pareto_robust"
    return method == "pareto_robust"


def tiny_for(overrides) -> list[str]:
    """TINY, with robust Alg 1 in one round (its default is up to 3 cosine cycles: tests/test_rounds.py and the
    tests that name method.adversarial.rounds test them) where the overrides select it, and plain Alg 1 (no
    method, workflow or experiment named) on the paper's retain rule (PAPER_RULE) unless they name retain_holdout."""
    overrides = list(overrides)
    robust = runs_robust(overrides)
    one_round = robust and not any(o.startswith("method.adversarial.rounds=") for o in overrides)
    plain = not robust and not any(o.startswith(("method=", "+workflow=", "+experiment=")) or
                                   "retain_holdout" in o for o in overrides)
    return TINY + (["method.adversarial.rounds=1"] if one_round else []) + (PAPER_RULE if plain else [])


# Plain Alg 1 on TINY reads its retain rule on the images trained on (the paper's rule): the tests written for it
# keep their numbers, where a held-out fifth of TINY's small retain set (the default, retain_holdout: auto) moves
# the kept epoch; the default's held-out rule is tested where a test names retain_holdout
# (test_cli.test_default_job_writes_the_results_contract, test_robust, test_val_folder) and by the slow default job.
PAPER_RULE = ["method.early_stopping.retain_holdout=0"]


@pytest.fixture
def compose_cfg():
    """Compose the application config with TINY plus the given overrides (no Hydra run dir)."""

    def _compose(*overrides: str, tiny: bool = True):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="main", overrides=normalize_overrides((tiny_for(overrides) if tiny else []) + list(overrides)),
                           return_hydra_config=True)

    return _compose


@pytest.fixture
def run_cli(tmp_path):
    """Run `python -m ttp_lightning` with TINY, a private cache and run dir; returns (proc, results|None)."""

    def _run(*overrides: str, tiny: bool = True, multirun: bool = False, timeout: int = 600):
        env = dict(os.environ, TTP_CACHE_DIR=str(tmp_path / "cache"), WANDB_MODE="disabled")
        args = [sys.executable, "-m", "ttp_lightning"] + (["-m"] if multirun else [])
        dir_key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
        args += (tiny_for(overrides) if tiny else []) + list(overrides) + [f"{dir_key}={tmp_path / 'out'}"]
        proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        results_file = tmp_path / "out" / "results.json"
        results = json.loads(results_file.read_text()) if results_file.is_file() else None
        return proc, results

    return _run


@pytest.fixture
def run_main(tmp_path, monkeypatch, capsys):
    """`python -m ttp_lightning ARGS` in this process (Hydra's main, the error contract), for tests of what a
    run does rather than of the process: returns (exit code, stdout, stderr, results|None)."""
    import logging

    from hydra.core.global_hydra import GlobalHydra

    from ttp_lightning import __main__ as entry

    def _run(*overrides: str, tiny: bool = True):
        monkeypatch.setenv("TTP_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.setenv("WANDB_MODE", "disabled")
        monkeypatch.setattr(sys, "argv", ["ttp_lightning", *(tiny_for(overrides) if tiny else []), *overrides,
                                          f"hydra.run.dir={tmp_path / 'out'}", "hydra/job_logging=none",
                                          "hydra/hydra_logging=none"])
        root = logging.getLogger()
        handlers, level = list(root.handlers), root.level
        on_sigterm, on_sigint = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)  # main() sets them
        code = 0
        try:
            entry.main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            signal.signal(signal.SIGTERM, on_sigterm)
            signal.signal(signal.SIGINT, on_sigint)
            GlobalHydra.instance().clear()
            for handler in list(root.handlers):
                if handler not in handlers:
                    root.removeHandler(handler)
                    handler.close()
            root.setLevel(level)
        captured = capsys.readouterr()
        results_file = tmp_path / "out" / "results.json"
        results = json.loads(results_file.read_text()) if results_file.is_file() else None
        return code, captured.out, captured.err, results

    return _run


@pytest.fixture
def run_job(run_main):
    """run_cli's interface (a CompletedProcess and the results), run in this process: for tests of what a
    job does, where starting a new interpreter is not what is tested."""

    def _run(*overrides: str, tiny: bool = True):
        code, out, err, results = run_main(*overrides, tiny=tiny)
        return subprocess.CompletedProcess(list(overrides), code, out, err), results

    return _run


def finished(code: int, results: dict | None, stderr: str = "") -> None:
    """The run went to its end: exit 0 with the release gate passed, or exit 4 (EXIT_NOT_PROTECTED) with it
    failed and the one line saying so (tiny test runs rarely make every forget image uniform; tests of other
    features check this contract, the gate's own tests check what it decides)."""
    assert results is not None, stderr[-3000:]
    gate = results["release_gate"]
    assert code == (0 if gate["passed"] else 4), stderr[-3000:]
    assert gate["passed"] or "error: not protected" in stderr


def release_of(out: Path) -> Path:
    """The release folder a finished run wrote (release/, or release_not_protected/ when the gate failed)."""
    return out / json.loads((out / "results.json").read_text())["release"]["folder"]
