"""`make bench-gpu` runs on a machine without a GPU at tiny sizes: the same code, every measurement, and the
pipeline runs of each speed setting."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.slow  # about 2 minutes of CPU for a benchmark script's smoke test: in `make test-slow`
def test_bench_gpu_runs_tiny_on_cpu_and_projects_the_cifar100_resnet50_experiment(tmp_path):
    out = tmp_path / "gpu.json"
    settings = ["fp32", "bf16", "bf16+data_on_device", "bf16+data_on_device+benchmark", "fp32_seed1"]  # not compile
    proc = subprocess.run([sys.executable, "scripts/bench_gpu.py", "--out", str(out), "--settings", *settings],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["tiny"] is True
    rows = {(row["model"], row["precision"]): row for row in report["training"]}
    assert set(rows) == {(m, p) for m in ("resnet18", "resnet50", "vit_s_16") for p in ("32", "bf16-mixed")}
    for row in rows.values():
        assert row["pretrain_images_per_s"] > 0 and row["eval_images_per_s"] > 0 and row["alg1_over_erm"] > 0
    assert all(row["hvp_over_gradient"] > 1 for row in report["curvature"])  # an HVP costs more than a gradient
    projection = report["cifar100_resnet50_projection"]
    assert projection["pretrain_epochs"] == 200 and projection["total_hours"] > projection["pretrain_hours"] > 0
    assert "projected +experiment=cifar100_resnet50" in proc.stdout
    pipeline = report["pipeline"]  # the CLI itself under each speed setting, on CIFAR10-shaped files
    rows = {row["setting"]: row for row in pipeline["rows"]}
    assert list(rows) == settings
    spread = {key: abs(rows["fp32_seed1"][key] - rows["fp32"][key]) for key in ("test_acc", "forget_conf_dist")}
    assert all(pipeline["keeps_numbers_within"][key] >= max(spread[key], limit)  # the larger: noise or the limit
               for key, limit in (("test_acc", 0.01), ("forget_conf_dist", 0.02)))
    assert all(row["pretrain_images_per_s"] > 0 and row["alg1_images_per_s"] > 0 for row in rows.values())
    assert rows["fp32"]["pretrain_speedup"] == 1.0 and rows["fp32"]["keeps_numbers"] is True
    assert rows[pipeline["fastest_keeping_numbers"]]["keeps_numbers"] and pipeline["fastest_keeping_numbers"] != "fp32_seed1"
    assert f"fastest setting that keeps fp32's numbers: {pipeline['fastest_keeping_numbers']}" in proc.stdout
