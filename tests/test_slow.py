"""Longer runs (deselected by `make test`; `make test-slow` runs them)."""

import json
import subprocess
import sys

import pytest

from conftest import MNIST_ROOT, REPO, finished, needs_mnist, release_of

pytestmark = pytest.mark.slow


def test_default_job_meets_its_targets(run_cli):
    """`make run`: forget CD down at least 5x, test accuracy at most 2 points lower (digits' test set has 539
    images, 0.19 points each; the retain rule read on 248 retain images withheld from D keeps an epoch at
    98.14 -> 96.66 %, where the paper's rule, on the images trained on, lost 11 images: 96.10 %)."""
    proc, results = run_cli("logger=none", "trainer.enable_progress_bar=false", tiny=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    pre, alg1 = results["metrics"]["pretrain"], results["metrics"]["pareto"]
    assert alg1["forget_conf_dist"] * 5 <= pre["forget_conf_dist"]
    assert alg1["test_acc"] >= pre["test_acc"] - 0.02


@pytest.mark.parametrize("mode", ["minibatch", "fullbatch"])
def test_ddp_sim_two_processes_run_the_default_job(run_cli, mode):
    proc, results = run_cli("trainer=ddp_sim", f"method.mode={mode}", "method.epochs=40",
                            "method.gradient_surgery=true", "method.forget_temperature=2")
    finished(proc.returncode, results, proc.stderr)
    assert "Starting with 2 processes" in proc.stdout + proc.stderr
    pre, alg1 = results["metrics"]["pretrain"], results["metrics"]["pareto"]
    assert alg1["forget_conf_dist"] * 3 < pre["forget_conf_dist"] and alg1["test_acc"] > 0.85
    assert len(results["history"]["pareto"]) == 40


@pytest.mark.parametrize("mode", ["minibatch", "fullbatch"])
def test_ddp_sim_two_processes_run_robust_alg1(run_cli, mode):
    proc, results = run_cli("trainer=ddp_sim", "method=pareto_robust", f"method.mode={mode}", "method.epochs=6",
                            "attacks.gammas=[8]", "attacks.restarts=1", "attacks.apgd_steps=20")
    finished(proc.returncode, results, proc.stderr)
    assert "Starting with 2 processes" in proc.stdout + proc.stderr
    history = results["history"]["pareto_robust"]
    assert len(history) == 6 and all(0 <= row["forget_robust_conf_dist"] <= 1 for row in history)
    robust = results["metrics"]["pareto_robust"]
    kept = history[robust["best_epoch"] - 1]
    if robust["constraint_met"]:  # among the epochs that meet both thresholds, the lowest proven rank
        from ttp_lightning.alg1.method import proven_rank

        qualifying = [row for row in history if row["forget_worst_conf_dist"] < 0.1
                      and row["retain_acc"] >= robust["retain_acc_threshold"] - 1e-6]
        rank = (lambda row: proven_rank({f"val/{key}": value for key, value in row.items()}))
        assert rank(kept) == min(rank(row) for row in qualifying)
    else:  # none does (6 fullbatch epochs): the Pareto fallback, retain accuracy against the attacked forget CD
        assert kept == max(history, key=lambda row: row["retain_acc"] - row["forget_robust_conf_dist"])


@needs_mnist
def test_mnist_mlp_matches_the_paper_row_and_the_gate_judges_every_image(run_cli):
    """Paper, MNIST MLP, theta 0.75: retain 97.5 %, test 95.7 %, CD 0.037 (a mean). The gate judges each image:
    released (exit 0) only when every one is at CD <= 0.1 (with the held-out slice withheld from D every image
    reached 0.011 on 2026-12-04; A(D) trained on all 60,000 images left four fully confident, exit 4), and an
    attacker within 8/255 makes nearly all confident again, which the console says the gate did not require."""
    proc, results = run_cli("+experiment=mnist_mlp", f"data.root={MNIST_ROOT}", "logger=none",
                            "trainer.enable_progress_bar=false", tiny=False)
    finished(proc.returncode, results, proc.stderr)
    alg1 = results["metrics"]["pareto"]
    assert alg1["forget_conf_dist"] <= 0.05 and alg1["test_acc"] >= 0.95
    assert proc.returncode == (0 if alg1["forget_exposed"] == 0 else 4) == (0 if results["release_gate"]["passed"]
                                                                            else 4)
    assert alg1["forget_robust_exposed"] >= 90 and "not met within 8/255" in proc.stdout


def unprotected(results: dict) -> list[str]:
    """verify's flag for a release whose gate failed (issue 39: the certified MNIST releases keep forget images
    above 0.1), whose certificate is checked all the same."""
    return [] if results["release_gate"]["passed"] else ["--allow-unprotected"]


# the paper's row under the residual bound: its mean uniformity term, theta 0.25 and C 10 (the experiment's
# defaults protect every image instead: the test below)
PAPER_ROW = ("method.forget_reduction=mean", "method.forget_reduction_temperature=null", "method.theta=0.25",
             "pretrain.norm_bound=10")


@needs_mnist
def test_mnist_logreg_certified_protects_every_image_at_epsilon_1(run_cli, tmp_path):
    """Issue 39: the experiment's defaults (CVaR forget term, theta 0.6, C 100) release an (epsilon 1, delta 1e-5)
    certified LogReg with every forget image at CD <= 0.1 (exit 0), test accuracy >= 85 % and test CD >= 0.30,
    and its certificate verifies, the release reproduced from the audit record."""
    proc, results = run_cli("+experiment=mnist_logreg_certified", f"data.root={MNIST_ROOT}", "logger=none",
                            "trainer.enable_progress_bar=false", "attacks.enabled=false", tiny=False)
    finished(proc.returncode, results, proc.stderr)
    alg2 = results["metrics"]["certified_exact"]
    assert proc.returncode == 0 and results["release_gate"]["passed"]
    assert alg2["forget_worst_conf_dist"] <= 0.1 and alg2["test_acc"] >= 0.85 and alg2["test_conf_dist"] >= 0.30
    assert results["certificate"]["epsilon"] == 1.0 and not alg2["vacuous"]
    out = tmp_path / "out"
    check = subprocess.run([sys.executable, "-m", "ttp_lightning.verify", release_of(out), "--recompute", "--audit",
                            out / "private" / "audit.json", f"data.root={MNIST_ROOT}"],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0 and "release reproduced from the audit record" in check.stdout, check.stdout


@needs_mnist
def test_mnist_logreg_certified_meets_the_paper_row_at_epsilon_1(run_cli, tmp_path):
    """Issue 25: the residual certificate at epsilon 1 (verify exit 0, not vacuous) with the paper's Cert. LogReg
    numbers (test 87.2 %, forget CD 0.280) while the model stays confident elsewhere (test CD >= 0.30); the
    release is reproduced from its private audit record."""
    proc, results = run_cli("+experiment=mnist_logreg_certified", f"data.root={MNIST_ROOT}", "logger=none",
                            "trainer.enable_progress_bar=false", "attacks.enabled=false", *PAPER_ROW, tiny=False)
    finished(proc.returncode, results, proc.stderr)
    alg2 = results["metrics"]["certified_exact"]
    assert alg2["forget_conf_dist"] <= 0.280 and alg2["test_acc"] >= 0.872 and alg2["test_conf_dist"] >= 0.30
    assert results["certificate"]["epsilon"] == 1.0 and not alg2["vacuous"] and results["certificate"]["mu"] == 1e-4
    out = tmp_path / "out"
    check = subprocess.run([sys.executable, "-m", "ttp_lightning.verify", release_of(out), "--recompute", "--audit",
                            out / "private" / "audit.json", f"data.root={MNIST_ROOT}", *unprotected(results)],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0 and "release reproduced from the audit record" in check.stdout, check.stdout


@needs_mnist
def test_mnist_logreg_certified_paper_meets_the_paper_row_and_verifies_as_vacuous(run_cli, tmp_path):
    """Paper, Alg 2, MNIST LogReg, theta 0.75, sigma 1e-3 with the paper's bound (capped at 2C): test 87.2 %,
    CD 0.280; its epsilon is vacuous, and the release is reproduced from its private audit record."""
    proc, results = run_cli("+experiment=mnist_logreg_certified_paper", f"data.root={MNIST_ROOT}", "logger=none",
                            "trainer.enable_progress_bar=false", tiny=False)
    finished(proc.returncode, results, proc.stderr)
    alg2 = results["metrics"]["certified_exact"]
    assert alg2["forget_conf_dist"] <= 0.30 and alg2["test_acc"] >= 0.87 and alg2["vacuous"]
    assert results["certificate"]["lam_min"] < 0 < results["certificate"]["lam"] - results["certificate"]["hessian_norm"]
    assert results["certificate"]["sensitivity"] == 2 * 10 < results["certificate"]["sensitivity_formula"]
    out = tmp_path / "out"
    check = subprocess.run([sys.executable, "-m", "ttp_lightning.verify", release_of(out), "--recompute", "--audit",
                            out / "private" / "audit.json", f"data.root={MNIST_ROOT}", *unprotected(results)],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 3 and "VACUOUS" in check.stdout, check.stdout + check.stderr
    assert "release reproduced from the audit record" in check.stdout


@needs_mnist
def test_mnist_mlp_certified_last_layer_keeps_the_mlp_accuracy(run_cli, tmp_path):
    """Issue 25: a last-layer certified MNIST MLP at epsilon 1 keeps >= 95 % test accuracy and verifies."""
    proc, results = run_cli("+experiment=mnist_mlp_certified_last", f"data.root={MNIST_ROOT}", "logger=none",
                            "trainer.enable_progress_bar=false", "attacks.enabled=false", tiny=False)
    finished(proc.returncode, results, proc.stderr)
    metrics = results["metrics"]["certified_exact"]
    assert metrics["test_acc"] >= 0.95 and results["certificate"]["layers"] == "last"
    assert results["certificate"]["epsilon"] == 1.0 and len(results["certificate"]["parameter_names"]) == 2
    out = tmp_path / "out"
    check = subprocess.run([sys.executable, "-m", "ttp_lightning.verify", release_of(out), "--audit",
                            out / "private" / "audit.json", f"data.root={MNIST_ROOT}", *unprotected(results)],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0 and "final layer only" in check.stdout, check.stdout + check.stderr


@needs_mnist
def test_mnist_logreg_alg3_matches_alg2(run_cli):
    """Alg 3 on the Alg 2 setting: residual <= 0.05 and direction within 5 % of the Cholesky solve."""
    proc, results = run_cli("+experiment=mnist_logreg_certified_lissa", f"data.root={MNIST_ROOT}", "logger=none",
                            "trainer.enable_progress_bar=false", tiny=False)
    finished(proc.returncode, results, proc.stderr)
    alg3 = results["metrics"]["certified_lissa"]
    assert alg3["newton_residual"] <= 0.05 and alg3["direction_vs_exact"] <= 0.05
    assert alg3["forget_conf_dist"] <= 0.30 and alg3["test_acc"] >= 0.87
    assert results["certificate"]["algorithm"] == "alg3_hessian_estimator"


def test_fault_injection_script_reports_every_case_as_expected(tmp_path):
    """scripts/faults.py: kills, signals, SLURM requeue, divergence, corrupt caches and checkpoints, concurrent
    jobs, read-only output, hostile inputs, tampered caches, checkpoints and releases, image files decoded or
    refused, refused settings, and robust Alg 1 and a certified run killed and resumed bit for bit each end as the
    fault table of docs/faults.md says."""
    out = tmp_path / "faults.json"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "faults.py"), "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=3600, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    cases = json.loads(out.read_text())["cases"]
    assert len(cases) >= 65 and all(case["ok"] for case in cases)  # 66, one skipped where a GPU is
