"""Algs 2-4 from the command line on digits + LogReg, then the release attacked and audited: the noise cannot
be stripped from public files, verify runs no code from a hostile certificate, its verdicts, and the
reproduction of a release from its private audit record."""

import json
import os
import pickle
import stat
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import REPO, TINY_WITHOUT_METHOD, finished, release_of
from ttp_lightning import load_released
from ttp_lightning import verify as verify_module

LOGREG = ["model=logreg", "pretrain.norm_bound=10", "method.lam=auto", "method.grad_lipschitz_forget=2",
          "method.grad_lipschitz_retain=2", "attacks.enabled=false"]
ESTIMATOR = ["method.depth=100", "method.repeats=30", "method.sample_size=32"]
PAPER = ["method.bound=paper", "method.uniformity=square"]  # the paper's Newton step and bound
RESIDUAL = ["model=logreg", "pretrain.norm_bound=10", "attacks.enabled=false"]  # the defaults: residual, reverse KL
RELEASES = {
    # the residual bound (default): M_theta(D) + noise at epsilon 0.01, a meaningful model
    "certified_exact": RESIDUAL + ["method=certified_exact", "method.epsilon=0.01"],
    # the paper's bound at epsilon 1: capped at 2C, a model the noise destroys
    "certified_exact_paper": LOGREG + PAPER + ["method=certified_exact", "method.warmup_epochs=5", "method.epsilon=1"],
    # the paper's sigma = 1e-3: vacuous
    "certified_lissa": LOGREG + PAPER + ESTIMATOR + ["method=certified_lissa", "method.warmup_epochs=5",
                                                     "method.compare_exact=true", "method.sigma=0.001"],
    # two requests, each solved to stationarity and proven by its residual
    "certified_online": RESIDUAL + ["method=certified_online", "data.forget.requests=[8,12]", "method.epsilon=1"],
    # the worst-image term: a smooth maximum of the forget losses (still convex, so mu = lambda)
    "certified_smoothmax": RESIDUAL + ["method=certified_exact", "method.epsilon=1", "method.forget_reduction=smoothmax",
                                       "method.forget_reduction_temperature=0.02"],
}
ALGORITHMS = {"certified_exact": "alg2_exact_newton", "certified_exact_paper": "alg2_exact_newton",
              "certified_lissa": "alg3_hessian_estimator", "certified_online": "alg4_online",
              "certified_smoothmax": "alg2_exact_newton"}
EPSILON = {"certified_exact": 0.01, "certified_exact_paper": 1.0, "certified_online": 1.0, "certified_smoothmax": 1.0}


