"""Runs that meet real life: signals, divergence, hostile or corrupt input files, a GPU trainer without a GPU,
unwritable output folders, unknown keys, and the console script started from any folder. Each ends in one
`error:` line, a non-zero exit and nothing half-written."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import MNIST_ROOT, REPO, TINY, needs_mnist, registered_loader
from ttp_lightning.config.choices import check_output_dir, check_unknown_additions
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.data.forget import read_index_file
from ttp_lightning.reporting.results import non_finite_keys, write_results
from ttp_lightning.run.validation import _accelerator


@pytest.mark.parametrize(("name", "content", "found"), [
    ("floats.json", "[1.9, 2.9]", "the value 1.9"),
    ("bools.json", "[true, false]", "the value True"),
    ("object.json", '{"a": 1}', "a JSON dict"),
    ("floats.npy", np.array([1.5, 2.0]), "dtype float64"),
    ("bools.npy", np.array([True, False]), "dtype bool"),
    ("dict.pt", {"indices": torch.tensor([1, 2])}, "a dict, not a tensor"),
    ("floats.pt", torch.tensor([1.0, 2.0]), "dtype torch.float32"),
    ("bools.pt", torch.tensor([True, False]), "dtype torch.bool"),
])
def test_index_files_hold_integers_only(tmp_path, name, content, found):
    path = tmp_path / name
    if name.endswith(".json"):
        path.write_text(content)
    elif name.endswith(".npy"):
        np.save(path, content)
    else:
        torch.save(content, path)
    with pytest.raises(TTPUserError, match="must hold integer indices only") as raised:
        read_index_file(path)
    assert found in str(raised.value)


def test_integer_index_files_still_load(tmp_path):
    (tmp_path / "a.json").write_text("[3, 1, 2]")
    np.save(tmp_path / "b.npy", np.array([3, 1, 2], dtype=np.int32))
    torch.save(torch.tensor([3, 1, 2]), tmp_path / "c.pt")
    for name in ("a.json", "b.npy", "c.pt"):
        assert read_index_file(tmp_path / name).tolist() == [3, 1, 2]


def test_a_pickled_object_in_an_index_file_is_refused_not_run(tmp_path):
    class Payload:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    torch.save(Payload(), tmp_path / "hostile.pt")
    with pytest.raises(TTPUserError, match="is not a list of integers"):
        read_index_file(tmp_path / "hostile.pt")
    assert not (tmp_path / "pwned").exists()


def _mnist_copy(tmp_path: Path) -> Path:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        shutil.copy(MNIST_ROOT / "MNIST" / "raw" / name, raw / name)
    return raw


@needs_mnist
def test_corrupt_mnist_is_not_called_missing_and_a_bad_label_byte_is_named(tmp_path):
    raw = _mnist_copy(tmp_path / "truncated")
    (raw / "train-images-idx3-ubyte").write_bytes((raw / "train-images-idx3-ubyte").read_bytes()[:1000])
    with pytest.raises(TTPUserError, match="could not be read; its files look corrupt or truncated"):
        registered_loader("mnist").load("mnist", tmp_path / "truncated", False)
    raw = _mnist_copy(tmp_path / "labels")
    labels = bytearray((raw / "train-labels-idx1-ubyte").read_bytes())
    labels[20] = 200
    (raw / "train-labels-idx1-ubyte").write_bytes(bytes(labels))
    with pytest.raises(TTPUserError, match="has label 200 in its training labels; allowed 0..9"):
        registered_loader("mnist").load("mnist", tmp_path / "labels", False)
    with pytest.raises(TTPUserError, match="not found under"):
        registered_loader("mnist").load("mnist", tmp_path / "nothing", False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_gpu_trainer_without_a_gpu_is_one_line():
    with pytest.raises(TTPUserError, match="needs a CUDA GPU and this machine has none"):
        _accelerator(OmegaConf.create({"accelerator": "gpu"}))
    _accelerator(OmegaConf.create({"accelerator": "cpu"}))


def test_the_gpu_trainers_bf16_default_on_a_gpu_without_bfloat16_is_one_line(monkeypatch, compose_cfg):
    cfg = compose_cfg("trainer=gpu")
    assert cfg.trainer.precision == "bf16-mixed"  # the GPU trainers' default (docs/cluster-and-gpu.md, GPU speed)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-16GB")
    with pytest.raises(TTPUserError, match=r"trainer.precision=bf16-mixed \(the GPU trainers' default\) needs a GPU "
                                           r"with bfloat16 \(NVIDIA Ampere or newer\) and Tesla V100-SXM2-16GB has "
                                           r"none; set trainer.precision=16-mixed or trainer.precision=32"):
        _accelerator(cfg.trainer)
    cfg.trainer.precision = "16-mixed"
    _accelerator(cfg.trainer)


def test_unwritable_output_folder_and_unknown_keys_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path / "ro")
    (tmp_path / "ro").mkdir()
    with pytest.raises(TTPUserError, match="cannot be written"):
        check_output_dir([f"hydra.run.dir={tmp_path / 'ro' / 'run'}"])
    check_output_dir([f"hydra.run.dir={tmp_path / 'rw' / 'run'}"], cwd=tmp_path)
    with pytest.raises(TTPUserError, match="unknown key 'pretrain.checkpoint'"):
        check_unknown_additions(["+pretrain.checkpoint=model.pt"])
    check_unknown_additions(["+experiment=mnist_mlp", "+trainer.deterministic=true", "++method.theta=0.5"])


def test_results_are_strict_json(tmp_path):
    assert non_finite_keys({"a": {"b": [1.0, float("nan")]}, "c": float("inf"), "d": "nan"}) == ["a.b[1]", "c"]
    with pytest.raises(TTPUserError, match=r"non-finite values in the results \(metrics.pareto.forget_acc\)"):
        write_results({"metrics": {"pareto": {"forget_acc": float("nan")}}}, tmp_path)
    assert not list(tmp_path.iterdir())
    write_results({"metrics": {"pareto": {"forget_acc": 0.5}}}, tmp_path)
    assert json.loads((tmp_path / "results.json").read_text())["metrics"]["pareto"]["forget_acc"] == 0.5


def test_the_divergence_guard_reads_a_flag_every_few_steps_and_names_the_first_bad_loss():
    """On a GPU the guard folds each step's loss into a flag on the device and reads it every `every` steps
    (a read makes the host wait for the device); here with CPU tensors and every=3."""
    from types import SimpleNamespace

    from ttp_lightning.fit.callbacks import FiniteGuard

    guard, trainer = FiniteGuard("pretraining", "pretrain", 0.1, every=3), SimpleNamespace(current_epoch=1)
    guard.on_train_batch_end(trainer, None, torch.tensor(1.0), None, 0)
    guard.on_train_batch_end(trainer, None, {"loss": torch.tensor(float("inf"))}, None, 1)  # not read yet
    with pytest.raises(TTPUserError, match=r"pretraining diverged at epoch 2: the training loss is inf; .*"
                                           r"Lower pretrain.lr \(now 0.1\)"):
        guard.on_train_batch_end(trainer, None, torch.tensor(float("nan")), None, 2)  # the first bad one named
    guard = FiniteGuard("pretraining", "pretrain", 0.1, every=50)
    guard.on_train_batch_end(trainer, None, torch.tensor(float("nan")), None, 0)
    with pytest.raises(TTPUserError, match="the training loss is nan"):  # the epoch's end reads what is left
        guard.on_train_epoch_end(trainer, torch.nn.Linear(1, 1))
    guard = FiniteGuard("pretraining", "pretrain", 0.1)  # every step on the CPU by default
    with pytest.raises(TTPUserError, match="the training loss is -inf"):
        guard.on_train_batch_end(trainer, None, torch.tensor(float("-inf")), None, 0)
    for step in range(5):
        guard.on_train_batch_end(trainer, None, torch.tensor(0.5), None, step)  # finite: nothing raised


@pytest.mark.parametrize("mode", ["minibatch", "fullbatch"])
def test_divergence_stops_the_run_and_releases_nothing(run_job, tmp_path, mode):
    proc, results = run_job("method.lr=1e30", f"method.mode={mode}", "attacks.enabled=false")
    assert proc.returncode == 2 and results is None
    last = proc.stderr.strip().splitlines()[-1]
    assert re.match(r"error: method pareto diverged at epoch \d+: ", last) and "Lower method.lr (now 1e+30)" in last
    assert not [name for name in ("results.json", "release", "release_not_protected")
                if (tmp_path / "out" / name).exists()]


def test_sigterm_exits_143_with_one_line_naming_the_checkpoint_and_no_results(tmp_path):
    cache, out = tmp_path / "cache", tmp_path / "out"
    env = dict(os.environ, TTP_CACHE_DIR=str(cache), WANDB_MODE="disabled")
    overrides = [o for o in TINY if not o.startswith("method.epochs")] + ["method.epochs=5000",
                                                                           "method.early_stopping.enabled=false"]
    proc = subprocess.Popen([sys.executable, "-m", "ttp_lightning", *overrides, f"hydra.run.dir={out}"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(cache.glob("checkpoints/*_alg1/last.ckpt")) and time.monotonic() < deadline:  # Alg 1 runs
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM
    last = stderr.strip().splitlines()[-1]
    assert re.match(r"error: received SIGTERM; the run stopped before writing its results \(rerun the same command "
                    r"to resume from the checkpoint after epoch \d+ in .*_alg1\)$", last), last
    assert list(cache.glob("checkpoints/*_alg1/last.ckpt"))
    assert not [name for name in ("results.json", "release", "release_not_protected") if (out / name).exists()]


def test_console_script_starts_from_any_folder(tmp_path):
    script = Path(sys.executable).parent / "ttp-lightning"
    if not script.exists():
        pytest.skip("console script not installed (pip install -e .)")
    proc = subprocess.run([str(script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: python -m ttp_lightning")


def test_threads_are_shared_by_the_processes_of_a_run(monkeypatch):
    from torch import nn

    from ttp_lightning.fit.training import choose_threads, multiply_accumulates

    before = torch.get_num_threads()
    cores = os.cpu_count() or 1
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        ddp_sim = {"accelerator": "cpu", "devices": 2, "strategy": "ddp"}
        assert choose_threads(OmegaConf.create({"threads": "auto", "trainer": ddp_sim})) == max(1, cores // 2)
        single = {"accelerator": "cpu", "devices": 1, "strategy": "auto"}
        assert choose_threads(OmegaConf.create({"threads": "auto", "trainer": single})) == cores
        small, large = multiply_accumulates(nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), 1, 28), 12_000_000  # MNIST logreg, digits ResNet8
        assert small == 7840
        assert choose_threads(OmegaConf.create({"threads": "auto", "trainer": single}), macs=small) == 1
        assert choose_threads(OmegaConf.create({"threads": "auto", "trainer": single}), macs=large) == cores
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert choose_threads(OmegaConf.create({"threads": "auto", "trainer": single})) == 1
        assert choose_threads(OmegaConf.create({"threads": 3, "trainer": single})) == 3
    finally:
        torch.set_num_threads(before)


def test_sigterm_outside_a_fit_is_handled_here_and_inside_one_left_to_lightning():
    """fit/interrupts.py: this process's handler stops the run on a SIGTERM outside a Lightning fit; inside one it
    does nothing (Lightning's handler, which calls it after its own, stops the fit at the next batch)."""
    from ttp_lightning.fit import interrupts

    stops, previous = [], signal.getsignal(signal.SIGTERM)
    try:
        interrupts.install(lambda: stops.append("stopped"))
        with interrupts.fitting():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        assert stops == []
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert stops == ["stopped"]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_sigterm_before_any_fit_ends_in_one_error_line_and_143(tmp_path):
    """Before this, a SIGTERM while the data loaded (or while attacks ran) ended the process silently."""
    run_dir = tmp_path / "run"
    env = dict(os.environ, TTP_CACHE_DIR=str(tmp_path / "cache"), WANDB_MODE="disabled")
    proc = subprocess.Popen([sys.executable, "-m", "ttp_lightning", *TINY, f"hydra.run.dir={run_dir}"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (run_dir / ".hydra" / "config.yaml").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)  # Hydra writes it after the handler is installed and before the run starts
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("error: received SIGTERM; the run stopped before writing its "
                                                   "results"), err[-2000:]
    assert not (run_dir / "results.json").exists() and not (run_dir / "release").exists()


def test_a_full_disk_while_writing_the_outputs_leaves_nothing_half_made(run_main, tmp_path, monkeypatch):
    """Issue 26: the weights and the release were written, then results.json hit a full disk: one error line,
    exit 2, and none of this run's outputs left (a model.pt without results.json was left before)."""
    import errno

    from ttp_lightning.run import pipeline

    def full(results, output_dir):
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(output_dir) / "results.json"))

    monkeypatch.setattr(pipeline, "write_results", full)
    code, _, err, results = run_main("attacks.enabled=false")
    assert code == 2 and results is None
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: writing the run's outputs into") and \
        "No space left on device" in lines[0]
    out = tmp_path / "out"
    assert not [p.name for p in out.iterdir() if p.name in pipeline.OUTPUTS]


