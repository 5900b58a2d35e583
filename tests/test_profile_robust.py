"""scripts/profile_robust.py (issue 79): one job with a timer on each phase; each phase is timed where it
runs, inside its parent, and the table's shares add up to the whole run."""

import json
import os
import subprocess
import sys

from conftest import REPO


def test_the_profile_times_every_phase_of_a_tiny_robust_run_inside_its_parent(tmp_path):
    out = tmp_path / "profile.json"
    job = ["method=pareto_robust", "method.epochs=2", "data.forget.size=10", "pretrain.epochs=2", "attacks.gammas=[8]",
           "attacks.apgd_steps=5", "attacks.restarts=1", "attacks.relearn.enabled=false", "logger=none",
           f"hydra.run.dir={tmp_path / 'run'}"]
    env = {**os.environ, "TTP_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "scripts/profile_robust.py", "--out", str(out), "--", *job], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["overrides"] == job and report["exit"] in (0, 4)
    rows = {row["phase"]: row for row in report["phases"]}
    for phase in ("pretraining", "Alg 1 fit", "training steps", "inner attack", "validation", "screening attack",
                  "assessment"):
        assert phase in rows, (phase, sorted(rows))
    assert rows["inner attack"]["calls"] > 0 and rows["training steps"]["calls"] >= rows["inner attack"]["calls"]
    assert rows["inner attack"]["seconds"] <= rows["training steps"]["seconds"] <= rows["Alg 1 fit"]["seconds"]
    top = sum(rows[name]["seconds"] for name in ("pretraining", "Alg 1 fit", "assessment"))
    assert top <= report["wall_s"] + 0.5
    assert "where the time went" in proc.stdout and "the whole run" in proc.stdout