def run_release(out, cache, *overrides):
    env = dict(os.environ, TTP_CACHE_DIR=str(cache), WANDB_MODE="disabled")
    return subprocess.run([sys.executable, "-m", "ttp_lightning", *TINY_WITHOUT_METHOD, *overrides,
                           f"hydra.run.dir={out}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
                          check=False)


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """released(method) -> the run folder of one certified run per method (run once, shared cache)."""
    cache, runs = tmp_path_factory.mktemp("cache"), {}

    def get(method):
        if method not in runs:
            out = tmp_path_factory.mktemp(method)
            proc = run_release(out, cache, *RELEASES[method])
            results = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else None
            finished(proc.returncode, results, proc.stderr)
            (out / "console.txt").write_text(proc.stdout + proc.stderr)  # what the user saw, scanned below too
            runs[method] = out
        return runs[method]

    get.cache = cache
    return get


def verify(capsys, *args):
    """verify's main() in this process (so any code a certificate smuggled in would run right here)."""
    code = verify_module.main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("method", list(RELEASES))
def test_release_is_public_weights_and_certificate_and_the_seed_stays_private(released, method):
    out = released(method)
    results = json.loads((out / "results.json").read_text())
    cert = json.loads((release_of(out) / "certificate.json").read_text())
    audit = json.loads((out / "private" / "audit.json").read_text())
    assert results["certificate"] == cert and cert["algorithm"] == ALGORITHMS[method]
    expected = {"certificate.json", "config.json", "README.md", "model.safetensors"} | \
        {w["file"] for w in cert["weights"]}
    assert sorted(p.name for p in (release_of(out)).iterdir()) == sorted(expected)
    # the hub files describe the last certified weights, which stay the file the certificate hashes
    hub = json.loads((release_of(out) / "config.json").read_text())["weights"]
    assert cert["weights"][-1]["sha256"] == hub["sha256"] and hub["file"] == "model.safetensors"
    assert hub["prefix"] == "backbone." and "## Certificate" in (release_of(out) / "README.md").read_text()
    released = load_released(release_of(out))
    final = load_file(str(release_of(out) / "model.safetensors"))
    assert all(torch.equal(v, final[f"backbone.{k}"]) for k, v in released.backbone.state_dict().items())
    assert len(cert["weights"]) == (2 if method == "certified_online" else 1)  # Alg 4 releases every request
    assert results["weights_file"] == f"{results['release']['folder']}/{cert['weights'][-1]['file']}"
    assert stat.S_IMODE((out / "private").stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in (out / "private").iterdir())
    # the secret seed appears in no file outside private/, and no config carries a noise seed
    seed = audit["noise_seed"]
    for path in out.rglob("*"):
        if path.is_file() and "private" not in path.parts:
            assert seed not in path.read_bytes().decode("latin-1"), path
    assert "noise_seed" not in json.dumps(results["config"]) and "noise_seed" not in json.dumps(cert)
    assert "_target_" not in json.dumps(cert)
    metrics = results["metrics"][results["method"]]
    assert metrics["vacuous"] == (method == "certified_lissa") and metrics["epsilon"] == cert["epsilon"]
    console = (out / "console.txt").read_text()
    assert "certificate: epsilon=" in console and ("VACUOUS: epsilon > 10" in console) == metrics["vacuous"]
    if method == "certified_lissa":
        assert cert["sigma"] == 0.001 and cert["sigma_source"] == "config" and cert["epsilon"] > 1e8  # Delta = 2C
        assert metrics["forget_conf_dist"] < results["metrics"]["pretrain"]["forget_conf_dist"]
        assert metrics["direction_vs_exact"] < 0.15
    else:
        assert cert["epsilon"] == EPSILON[method] and cert["sigma_source"] == "budget"
    assert cert["releases"] == (2 if method == "certified_online" else 1)


@pytest.mark.parametrize("method", ["certified_exact_paper", "certified_lissa"])
def test_paper_certificate_states_measured_spectrum_and_checked_hypotheses(released, method):
    from ttp_lightning.certified.certificate.arithmetic import recomputed_sensitivity, required_depth, scale_b

    cert = json.loads((release_of(released(method)) / "certificate.json").read_text())
    steps = cert["steps"]
    assert len(steps) == 1 and cert["bound"] == "paper" and cert["mu"] is None
    measured = min(s["lam_min_measured"] for s in steps)
    assert measured < 0  # the square loss is not convex in LogReg weights: lambda_min = 0 would be false
    assert cert["lam_min"] == min(0.0, measured) and cert["lam"] == 2.0 > cert["hessian_norm"]
    assert (cert["sensitivity"], cert["sensitivity_formula"]) == pytest.approx(recomputed_sensitivity(cert))
    assert cert["sensitivity"] == min(cert["sensitivity_formula"], 2 * 10)  # capped at the ball's diameter
    if method == "certified_exact_paper":
        assert steps[0]["spectrum_method"] == "exact_eigvalsh" and steps[0]["residual"] < 1e-8
        assert cert["sensitivity_formula"] == pytest.approx(2 * 10 * (10 + 2) / (2 + measured))
    else:
        assert all(s["spectrum_method"] == "lanczos" and s["depth"] >= required_depth(cert, s) > 1 for s in steps)
        assert all(s["scale"] >= scale_b(cert) for s in steps)
        # the estimator's share is the measured residual's, deterministic: no rho in the certificate
        exact = 2 * 10 * (10 + 2) / (2 + measured)
        share = steps[0]["residual"] * steps[0]["gradient_norm"] / (2 + measured)
        assert cert["sensitivity_formula"] == pytest.approx(exact + share) and "rho" not in cert["estimator"]


@pytest.mark.parametrize("method", ["certified_exact", "certified_online"])
def test_residual_certificate_states_the_stationarity_it_rests_on(released, method):
    from ttp_lightning.certified.certificate.arithmetic import recomputed_sensitivity

    out = released(method)
    results = json.loads((out / "results.json").read_text())
    cert = results["certificate"]
    steps = cert["steps"]
    assert cert["bound"] == "residual" and cert["mu"] == cert["lam"] == 1e-4
    assert cert["mu_rule"] == "convex_losses_linear_logits" and cert["lam_min"] is cert["hessian_norm"] is None
    assert all(s["stationarity"] < 1e-9 and s["weights_norm"] <= 10 for s in steps)
    assert cert["sensitivity"] == pytest.approx(recomputed_sensitivity(cert)[0]) and cert["sensitivity"] < 1e-3
    assert cert["parameter_names"] == ["head.weight", "head.bias"] or len(cert["parameter_names"]) == 2
    if method == "certified_online":
        assert [s["forget_size"] for s in steps] == [8, 20] and steps[0]["retain_size"] - steps[1]["retain_size"] == 12
    # the noise is negligible: the release scores what the noise-free optimum scores
    noise_free, released_scores = results["noise_free"], results["metrics"][results["method"]]
    assert abs(noise_free["test_acc"] - released_scores["test_acc"]) < 0.01
    assert released_scores["test_acc"] > 0.7 and released_scores["test_conf_dist"] > 0.3
    assert "noise-free model (private, for comparison" in (out / "console.txt").read_text()
    assert "noise-free" not in (release_of(out) / "README.md").read_text()  # private scores stay private


def test_a_residual_certificate_that_understates_the_residual_fails_the_audit(released, tmp_path, capsys):
    """A provider (or an edit) that states a smaller residual, with Delta, sigma and epsilon recomputed to match:
    every public check passes, the audit remeasures the residual at the private noise-free weights and fails."""
    from ttp_lightning.certified.certificate.arithmetic import recomputed_sensitivity
    from ttp_lightning.dp.mechanism import implied_epsilon

    out = released("certified_exact")
    release = release_of(out)
    cert = json.loads((release / "certificate.json").read_text())
    step = cert["steps"][0]
    # keep the point on the sphere's inside so the multiplier term vanishes, and claim a 1000x smaller residual
    smaller = dict(step, stationarity=step["stationarity"] / 1000, rounding_floor=step["rounding_floor"] / 1000,
                   multiplier=0.0)
    forged = {**cert, "steps": [smaller]}
    smaller["distance_bound"] = recomputed_sensitivity(forged)[0]
    forged["sensitivity"] = smaller["distance_bound"]
    forged["epsilon"], forged["mechanism"] = implied_epsilon(forged["sensitivity"], cert["sigma"], cert["delta"])
    folder = edited(release, tmp_path, **forged)
    code, text, _ = verify(capsys, folder)
    assert code == 0, text  # self-consistent
    audit_beside(folder, out)
    code, text, _ = verify(capsys, folder, "--audit", folder / "audit.json")
    assert code == 1 and "below the" in text and "remeasured at the noise-free weights" in text, text


@pytest.mark.parametrize("changes, message", [
    ({"mu": -1e-4}, "mu=-0.0001 is outside (0.0, inf)"),
    ({"mu": 0.5}, "mu=0.5 (convex_losses_linear_logits) is not what"),
    ({"mu_rule": "assumption_1"}, "is not what uniformity=reverse_kl"),
    ({"uniformity": "square"}, "is not what uniformity=square"),
    ({"lam": -1.0}, "lam=-1.0 is outside"),
    ({"grad_lipschitz_forget": -2.0}, "grad_lipschitz_forget=-2.0 is outside"),
    ({"hessian_lipschitz_forget": -0.24}, "hessian_lipschitz_forget=-0.24 is outside"),
    ({"lam_min": 0.0}, "bound=residual states lam_min, which only the other bound uses"),
])
def test_a_residual_certificate_with_impossible_or_edited_constants_fails(released, tmp_path, capsys, changes, message):
    code, text, err = verify(capsys, edited(release_of(released("certified_exact")), tmp_path, **changes))
    assert code == 1 and message in text and err == "", text + err


def test_verify_verdicts_on_genuine_releases(released, capsys):
    exact, paper, lissa, online = (release_of(released(m)) for m in
                                   ("certified_exact", "certified_exact_paper", "certified_lissa", "certified_online"))
    code, out, _ = verify(capsys, exact)
    assert code == 0 and out.startswith("verified: alg2_exact_newton") and "guarantee:" in out
    assert "nothing assumed" in out and "residual bound" in out and "lambda_min(H)=" not in out
    code, out, _ = verify(capsys, paper)
    assert code == 1 and out.startswith("FAIL: ") and "is NOT a protected release" in out.splitlines()[0]
    code, out, _ = verify(capsys, paper, "--allow-unprotected")
    assert code == 0 and "the paper's bound for the exact Newton step (Alg 2)" in out and "capped at 2C = 20" in out
    assert "assumed, not measured" in out and "lambda_min(H)=" in out and "conditional on" not in out
    code, out, _ = verify(capsys, lissa / "certificate.json", "--allow-unprotected")
    assert code == 3 and "VACUOUS: epsilon=" in out  # sigma = 1e-3, the paper's: epsilon ~ 1e12
    code, out, _ = verify(capsys, online, "--recompute", "--audit", online.parent / "private" / "audit.json")
    assert code == 0 and "release reproduced from the audit record" in out and "2 release(s)" in out


def test_the_worst_image_term_is_stated_verified_and_audited(released, capsys):
    """A smoothmax release states its reduction and the convex rule it rests on, verifies and reproduces from
    its audit record, and protects the worst forget image at least as well as the mean at the same theta."""
    out = released("certified_smoothmax")
    cert = json.loads((release_of(out) / "certificate.json").read_text())
    assert cert["forget_reduction"] == {"name": "smoothmax", "temperature": 0.02, "fraction": None}
    assert cert["mu_rule"] == "convex_reduction_linear_logits" and cert["mu"] == cert["lam"]
    code, text, _ = verify(capsys, release_of(out), "--audit", out / "private" / "audit.json")
    assert code == 0 and "a smooth maximum at temperature 0.02" in text and "release reproduced" in text, text
    mean = json.loads((released("certified_exact") / "results.json").read_text())["metrics"]["certified_exact"]
    worst = json.loads((out / "results.json").read_text())["metrics"]["certified_exact"]
    assert worst["forget_worst_conf_dist"] < mean["forget_worst_conf_dist"]


@pytest.mark.parametrize("reduction, message", [
    ({"name": "smoothmax", "temperature": -0.02, "fraction": None}, "has no rule"),
    ({"name": "smoothmax", "temperature": float("nan"), "fraction": None}, "temperature is not a finite number"),
    ({"name": "softmin", "temperature": 0.02, "fraction": None}, "has no rule"),
])
def test_a_certificate_claiming_the_convex_rule_for_a_reduction_that_is_not_convex_fails(released, tmp_path, capsys,
                                                                                         reduction, message):
    """T < 0 makes the smooth maximum a smooth minimum (concave); NaN and an unknown reduction have no rule.
    The public check and the audit (its record re-hashed to the edited certificate) both fail."""
    out = released("certified_smoothmax")
    folder = edited(release_of(out), tmp_path, forget_reduction=reduction)
    code, text, err = verify(capsys, folder)
    assert code == 1 and message in text and err == "", text + err
    audit_beside(folder, out)
    code, text, err = verify(capsys, folder, "--audit", folder / "audit.json")
    assert code == 1 and message in text and err == "", text + err


def test_guarantee_states_what_it_is_conditional_on(released):
    """A Lanczos lambda_min is an estimate above the true one: the guarantee says so instead of stating
    (epsilon, delta) outright. The estimator's share of Delta is deterministic (its measured residual), so no
    condition on the sampled Hessians and no rho remain."""
    from ttp_lightning.certified.certificate.statement import guarantee_lines

    exact = json.loads((release_of(released("certified_exact_paper")) / "certificate.json").read_text())
    assert not any(line.startswith("conditional on") for line in guarantee_lines(exact))
    lanczos = dict(exact, steps=[dict(exact["steps"][0], spectrum_method="lanczos")])
    assert any(line.startswith("conditional on: lambda_min(H) at step(s) 1") for line in guarantee_lines(lanczos))
    lissa = json.loads((release_of(released("certified_lissa")) / "certificate.json").read_text())
    lines = guarantee_lines(lissa)
    assert not any("sampled Hessian" in line or "rho" in line for line in lines)


@pytest.mark.parametrize("method", ["certified_exact", "certified_exact_paper", "certified_lissa"])
def test_verify_audit_reproduces_the_release_from_the_private_record(released, capsys, method):
    out = released(method)
    passed = json.loads((out / "results.json").read_text())["release_gate"]["passed"]
    code, text, err = verify(capsys, release_of(out), "--recompute", "--audit", out / "private" / "audit.json",
                             *([] if passed else ["--allow-unprotected"]))
    assert code == (3 if method == "certified_lissa" else 0), text + err
    assert "release reproduced from the audit record" in text


def test_attacker_with_the_public_release_cannot_strip_the_noise(released):
    """Plays the attacker of the issue: regenerate the noise from everything public and subtract it."""
    from ttp_lightning.dp.noise import gaussian_noise

    out = released("certified_exact")
    cert = json.loads((release_of(out) / "certificate.json").read_text())
    public = load_file(str(release_of(out) / "model.safetensors"))
    released_w = torch.cat([public[n].flatten().double() for n in cert["parameter_names"]])
    truth = load_file(str(out / "private" / "noise_free.safetensors"))["release_1"]
    sigma, dim = cert["sigma"], len(released_w)
    guesses = [released_w]  # the release itself
    for seed in range(200):  # the old scheme: torch's generator seeded from a small or configured number
        guesses.append(released_w - sigma * torch.randn(dim, generator=torch.Generator().manual_seed(seed)).double())
    for guess_seed in ("00" * 32, "ff" * 32, cert["forget_fingerprint"], cert["weights"][0]["sha256"]):
        guesses.append(released_w - sigma * gaussian_noise(guess_seed, dim))  # public 32-byte strings as seeds
    errors = [(g - truth).norm().item() for g in guesses]
    scale = sigma * dim**0.5
    assert min(errors) > 0.5 * scale  # no guess gets closer than the noise itself
    assert errors[0] == pytest.approx(scale, rel=0.15)


def test_two_releases_of_one_config_draw_different_noise(released, tmp_path):
    first = released("certified_exact")
    proc = run_release(tmp_path / "again", released.cache, *RELEASES["certified_exact"])
    finished(proc.returncode, json.loads((tmp_path / "again" / "results.json").read_text()), proc.stderr)
    a = load_file(str(first / "private" / "noise_free.safetensors"))["release_1"]
    b = load_file(str(tmp_path / "again" / "private" / "noise_free.safetensors"))["release_1"]
    assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)  # the same deterministic Newton step ...
    cert = json.loads((release_of(first) / "certificate.json").read_text())
    sigma, name = cert["sigma"], cert["parameter_names"][0]
    w1 = load_file(str(release_of(first) / "model.safetensors"))[name]
    w2 = load_file(str(release_of(tmp_path / "again") / "model.safetensors"))[name]
    assert (w1 - w2).double().norm().item() > sigma * (2 * w1.numel()) ** 0.5 * 0.8  # ... but fresh noise


