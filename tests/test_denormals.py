"""performance.flush_denormals: the run's CPU arithmetic flushes subnormal floats to zero while it lasts, and
only then (robust Alg 1 on the letters stand-in spent 8-16 s an epoch on them instead of 1.4)."""

import pytest
import torch

from ttp_lightning.fit.training import denormals_flushed

SUBNORMAL = 1e-39  # below float32's smallest normal number, 1.18e-38


def _survives() -> bool:
    """Whether a float32 subnormal survives an operation in this thread's current mode."""
    return bool((torch.full((4,), SUBNORMAL, dtype=torch.float32) * 1.0).ne(0).all())


def test_subnormals_are_flushed_inside_the_block_and_kept_after_it():
    assert _survives()  # IEEE gradual underflow, torch's default
    with denormals_flushed(True) as flushed:
        if not flushed:
            pytest.skip("this CPU has no flush-to-zero switch torch can set")
        assert not _survives()
    assert _survives()


def test_the_mode_is_restored_when_the_block_fails():
    with pytest.raises(RuntimeError), denormals_flushed(True):
        raise RuntimeError("a fault inside the run")
    assert _survives()


def test_off_changes_nothing():
    with denormals_flushed(False) as flushed:
        assert flushed is False and _survives()


def test_a_value_that_is_not_a_boolean_is_refused_before_anything_runs(run_job):
    job, results = run_job("performance.flush_denormals=sometimes")
    assert job.returncode == 2 and results is None
    line = job.stderr.strip()
    assert line.startswith("error:") and "\n" not in line
    assert "performance.flush_denormals=sometimes" in line and "not a valid bool" in line


def test_worker_threads_started_inside_the_block_flush_too():
    """A fresh process whose first parallel operation runs inside the block: both intra-op threads flush (a
    worker started before the block would keep gradual underflow, which is why run() enters it first)."""
    import subprocess
    import sys

    script = ("import torch\nfrom ttp_lightning.fit.training import denormals_flushed\ntorch.set_num_threads(2)\n"
              "with denormals_flushed(True) as flushed:\n"
              "    kept = int((torch.full((4_000_000,), 1e-39) * 1.0).ne(0).sum())\n"
              "print(flushed, kept)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    if out[0] != "True":
        pytest.skip("this CPU has no flush-to-zero switch torch can set")
    assert out[1] == "0"
