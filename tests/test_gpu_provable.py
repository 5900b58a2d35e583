"""scripts/gpu_provable.py (issue 80, item 4) runs the CIFAR-10 provable recipe tiny on a machine without a GPU:
the same command line, a results.json read, one JSON with every stage's numbers."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.slow  # a CIFAR-shaped run of the whole pipeline on the CPU: in `make test-slow`
def test_gpu_provable_runs_tiny_on_cpu_and_reports_what_the_run_wrote(tmp_path):
    out = tmp_path / "provable.json"
    proc = subprocess.run([sys.executable, "scripts/gpu_provable.py", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=900, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["tiny"] is True and report["synthetic"] is True and report["exit"] in (0, 4)
    assert "+experiment=cifar10_resnet8_provable" in report["command"]
    pretrain, release = report["stages"]["pretrain"], report["stages"]["pareto_robust"]
    assert 0 <= pretrain["test_acc"] <= 1 and 0 <= release["test_acc"] <= 1 and pretrain["wall_s"] > 0
    assert release["forget_proven_share_10"] is not None and report["attacks"]
    assert report["release"] is not None and report["wall_s"] > 0