def beside(folder, release):
    """The rest of a release folder (config.json, README.md) copied into `folder`."""
    for name in ("config.json", "README.md"):
        (folder / name).write_bytes((release / name).read_bytes())
    return folder


def audit_beside(folder, out):
    """The run `out`'s private audit record and weights copied into `folder`, the record re-hashed to the
    (edited) certificate there: what a provider who edits its own certificate could hand an auditor."""
    from ttp_lightning.core.files import sha256_of

    audit = json.loads((out / "private" / "audit.json").read_text())
    audit["certificate_sha256"] = sha256_of(folder / "certificate.json")
    (folder / "audit.json").write_text(json.dumps(audit))
    for name in ("start.safetensors", "noise_free.safetensors"):
        (folder / name).write_bytes((out / "private" / name).read_bytes())


def edited(release, tmp_path, **changes):
    """A copy of the release folder whose certificate has some fields replaced."""
    folder = tmp_path / "edited"
    folder.mkdir(exist_ok=True)
    cert = json.loads((release / "certificate.json").read_text())
    cert.update(changes)
    (folder / "certificate.json").write_text(json.dumps(cert))
    beside(folder, release)
    for entry in cert["weights"]:
        target = folder / entry["file"]
        if not target.exists():
            target.write_bytes((release / entry["file"]).read_bytes())
    return folder