def test_files_a_run_publishes_are_readable_by_others_as_its_siblings_are(run_main, tmp_path):
    code, _, err, results = run_main("attacks.enabled=false")
    assert code in (0, 4), err
    release = tmp_path / "out" / results["release_gate"]["folder"]
    modes = {p.name: p.stat().st_mode & 0o777 for p in release.iterdir()}
    assert len(set(modes.values())) == 1, modes  # model.safetensors was 0600 beside 0644 files


def test_a_sigterm_inside_a_fit_stops_the_long_loops_of_one_certified_step():
    """Issue 59, minor: SIGTERM during the certified solve ran about 15 more minutes (Lightning stops a fit between
    batches, and one Newton step is one batch). Inside a fit the handler now asks for a stop, and the solver's
    Newton and CG iterations, the estimator's chains, Lanczos and every pass over the data raise at their next
    iteration; the next fit starts with no stop asked for."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from ttp_lightning.certified.maths import hvp, spectrum
    from ttp_lightning.certified.maths.linear_head import _preconditioned_cg
    from ttp_lightning.core import stopping
    from ttp_lightning.core.batching import ImageBatchDataset
    from ttp_lightning.fit import interrupts

    previous = signal.getsignal(signal.SIGTERM)
    try:
        interrupts.install(lambda: None)
        with interrupts.fitting():
            assert not stopping.requested()
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            assert stopping.requested()
            vector = torch.ones(4, dtype=torch.float64)
            with pytest.raises(SIGTERMException):
                _preconditioned_cg(lambda v: v, vector, lambda v: v, 1e-12, 100)
            with pytest.raises(SIGTERMException):
                spectrum.lanczos_tridiagonal(lambda v: v, vector, 3)
            with pytest.raises(SIGTERMException):
                next(hvp.chunks(
                    ImageBatchDataset(torch.zeros(2, 1, 2, 2), torch.zeros(2, dtype=torch.long)), 1,
                    torch.device("cpu"), torch.float64))
        with interrupts.fitting():
            assert not stopping.requested()  # a new fit, no stop asked for
    finally:
        stopping.clear()
        signal.signal(signal.SIGTERM, previous)


def test_sigterm_during_a_slow_certified_solve_ends_within_seconds(tmp_path):
    """End to end: the certified exact step's solver made slow (each evaluation of the objective takes 0.5 s, as on
    a large data set); SIGTERM once the solve runs ends the process with 143 and the one line within seconds."""
    marker = tmp_path / "solving"
    script = f"""
import sys, time
from pathlib import Path
from ttp_lightning.certified.maths import linear_head
real = linear_head.LinearHeadObjective.evaluate
def slow(self, weights):
    Path({str(marker)!r}).touch()
    time.sleep(0.5)
    return real(self, weights)
linear_head.LinearHeadObjective.evaluate = slow
from ttp_lightning.__main__ import main
sys.argv = ["ttp_lightning", *sys.argv[1:]]
main()
"""
    from conftest import TINY_WITHOUT_METHOD

    env = dict(os.environ, TTP_CACHE_DIR=str(tmp_path / "cache"), WANDB_MODE="disabled")
    proc = subprocess.Popen([sys.executable, "-c", script, *TINY_WITHOUT_METHOD, "model=logreg",
                             "pretrain.norm_bound=10", "attacks.enabled=false", "method=certified_exact",
                             f"hydra.run.dir={tmp_path / 'out'}"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()[1][-2000:]
    time.sleep(1.0)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert time.monotonic() - sent < 10, time.monotonic() - sent
    assert err.strip().splitlines()[-1].startswith("error: received SIGTERM"), err[-2000:]
    assert not (tmp_path / "out" / "results.json").exists()
