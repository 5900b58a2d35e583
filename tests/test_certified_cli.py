"""Algs 2-4 from the command line on digits + LogReg, and the verify command on good and tampered releases."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO, TINY_WITHOUT_METHOD

COMMON = ["model=logreg", "pretrain.norm_bound=10", "method.lam=0.5", "method.sigma=0.001"]
ESTIMATOR = ["method.depth=100", "method.repeats=30", "method.sample_size=32"]
RELEASES = {
    "certified_exact": COMMON + ["method=certified_exact", "method.warmup_epochs=5"],
    "certified_lissa": COMMON + ESTIMATOR + ["method=certified_lissa", "method.warmup_epochs=5",
                                             "method.compare_exact=true"],
    "certified_online": COMMON + ESTIMATOR + ["method=certified_online", "data.forget.requests=[8,12]"],
}
ALGORITHMS = {"certified_exact": "alg2_exact_newton", "certified_lissa": "alg3_hessian_estimator",
              "certified_online": "alg4_online"}


def verify(*args):
    return subprocess.run([sys.executable, "-m", "ttp_lightning.verify", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module", params=list(RELEASES))
def release(request, tmp_path_factory):
    """One certified run per algorithm, shared by the tests below (its output folder)."""
    out = tmp_path_factory.mktemp(request.param)
    env = dict(os.environ, TTP_CACHE_DIR=str(out / "cache"), WANDB_MODE="disabled")
    proc = subprocess.run([sys.executable, "-m", "ttp_lightning", *TINY_WITHOUT_METHOD, *RELEASES[request.param],
                           f"hydra.run.dir={out}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_certified_run_writes_weights_certificate_and_results(release):
    results = json.loads((release / "results.json").read_text())
    cert = json.loads((release / "certificate.json").read_text())
    method = results["method"]
    metrics = results["metrics"][method]
    assert results["certificate"] == cert and cert["algorithm"] == ALGORITHMS[method]
    assert cert["sigma"] == 0.001 and cert["sigma_source"] == "config" and cert["epsilon"] > 1
    assert cert["mechanism"] == "analytic_gaussian"
    assert metrics["forget_conf_dist"] < results["metrics"]["pretrain"]["forget_conf_dist"]
    assert cert["metrics"]["forget_conf_dist"] == metrics["forget_conf_dist"]
    if method == "certified_exact":
        assert cert["sensitivity"] == pytest.approx(2 * 10 * (10 + 0.5) / 0.5)
        assert metrics["newton_residual"] < 1e-8 and len(results["history"][method]) == 5
        return
    # the estimator bound exceeds Alg 2's by the G / (lambda + lambda_min) term and the concentration term
    assert cert["sensitivity"] > 2 * 10 * (10 + 0.5) / 0.5 + cert["gradient_bound"] / 0.5
    assert cert["depth"] == 100 and cert["repeats"] == 30 and cert["num_params"] == 650
    if method == "certified_lissa":
        assert metrics["newton_residual"] < 0.25 and metrics["direction_vs_exact"] < 0.15
        assert cert["forget_sizes"] == [20]
        assert metrics["scale_J"] == pytest.approx(1.2 * (metrics["hessian_norm_estimate"] + 0.5))  # lambda 0.5
    else:  # two requests: the second step sees both, the noise is calibrated to Delta / k
        rows = results["history"][method]
        assert [r["forget_size"] for r in rows] == [8, 20] and cert["forget_sizes"] == [8, 20]
        assert rows[0]["retain_size"] - rows[1]["retain_size"] == 12 and results["data"]["forget_size"] == 20
        assert metrics["newton_residual"] == max(r["newton_residual"] for r in rows) < 0.5


def test_verify_passes_on_the_release_and_recomputes_metrics(release):
    proc = verify(release / "certificate.json", release / "model.pt", "--recompute", "data.max_test_size=100")
    assert proc.returncode == 0 and proc.stdout.startswith("verified: alg"), proc.stdout + proc.stderr


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


@pytest.mark.parametrize("overrides, message", [
    (["method=certified_online"], "needs data.forget.requests"),
    (["method=certified_online", "data.forget.requests=[5]", "method.warmup_epochs=3"], r"starts from A\(D\)"),
    (["method=certified_lissa", "method.depth=0"], "method.depth=0 is not allowed"),
    (["method=certified_lissa", "method.rho=1.5"], r"method.rho=1.5 is not allowed; choose a value in \(0, 1\)"),
    (["method=certified_lissa", "method.lam=-1"], "method.lam=-1 is not allowed"),
    (["method=certified_lissa", "method.lam=0.1", "method.lam_min=-0.2"], r"lambda \+ lambda_min must be > 0"),
    (["method=certified_exact", "method.batchnorm_stats=train"], "method.batchnorm_stats='train'"),
])
def test_certified_options_are_validated(compose_cfg, overrides, message):
    from ttp_lightning.errors import TTPUserError
    from ttp_lightning.methods import METHODS
    from ttp_lightning.validation import validate_config

    cfg = compose_cfg("model=logreg", "pretrain.norm_bound=10", *overrides, tiny=False)
    with pytest.raises(TTPUserError, match=message):
        validate_config(cfg, METHODS)


def test_lam_auto_is_the_lipschitz_mixture(compose_cfg):
    from ttp_lightning.methods.certified.common import resolve_lam

    cfg = compose_cfg("method=certified_lissa", "method.lam=auto", "method.theta=0.8",
                      "method.grad_lipschitz_forget=2", "method.grad_lipschitz_retain=0.5", tiny=False)
    assert resolve_lam(cfg.method) == pytest.approx(0.8 * 2 + 0.2 * 0.5)