def test_verify_fails_tampered_and_forged_releases(released, tmp_path, capsys):

    out = released("certified_exact_paper")
    release = release_of(out)
    cert = json.loads((release / "certificate.json").read_text())
    # one flipped byte in the weights
    flipped = tmp_path / "flipped"
    flipped.mkdir()
    data = bytearray((release / "model.safetensors").read_bytes())
    data[-3] ^= 0x01
    (flipped / "model.safetensors").write_bytes(bytes(data))
    (flipped / "certificate.json").write_text(json.dumps(cert))
    code, text, _ = verify(capsys, beside(flipped, release), "--allow-unprotected")
    assert code == 1 and "FAIL: model.safetensors: SHA-256" in text
    # sigma NaN, and an edited epsilon
    code, text, _ = verify(capsys, edited(release, tmp_path, sigma=float("nan")), "--allow-unprotected")
    assert code == 1 and "FAIL: sigma is not a finite number (nan)" in text
    code, text, _ = verify(capsys, edited(release, tmp_path, epsilon=0.1), "--allow-unprotected")
    assert code == 1 and "too small for epsilon=0.1" in text
    code, text, _ = verify(capsys, edited(release, tmp_path, epsilon=5.0), "--allow-unprotected")
    assert code == 1 and "the certificate was edited" in text
    code, text, _ = verify(capsys, edited(release, tmp_path, lam_min=0.0), "--allow-unprotected")  # the assumption the issue refuted
    assert code == 1 and "is not min(stated" in text
    code, text, _ = verify(capsys, edited(release, tmp_path, projection="per_tensor"), "--allow-unprotected")  # C per tensor, not global
    assert code == 1 and "is not the global norm bound" in text


