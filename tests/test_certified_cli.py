"""Alg 2 from the command line on digits + LogReg, and the verify command on good and tampered releases."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO, TINY_WITHOUT_METHOD

CERTIFIED = ["model=logreg", "method=certified_exact", "pretrain.norm_bound=10", "method.lam=0.5",
             "method.sigma=0.001", "method.warmup_epochs=5"]


def verify(*args):
    return subprocess.run([sys.executable, "-m", "ttp_lightning.verify", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """One certified run shared by the tests below (its output folder)."""
    out = tmp_path_factory.mktemp("certified")
    env = dict(os.environ, TTP_CACHE_DIR=str(out / "cache"), WANDB_MODE="disabled")
    proc = subprocess.run([sys.executable, "-m", "ttp_lightning", *TINY_WITHOUT_METHOD, *CERTIFIED, f"hydra.run.dir={out}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_certified_run_writes_weights_certificate_and_results(release):
    results = json.loads((release / "results.json").read_text())
    cert = json.loads((release / "certificate.json").read_text())
    metrics = results["metrics"]["certified_exact"]
    assert results["certificate"] == cert
    assert cert["sigma"] == 0.001 and cert["sigma_source"] == "config" and cert["epsilon"] > 1
    assert cert["mechanism"] == "analytic_gaussian"
    assert cert["sensitivity"] == pytest.approx(2 * 10 * (10 + 0.5) / 0.5)
    assert metrics["newton_residual"] < 1e-8 and len(results["history"]["certified_exact"]) == 5
    assert metrics["forget_conf_dist"] < results["metrics"]["pretrain"]["forget_conf_dist"]
    assert cert["metrics"]["forget_conf_dist"] == metrics["forget_conf_dist"]


def test_verify_passes_on_the_release_and_recomputes_metrics(release):
    proc = verify(release / "certificate.json", release / "model.pt", "--recompute", "data.max_test_size=100")
    assert proc.returncode == 0 and proc.stdout.startswith("verified: alg2_exact_newton"), proc.stdout + proc.stderr


def test_verify_fails_on_one_changed_weight(release, tmp_path):
    state = torch.load(release / "model.pt")
    key = next(k for k in state if k.endswith("weight"))
    state[key][0, 0] += 1e-3
    torch.save(state, tmp_path / "tampered.pt")
    proc = verify(release / "certificate.json", tmp_path / "tampered.pt")
    assert proc.returncode == 1 and "FAIL: weights SHA-256" in proc.stdout


def test_verify_fails_when_sigma_is_below_what_the_budget_requires(release, tmp_path):
    cert = json.loads((release / "certificate.json").read_text())
    cert["sigma"] *= 0.5
    (tmp_path / "cert.json").write_text(json.dumps(cert))
    proc = verify(tmp_path / "cert.json", release / "model.pt")
    assert proc.returncode == 1 and "FAIL: sigma=" in proc.stdout and "smaller than" in proc.stdout
    cert = json.loads((release / "certificate.json").read_text())
    cert["sensitivity"] /= 10  # a Delta the stated constants do not give
    (tmp_path / "cert.json").write_text(json.dumps(cert))
    proc = verify(tmp_path / "cert.json", release / "model.pt")
    assert proc.returncode == 1 and "FAIL: Delta recomputed" in proc.stdout


def test_certified_bad_input(run_cli):
    proc, results = run_cli("model=logreg", "method=certified_exact", tiny=False)
    assert proc.returncode == 2 and "needs pretrain.norm_bound" in proc.stderr and results is None
    proc, _ = run_cli("model=logreg", "method=certified_exact", "pretrain.norm_bound=10", "method.theta=1",
                      tiny=False)
    assert proc.returncode == 2 and "choose a value in (0, 1)" in proc.stderr
    proc, _ = run_cli("model=resnet18", "method=certified_exact", "pretrain.norm_bound=10", "pretrain.epochs=1",
                      "data.max_train_size=200", tiny=False)
    assert proc.returncode == 2 and "more than method.max_exact_params=20,000" in proc.stderr