@pytest.mark.parametrize("changes", [{"theta": 1.0}, {"lam": 0.1, "lam_min": -0.1}, {"sigma": 0.0},
                                     {"num_params": 0}, {"steps": []}, {"delta": 1.5}, {"lam": -1.0},
                                     {"grad_lipschitz_forget": -2.0}, {"hessian_norm": -1.0}])
def test_values_outside_the_bounds_domain_fail_without_a_traceback(released, tmp_path, capsys, changes):
    code, text, err = verify(capsys, edited(release_of(released("certified_lissa")), tmp_path, **changes),
                             "--allow-unprotected")
    assert code == 1 and text.startswith("checked as asked") and "\nFAIL: " in text and err == ""


def test_impossible_constants_that_shrink_delta_fail_before_any_arithmetic(released, tmp_path, capsys):
    """Negative Hessian-Lipschitz constants F_K = F_A made the paper's Delta 125x smaller (105.6 -> 0.845) and were
    verified; every stated constant is now range-checked first, and the failure names it."""
    release = release_of(released("certified_exact_paper"))
    code, text, _ = verify(capsys, edited(release, tmp_path, hessian_lipschitz_forget=-0.24,
                                          hessian_lipschitz_retain=-0.24), "--allow-unprotected")
    assert code == 1 and "FAIL: hessian_lipschitz_forget=-0.24 is outside [0.0, inf)" in text
    assert "FAIL: hessian_lipschitz_retain=-0.24" in text and "verified" not in text
    cert = json.loads((release / "certificate.json").read_text())
    steps = [dict(cert["steps"][0], residual=-1e-3)]
    code, text, _ = verify(capsys, edited(release, tmp_path, steps=steps), "--allow-unprotected")
    assert code == 1 and "FAIL: step 1: residual=-0.001 is outside [0.0, inf)" in text


def test_deeply_nested_json_is_one_error_line(tmp_path, capsys):
    bomb = tmp_path / "certificate.json"
    bomb.write_text("[" * 100_000 + "]" * 100_000)
    code, text, err = verify(capsys, bomb)
    assert code == 2 and text == "" and len(err.strip().splitlines()) == 1


def test_a_forged_norm_bound_is_exposed_by_the_weights_norm(released, tmp_path, capsys):
    """C = 0.01 stated for weights of norm ~ 5 at the paper's sigma = 1e-3, with Delta, epsilon and the
    mechanism recomputed to match, so that only the released weights' norm can expose it."""
    from ttp_lightning.certified.certificate.arithmetic import recomputed_sensitivity
    from ttp_lightning.dp.mechanism import implied_epsilon

    release = release_of(released("certified_lissa"))
    cert = json.loads((release / "certificate.json").read_text())
    forged = {**cert, "norm_bound": 0.01, "norm_bound_config": 0.01}
    forged["sensitivity"], forged["sensitivity_formula"] = recomputed_sensitivity(forged)
    forged["epsilon"], forged["mechanism"] = implied_epsilon(forged["sensitivity"], cert["sigma"], cert["delta"])
    code, text, _ = verify(capsys, edited(release, tmp_path, **forged), "--allow-unprotected")
    assert code == 1 and "exceeds C + the noise's norm bound" in text and text.count("FAIL") == 1


def test_never_unlearned_weights_under_an_edited_hash_fail_recompute_and_audit(released, tmp_path, capsys):
    from ttp_lightning.core.files import sha256_of

    out = released("certified_exact")
    results = json.loads((out / "results.json").read_text())
    pretrained = load_file(results["metrics"]["pretrain"]["cache_file"])
    folder = tmp_path / "forged"
    folder.mkdir()
    save_file(pretrained, str(folder / "model.safetensors"))
    cert = json.loads((release_of(out) / "certificate.json").read_text())
    cert["weights"][0]["sha256"] = sha256_of(folder / "model.safetensors")
    (folder / "certificate.json").write_text(json.dumps(cert))
    code, text, _ = verify(capsys, beside(folder, release_of(out)))
    assert code == 0 and "not checked without --recompute or --audit" in text  # self-consistent: says so
    code, text, _ = verify(capsys, folder, "--recompute")
    assert code == 1 and "forget confidence distance recomputes to" in text
    code, text, _ = verify(capsys, folder, "--audit", out / "private" / "audit.json")
    assert code == 1 and "FAIL: the audit record belongs to another certificate" in text


HOSTILE_TARGETS = {
    "system": {"_target_": "os.system", "command": "touch {marker}"},
    "pickle": {"_target_": "torch.load", "f": "{pickle}", "weights_only": False},
}


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("where", ["data", "model", "data_config", "data.forget"])
@pytest.mark.parametrize("target", list(HOSTILE_TARGETS))
def test_hostile_certificate_runs_no_code(released, tmp_path, capsys, where, target):
    out = released("certified_exact")
    marker, payload = tmp_path / "PWNED", tmp_path / "evil.pt"
    payload.write_bytes(pickle.dumps(_Payload(marker)))
    hostile = json.loads(json.dumps(HOSTILE_TARGETS[target]).replace("{marker}", str(marker))
                         .replace("{pickle}", str(payload)))
    cert = json.loads((release_of(out) / "certificate.json").read_text())
    if where == "data_config":  # the old format's field, whole configs passed to instantiate
        cert["data_config"] = hostile
    elif where == "data.forget":
        cert["data"]["forget"] = {**cert["data"]["forget"], **hostile}
    else:
        cert[where] = {**cert[where], **hostile}
    folder = edited(release_of(out), tmp_path)
    (folder / "certificate.json").write_text(json.dumps(cert))
    for extra in ([], ["--recompute"], ["--audit", out / "private" / "audit.json"]):
        code, text, err = verify(capsys, folder, *extra)
        assert code == 2 and text == "" and len(err.strip().splitlines()) == 1 and err.startswith("error:"), err
        assert not marker.exists()


def test_hostile_file_names_and_disguised_pickles_are_refused(released, tmp_path, capsys):
    from ttp_lightning.core.files import sha256_of

    out = released("certified_exact")
    cert = json.loads((release_of(out) / "certificate.json").read_text())
    traversal = tmp_path / "traversal.json"
    traversal.write_text(json.dumps({**cert, "weights": [{"file": "../../etc/passwd", "sha256": "0" * 64}]}))
    code, _, err = verify(capsys, traversal)
    assert code == 2 and "without a folder" in err
    marker = tmp_path / "PWNED"
    folder = edited(release_of(out), tmp_path)
    (folder / "model.safetensors").write_bytes(pickle.dumps(_Payload(marker)))  # a pickle named .safetensors
    cert = json.loads((folder / "certificate.json").read_text())
    cert["weights"][0]["sha256"] = sha256_of(folder / "model.safetensors")
    (folder / "certificate.json").write_text(json.dumps(cert))
    code, text, _ = verify(capsys, folder)
    assert code == 1 and "not a readable safetensors file" in text and not marker.exists()
    code, text, err = verify(capsys, folder, "--recompute")
    assert code == 2 and err.startswith("error: cannot verify") and not marker.exists()


def test_verify_cli_contract(released):
    """The subprocess contract: exit codes 0/3 and one error line for a file that is not JSON."""
    out = released("certified_exact")
    proc = subprocess.run([sys.executable, "-m", "ttp_lightning.verify", release_of(out) / "certificate.json",
                           "--recompute", "data.max_test_size=100"], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0 and proc.stdout.startswith("verified:"), proc.stdout + proc.stderr
    bad = out / "not_json.json"
    bad.write_text("{nope")
    proc = subprocess.run([sys.executable, "-m", "ttp_lightning.verify", bad], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: cannot verify")


def test_certified_run_stops_when_the_hypotheses_fail(run_job):
    proc, results = run_job(*TINY_WITHOUT_METHOD, "model=logreg", "method=certified_exact", "pretrain.norm_bound=10",
                            "method.bound=paper", "method.uniformity=square", "method.lam=0.05", "method.grad_lipschitz_forget=2", "method.grad_lipschitz_retain=2",
                            "attacks.enabled=false", tiny=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and results is None and len(errors) == 1
    assert errors[0].startswith("error: lambda + lambda_min(H) = 0.05 + (-") and "raise method.lam above" in errors[0]


def test_a_delta_of_one_over_n_or_more_is_vacuous_and_refused_at_run_time(released, tmp_path, capsys, run_job):
    """Issue 36, case 5: delta = 0.5 was certified and verified. delta must be below 1/n (n training records: a
    mechanism that publishes one record at random meets delta = 1/n); verify judges a larger one vacuous, with
    epsilon, sigma and the mechanism recomputed to match so that nothing else fails, and a run refuses it."""
    from ttp_lightning.certified.certificate.arithmetic import training_set_size
    from ttp_lightning.dp.mechanism import implied_epsilon

    release = release_of(released("certified_exact"))
    cert = json.loads((release / "certificate.json").read_text())
    n = training_set_size(cert)
    assert cert["delta"] < 1 / n
    for delta in (0.5, 1.0 / n):
        epsilon, mechanism = implied_epsilon(cert["sensitivity"], cert["sigma"], delta)
        code, text, _ = verify(capsys, edited(release, tmp_path, delta=delta, epsilon=epsilon, mechanism=mechanism),
                               "--allow-unprotected", "--vacuous-above", "1e300")
        assert code == 3 and f"VACUOUS: delta={delta:.3g} is not below 1/n" in text and "FAIL" not in text, text
    proc, results = run_job(*RESIDUAL, "method=certified_exact", "method.delta=0.5")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and results is None and len(errors) == 1
    assert errors[0].startswith("error: method.delta=0.5 is not allowed; with n = ") and "1/n" in errors[0]


def test_certified_bad_input(run_job):
    proc, results = run_job("model=logreg", "method=certified_exact", tiny=False)
    assert proc.returncode == 2 and "needs pretrain.norm_bound" in proc.stderr and results is None
    proc, _ = run_job("model=logreg", "method=certified_exact", "pretrain.norm_bound=10", "method.theta=1",
                      tiny=False)
    assert proc.returncode == 2 and "choose auto or a value in (0, 1)" in proc.stderr
    proc, _ = run_job("model=resnet18", "method=certified_exact", "pretrain.norm_bound=10", "pretrain.epochs=1",
                      "data.max_train_size=200", "method.bound=paper", tiny=False)
    assert proc.returncode == 2 and "more than method.max_exact_params=20,000" in proc.stderr
    # the residual bound needs logits linear in the certified weights: a network is refused, with the fix
    proc, _ = run_job("model=mlp", "method=certified_exact", "pretrain.norm_bound=10", "pretrain.epochs=1",
                      "data.max_train_size=200", tiny=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "method.layers=last" in errors[0]


@pytest.mark.parametrize("overrides, message", [
    (["method=certified_online"], "needs data.forget.requests"),
    (["method=certified_online", "data.forget.requests=[5]", "method.warmup_epochs=3"], r"starts from A\(D\)"),
    (["method=certified_lissa", "method.depth=0"], "method.depth=0 is not allowed"),
    (["method=certified_lissa", "method.max_cg=0"], "method.max_cg=0 is not allowed"),
    (["method=certified_exact", "method.solver_tolerance=0"], "method.solver_tolerance=0.0 is not allowed"),
    (["method=certified_lissa", "method.lam=-1"], "method.lam=-1 is not allowed"),
    (["method=certified_lissa", "method.lam=0.1", "method.lam_min=-0.2"], r"lambda \+ lambda_min must be > 0"),
    (["method=certified_exact", "method.lanczos_iterations=0"], "method.lanczos_iterations=0"),
    (["method=certified_exact", "method.vacuous_above=-1"], "method.vacuous_above=-1"),
])
def test_certified_options_are_validated(compose_cfg, overrides, message):
    from ttp_lightning.core.errors import TTPUserError
    from ttp_lightning.run.validation import build_method, validate_config

    cfg = compose_cfg("model=logreg", "pretrain.norm_bound=10", *overrides, tiny=False)
    with pytest.raises(TTPUserError, match=message):
        build_method(validate_config(cfg))  # the ranges, then the method's own cross-field checks


def test_a_closed_choice_of_the_certified_schema_fails_at_composition(compose_cfg):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="method.release=all"):
        compose_cfg("model=logreg", "method=certified_online", "method.release=all", tiny=False)


def test_lam_auto_is_the_lipschitz_mixture(compose_cfg):
    from ttp_lightning.certified.maths.newton import resolve_lam

    cfg = compose_cfg("method=certified_lissa", "method.lam=auto", "method.theta=0.8",
                      "method.grad_lipschitz_forget=2", "method.grad_lipschitz_retain=0.5", tiny=False)
    assert resolve_lam(cfg.method) == pytest.approx(0.8 * 2 + 0.2 * 0.5)


def test_a_larger_lambda_with_delta_and_sigma_recomputed_is_named_as_trusted_and_fails_the_audit(released, tmp_path,
                                                                                                  capsys):
    """Issue 59 (c): lam = mu = 1 with every step's distance bound, Delta and sigma recomputed from them is
    self-consistent, so it passes every public check, --recompute included (the data and the noised weights do not
    reveal lambda). verify says so: it names the constants it took on trust, lambda among them; --audit, which
    re-measures them at the private noise-free weights, fails it."""
    from ttp_lightning.certified.certificate.arithmetic import recomputed_sensitivity
    from ttp_lightning.dp.mechanism import noise_sigma

    out = released("certified_exact")
    release = release_of(out)
    cert = json.loads((release / "certificate.json").read_text())
    forged = {**cert, "lam": 1.0, "mu": 1.0, "steps": [dict(step) for step in cert["steps"]]}
    for step in forged["steps"]:
        step["distance_bound"] = recomputed_sensitivity({**forged, "steps": [step]})[0]
    forged["sensitivity"] = recomputed_sensitivity(forged)[0]
    forged["sigma"], forged["mechanism"] = noise_sigma(forged["sensitivity"], cert["epsilon"], cert["delta"])
    assert forged["sensitivity"] < cert["sensitivity"] / 10  # a far smaller Delta: far less noise claimed needed
    folder = edited(release, tmp_path, **forged)
    for extra in ([], ["--recompute"]):
        code, text, _ = verify(capsys, folder, *extra)
        assert code == 0 and "taken on trust (only --audit re-measures them" in text and "lambda=1 " in text, text
    audit_beside(folder, out)
    code, text, _ = verify(capsys, folder, "--audit", folder / "audit.json")
    assert code == 1, text
    code, text, _ = verify(capsys, release, "--audit", out / "private" / "audit.json")
    assert code == 0 and "taken on trust" not in text  # audited: nothing left on trust


def test_a_key_twice_in_a_certificate_is_one_error_line(released, tmp_path, capsys):
    """The last of two "epsilon" keys is what Python reads, the first what other readers may: refused."""
    release = release_of(released("certified_exact"))
    folder = edited(release, tmp_path)
    text = (folder / "certificate.json").read_text()
    (folder / "certificate.json").write_text(text.replace('"epsilon":', '"epsilon": 1e9, "epsilon":', 1))
    code, out, err = verify(capsys, folder)
    assert code == 2 and "'epsilon' appears twice" in err and err.count("\n") == 1, out + err


def test_a_huge_sparse_weights_file_beside_a_certificate_is_refused_before_it_is_hashed(released, tmp_path, capsys):
    """Issue 59, minor, for `verify CERT`: the certificate's weights were hashed whole before any size check."""
    release = release_of(released("certified_exact"))
    folder = edited(release, tmp_path)
    for entry in json.loads((folder / "certificate.json").read_text())["weights"]:
        with open(folder / entry["file"], "r+b") as handle:
            handle.truncate(3 << 30)  # sparse: no disk used
    code, out, err = verify(capsys, folder)
    assert code == 2 and "3,221,225,472 bytes" in err and err.count("\n") == 1, out + err
