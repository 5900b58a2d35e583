"""Certified releases: what is public (weights + certificate.json), what stays private (the audit record),
and the checks anyone can run on a certificate without trusting it.

Layout of a certified run's output folder:

    release/model.safetensors     the released weights (Alg 4 releasing every request: model_request_<i>...)
    release/certificate.json      the certificate (format `ttp_lightning.certificate/4`, schema.py)
    private/audit.json            the noise seed and the hashes that tie the release to its noise-free weights
    private/start.safetensors     the model at the start of the Newton step(s)
    private/noise_free.safetensors  the noise-free weights, after projection onto the C-ball (float64)

Only release/ is meant to be published. private/ is written with owner-only permissions; whoever holds it
can strip the noise.
"""

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ttp_lightning.certificates.schema import ALGORITHMS, AUDIT_FORMAT, CERTIFICATE_FORMAT
from ttp_lightning.certify.bounds import (
    estimator_depth,
    estimator_scale_b,
    exact_newton_sensitivity,
    hypothesis_violations,
)
from ttp_lightning.certify.mechanism import implied_epsilon
from ttp_lightning.certify.noise import noise_norm_bound
from ttp_lightning.certify.reductions import Reduction
from ttp_lightning.certify.residual import (
    CONVEX_REDUCTION,
    NotConvex,
    capped_paper_sensitivity,
    distance_bound,
    estimator_error_bound,
    strong_convexity,
)
from ttp_lightning.certify.residual import EXACT as CONVEX_LOSSES
from ttp_lightning.core.files import atomic_tensors, atomic_text, sha256_of

CERTIFICATE_FILE, AUDIT_FILE = "certificate.json", "audit.json"
RELEASE_DIR, PRIVATE_DIR = "release", "private"
START_FILE, NOISE_FREE_FILE = "start.safetensors", "noise_free.safetensors"
EXACT, ESTIMATOR, ONLINE = ALGORITHMS  # Algs 2, 3, 4
RELATIVE_TOLERANCE = 1e-6
NOISE_NORM_FAILURE = 1e-9   # the released-norm check fails a genuine release with at most this probability
EXACT_RESIDUAL_LIMIT = 1e-6  # a Cholesky solve whose residual is above this is no exact Newton step
DEFAULT_VACUOUS_ABOVE = 10.0


def sha256_of_vector(vector: torch.Tensor) -> str:
    """SHA-256 of a flat vector's float64 little-endian bytes (the noise-free weights' hash)."""
    return hashlib.sha256(vector.detach().double().cpu().contiguous().numpy().astype("<f8").tobytes()).hexdigest()


def weights_file_name(index: int, count: int) -> str:
    return "model.safetensors" if count == 1 else f"model_request_{index + 1}.safetensors"


def noise_free_key(index: int) -> str:
    return f"release_{index + 1}"


@dataclass(frozen=True)
class WrittenCertificate:
    """A certificate as write_release wrote it: its file and its document, parsed from the very text written (what
    a verifier reads; not read back from disk)."""

    path: Path
    document: dict

    @property
    def last_weights(self) -> str:
        """The file name of the released weights the certificate's last step names."""
        return self.document["weights"][-1]["file"]


def write_release(certificate: dict, states: list[dict], audit: dict, output_dir: str | Path,
                  folder: str = RELEASE_DIR) -> WrittenCertificate:
    """Write `folder` (release/, or release_not_protected/ when the release gate failed: weights, then the
    certificate naming their hashes) and private/ (start weights, noise-free weights, the audit record naming
    every hash)."""
    output_dir = Path(output_dir)
    release_dir, private_dir = output_dir / folder, output_dir / PRIVATE_DIR
    release_dir.mkdir(parents=True, exist_ok=True)
    private_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(private_dir, 0o700)
    weights = []
    for index, state in enumerate(states):
        path = release_dir / weights_file_name(index, len(states))
        atomic_tensors(path, state, 0o644)
        weights.append({"file": path.name, "sha256": sha256_of(path)})
    text = json.dumps({"format": CERTIFICATE_FORMAT, **certificate, "weights": weights}, indent=2)
    cert_path = release_dir / CERTIFICATE_FILE
    atomic_text(cert_path, text)
    atomic_tensors(private_dir / START_FILE, audit["start_state"], 0o600)
    noise_free = {noise_free_key(i): v.double() for i, v in enumerate(audit["noise_free"])}
    atomic_tensors(private_dir / NOISE_FREE_FILE, noise_free, 0o600)
    record = {"format": AUDIT_FORMAT, "noise_seed": audit["noise_seed"], "certificate_sha256": sha256_of(cert_path),
              "start_file": START_FILE, "start_sha256": sha256_of(private_dir / START_FILE),
              "noise_free_file": NOISE_FREE_FILE,
              "noise_free_sha256": [sha256_of_vector(v) for v in audit["noise_free"]],
              "weights_sha256": [w["sha256"] for w in weights]}
    audit_path = private_dir / AUDIT_FILE
    atomic_text(audit_path, json.dumps(record, indent=2), mode=0o600)
    return WrittenCertificate(cert_path, json.loads(text))


def load_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """A safetensors file as tensors (no pickle, no code)."""
    return load_file(str(path))


# ------------------------------------------------------------------------------ the bound's arithmetic
def composed_releases(cert: dict) -> int:
    """How many noised releases the (epsilon, delta) statement covers together."""
    return len(cert["steps"]) if cert["release_model"] == "each" else 1


def scale_b(cert: dict) -> float:
    return estimator_scale_b(cert["theta"], cert["lam"], cert["grad_lipschitz_forget"], cert["grad_lipschitz_retain"])


def required_depth(cert: dict, step: dict) -> int:
    """The n the bound requires of one Newton step: kappa = B / (lambda + lambda_min) with that step's
    lambda_min (min of the stated and the one measured at that step's start)."""
    lam_min = min(cert["lam_min_stated"], step["lam_min_measured"])
    return estimator_depth(scale_b(cert), cert["lam"], lam_min, cert["estimator"]["repeats"])


def step_distance_bound(cert: dict, step: dict) -> float:
    """bound=residual: one step's ||w~ - M_theta(D)|| bound from its stated measurements."""
    return distance_bound(step["stationarity"] + step["rounding_floor"], cert["mu"], step["multiplier"],
                          step["weights_norm"], cert["norm_bound"])


def paper_step_sensitivity(cert: dict, step: dict) -> float:
    """bound=paper, one step: eq. `algo_exact_hessian_eq`, plus for the estimator (Algs 3-4) the measured
    residual's share ||(H + lambda I) p - g|| / (lambda + lambda_min) (deterministic; in place of the estimator
    lemma's probability-(1 - rho) term)."""
    lam_min = min(cert["lam_min_stated"], step["lam_min_measured"])
    exact = exact_newton_sensitivity(cert["norm_bound"], cert["theta"], cert["hessian_lipschitz_forget"],
                                     cert["hessian_lipschitz_retain"], cert["lam"], lam_min)
    if cert["algorithm"] == EXACT:
        return exact
    return exact + estimator_error_bound(step["residual"], step["gradient_norm"], cert["lam"], lam_min)


def recomputed_sensitivity(cert: dict) -> tuple[float, float | None]:
    """(Delta, the paper formula's uncapped value or None): the largest per-step bound over the steps whose
    noise-free weights are released (all of them, or the last for Alg 4's final release). bound=paper caps
    the formula at 2C, the ball's diameter."""
    steps = cert["steps"] if cert["release_model"] != "final" else cert["steps"][-1:]
    if cert["bound"] == "residual":
        return max(step_distance_bound(cert, step) for step in steps), None
    formula = max(paper_step_sensitivity(cert, step) for step in steps)
    return capped_paper_sensitivity(formula, cert["norm_bound"]), formula


def implied_global_norm_bound(norm_bound: float, projection: str, num_tensors: int) -> float:
    """The bound on the global ||w||_2 that the pretraining projection implies: C, or C sqrt(#tensors) when
    each tensor is projected on its own."""
    return norm_bound if projection == "global" else norm_bound * math.sqrt(num_tensors)


def _close(a: float, b: float, tolerance: float = RELATIVE_TOLERANCE) -> bool:
    return abs(a - b) <= tolerance * max(abs(a), abs(b), 1e-300)


# ------------------------------------------------------------------------------ checks
def _non_finite(cert: dict) -> list[str]:
    bad = []

    def walk(value, key):
        if isinstance(value, float) and not math.isfinite(value):
            bad.append(f"{key} is not a finite number ({value})")
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else k)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{key}[{i}]")

    walk(cert, "")
    return bad


# (low, high, closed at low): the range of every stated constant and count in which the bounds are defined. A
# Lipschitz constant, a norm or a residual below 0 is impossible, and one edited below 0 would shrink Delta
# (F_K = F_A = -0.24 took a Delta of 105.6 to 0.845 while the noise stayed the same).
_OPEN, _CLOSED = False, True
CONSTANT_RANGES = {
    "theta": (0.0, 1.0, _OPEN), "delta": (0.0, 1.0, _OPEN), "epsilon": (0.0, math.inf, _OPEN),
    "sigma": (0.0, math.inf, _OPEN), "lam": (0.0, math.inf, _OPEN), "norm_bound": (0.0, math.inf, _OPEN),
    "norm_bound_config": (0.0, math.inf, _OPEN), "num_params": (0, math.inf, _OPEN),
    "hessian_lipschitz_forget": (0.0, math.inf, _CLOSED), "hessian_lipschitz_retain": (0.0, math.inf, _CLOSED),
    "grad_lipschitz_forget": (0.0, math.inf, _CLOSED), "grad_lipschitz_retain": (0.0, math.inf, _CLOSED),
    "gradient_bound": (0.0, math.inf, _CLOSED),
    "sensitivity": (0.0, math.inf, _OPEN), "forget_temperature": (0.0, math.inf, _OPEN),
    "spectrum_margin": (0.0, math.inf, _CLOSED), "lanczos_iterations": (1, math.inf, _CLOSED),
    "chunk_size": (1, math.inf, _CLOSED), "max_exact_params": (1, math.inf, _CLOSED),
    "releases": (1, math.inf, _CLOSED), "warmup_epochs": (0, math.inf, _CLOSED), "forget_size": (1, math.inf, _CLOSED),
}
PAPER_RANGES = {"hessian_norm": (0.0, math.inf, _CLOSED), "sensitivity_formula": (0.0, math.inf, _OPEN)}
RESIDUAL_RANGES = {"mu": (0.0, math.inf, _OPEN)}
ESTIMATOR_RANGES = {
    "repeats": (0, math.inf, _OPEN),
    "sample_size": (1, math.inf, _CLOSED), "max_residual": (0.0, math.inf, _CLOSED),
    "scale_margin": (0.0, math.inf, _CLOSED),
}
ANY_STEP_RANGES = {  # what every step record states, whichever the bound
    "forget_size": (1, math.inf, _CLOSED), "retain_size": (1, math.inf, _CLOSED),
    "gradient_norm": (0.0, math.inf, _CLOSED), "step_norm": (0.0, math.inf, _CLOSED),
}
RESIDUAL_STEP_RANGES = {
    **ANY_STEP_RANGES, "multiplier": (0.0, math.inf, _CLOSED),
    "stationarity": (0.0, math.inf, _CLOSED), "rounding_floor": (0.0, math.inf, _CLOSED),
    "weights_norm": (0.0, math.inf, _CLOSED), "distance_bound": (0.0, math.inf, _CLOSED),
    "newton_iterations": (0, math.inf, _CLOSED), "hessian_products": (0, math.inf, _CLOSED),
}
STEP_RANGES = {
    **ANY_STEP_RANGES, "residual": (0.0, math.inf, _CLOSED),
    "hessian_norm_measured": (0.0, math.inf, _CLOSED), "lanczos_iterations": (0, math.inf, _CLOSED),
    "spectrum_margin": (0.0, math.inf, _CLOSED), "norm_before_projection": (0.0, math.inf, _CLOSED),
}


def _outside(values: dict, ranges: dict, prefix: str = "") -> list[str]:
    failures = []
    for key, (low, high, closed) in ranges.items():
        value = values[key]
        if not ((low <= value if closed else low < value) and value < high):
            failures.append(f"{prefix}{key}={value} is outside {'[' if closed else '('}{low}, {high})")
    return failures


def _range_failures(cert: dict) -> list[str]:
    """Values outside the range where the bounds are defined (checked before any arithmetic uses them), and
    fields that the bound mode needs or must not have."""
    residual = cert["bound"] == "residual"
    mode_fields = RESIDUAL_RANGES if residual else PAPER_RANGES
    missing = [key for key in (*mode_fields, *(() if residual else ("lam_min",))) if cert[key] is None]
    if missing:
        return [f"bound={cert['bound']} needs {missing[0]}"]
    other = ("lam_min", "hessian_norm", "sensitivity_formula") if residual else ("mu", "mu_rule")
    stray = [key for key in other if cert[key] is not None]
    if stray:
        return [f"bound={cert['bound']} states {stray[0]}, which only the other bound uses"]
    failures = _outside(cert, CONSTANT_RANGES) + _outside(cert, mode_fields)
    if cert["estimator"] is not None:
        failures += _outside(cert["estimator"], ESTIMATOR_RANGES, "estimator.")
    for i, step in enumerate(cert["steps"], 1):
        kind = "stationarity" in step
        if kind != residual:
            failures.append(f"step {i} is not a bound={cert['bound']} step record")
            continue
        failures += _outside(step, RESIDUAL_STEP_RANGES if residual else STEP_RANGES, f"step {i}: ")
    if not cert["steps"] or not cert["weights"] or not cert["parameter_names"]:
        failures.append("a certificate lists at least one step, one weights file and one certified tensor")
    if not residual and cert["forget_reduction"]["name"] != "mean":
        failures.append(f"bound=paper's Delta is for the mean forget loss, not "
                        f"forget_reduction={cert['forget_reduction']['name']}")
    if not residual and cert["lam"] + cert["lam_min"] <= 0:
        failures.append(f"lambda + lambda_min = {cert['lam']:.6g} + ({cert['lam_min']:.6g}) <= 0: Delta is undefined")
    return failures


def _residual_failures(cert: dict) -> list[str]:
    """bound=residual: mu is what its rule gives from the stated settings (mu = lambda needs reverse_kl), every
    step's point lies in the C-ball and its distance bound recomputes from its measurements, G is the largest
    gradient norm, and the certified tensors are one final layer's weight and bias."""
    failures = []
    reduction = Reduction(**cert["forget_reduction"])
    try:
        mu, rule = strong_convexity(cert["uniformity"], cert["lam"], cert["theta"], cert["grad_lipschitz_forget"],
                                    reduction)
    except NotConvex as exc:
        failures.append(f"mu={cert['mu']:.6g} ({cert['mu_rule']}) has no rule: {exc}, so the objective is not "
                        "convex and the distance bound does not hold")
    else:
        if not _close(cert["mu"], mu) or cert["mu_rule"] != rule:
            failures.append(f"mu={cert['mu']:.6g} ({cert['mu_rule']}) is not what uniformity={cert['uniformity']}, "
                            f"forget_reduction={reduction.name}, lambda={cert['lam']:.6g} give: {mu:.6g} ({rule})")
    if cert["estimator"] is not None or cert["projection"] != "global":
        failures.append("a residual certificate has no estimator settings and a global C-ball projection")
    names = cert["parameter_names"]
    if len(names) != 2 or not names[0].endswith("weight") or not names[1].endswith("bias") or \
            names[0].rsplit(".", 1)[0] != names[1].rsplit(".", 1)[0]:
        failures.append(f"a residual certificate covers one linear layer's weight and bias, not {names[:4]}")
    for i, step in enumerate(cert["steps"], 1):
        if step["weights_norm"] > cert["norm_bound"]:
            failures.append(f"step {i}: ||w|| = {step['weights_norm']:.9g} is outside the C-ball ({cert['norm_bound']:.6g})")
            continue
        bound = step_distance_bound(cert, step)
        if not _close(bound, step["distance_bound"]):
            failures.append(f"step {i}: the distance bound recomputes to {bound:.6g}, the step says "
                            f"{step['distance_bound']:.6g}")
    gradient = max(step["gradient_norm"] for step in cert["steps"])
    if not _close(cert["gradient_bound"], gradient):
        failures.append(f"G={cert['gradient_bound']:.6g} is not the largest measured gradient norm {gradient:.6g}")
    return failures


def _hypothesis_failures(cert: dict) -> list[str]:
    if cert["bound"] == "residual":
        return _residual_failures(cert)
    failures = []
    lam, lam_min = cert["lam"], cert["lam_min"]
    measured_min = min(step["lam_min_measured"] for step in cert["steps"])
    if not _close(lam_min, min(cert["lam_min_stated"], measured_min)):
        failures.append(f"lambda_min={lam_min:.6g} is not min(stated {cert['lam_min_stated']:.6g}, measured "
                        f"{measured_min:.6g}): Delta must use the smaller")
    measured_norm = max(step["hessian_norm_measured"] for step in cert["steps"])
    if not _close(cert["hessian_norm"], measured_norm):
        failures.append(f"||H||={cert['hessian_norm']:.6g} is not the largest measured {measured_norm:.6g}")
    gradient = max(step["gradient_norm"] for step in cert["steps"])
    if not _close(cert["gradient_bound"], gradient):
        failures.append(f"G={cert['gradient_bound']:.6g} is not the largest measured gradient norm {gradient:.6g}")
    failures += hypothesis_violations(cert["theta"], lam, lam_min, cert["hessian_norm"],
                                      cert["grad_lipschitz_forget"], cert["grad_lipschitz_retain"])
    expected_c = implied_global_norm_bound(cert["norm_bound_config"], cert["projection"], len(cert["parameter_names"]))
    if not _close(cert["norm_bound"], expected_c):
        failures.append(f"C={cert['norm_bound']:.6g} is not the global norm bound {expected_c:.6g} that "
                        f"projection={cert['projection']} with C={cert['norm_bound_config']:.6g} implies")
    return failures


def _algorithm_failures(cert: dict) -> list[str]:
    algorithm, steps = cert["algorithm"], cert["steps"]
    if cert["bound"] == "residual":
        if (algorithm == ONLINE) == (cert["release_model"] == "single") or (algorithm != ONLINE and len(steps) != 1):
            return ["Algs 2-3 make one step and a single release; Alg 4 releases its final model or every request"]
        return []
    if algorithm == EXACT:
        if cert["estimator"] is not None or len(steps) != 1 or cert["release_model"] != "single":
            return ["an exact Newton step (Alg 2) has one step, no estimator settings and a single release"]
        if not steps[0]["residual"] <= EXACT_RESIDUAL_LIMIT:
            return [f"the exact Newton step's residual {steps[0]['residual']:.3g} is above {EXACT_RESIDUAL_LIMIT}"]
        return []
    estimator = cert["estimator"]
    if estimator is None:
        return [f"{algorithm} needs its estimator settings"]
    failures = []
    if (algorithm == ESTIMATOR) != (cert["release_model"] == "single") or (algorithm == ESTIMATOR and len(steps) != 1):
        failures.append("Alg 3 makes one step and a single release; Alg 4 releases its final model or every request")
    bound_b = scale_b(cert)
    for i, step in enumerate(steps, 1):
        needed = required_depth(cert, step)
        if step["depth"] is None or step["depth"] < needed:
            failures.append(f"step {i}: depth n={step['depth']} is below the n={needed} the estimator bound requires")
        if step["scale"] is None or step["scale"] < bound_b * (1 - RELATIVE_TOLERANCE):
            failures.append(f"step {i}: J={step['scale']} is below B={bound_b:.6g}, the largest sampled Hessian "
                            f"norm under the stated constants (the bound needs J >= B)")
        if not step["residual"] <= estimator["max_residual"]:
            failures.append(f"step {i}: residual {step['residual']:.3g} is above max_residual "
                            f"{estimator['max_residual']:.3g}")
    return failures


def _noise_failures(cert: dict, sensitivities: tuple[float, float | None]) -> list[str]:
    failures = []
    sensitivity, formula = sensitivities
    if (formula is None) != (cert["sensitivity_formula"] is None) or (
            formula is not None and not _close(formula, cert["sensitivity_formula"])):
        failures.append(f"the paper formula's Delta recomputes to {formula}, the certificate says "
                        f"{cert['sensitivity_formula']}")
    if abs(sensitivity - cert["sensitivity"]) > RELATIVE_TOLERANCE * sensitivity:
        failures.append(f"Delta recomputed from the stated constants is {sensitivity:.6g}, the certificate says "
                        f"{cert['sensitivity']:.6g}")
        return failures
    releases = composed_releases(cert)
    if cert["releases"] != releases:
        failures.append(f"releases={cert['releases']} but release_model={cert['release_model']} with "
                        f"{len(cert['steps'])} steps composes {releases}")
    epsilon, mechanism = implied_epsilon(sensitivity, cert["sigma"], cert["delta"], releases)
    if epsilon > cert["epsilon"] * (1 + RELATIVE_TOLERANCE):
        failures.append(f"sigma={cert['sigma']:.6g} is too small for epsilon={cert['epsilon']:.6g}: with "
                        f"Delta={sensitivity:.6g}, delta={cert['delta']:.3g} over {releases} release(s) it "
                        f"certifies only epsilon={epsilon:.6g}")
    elif epsilon < cert["epsilon"] * (1 - 1e-3):
        failures.append(f"epsilon={cert['epsilon']:.6g} is not what sigma={cert['sigma']:.6g} certifies "
                        f"({epsilon:.6g}); the certificate was edited")
    if mechanism != cert["mechanism"]:
        failures.append(f"the calibration for epsilon={epsilon:.6g} over {releases} release(s) is {mechanism}, "
                        f"the certificate names {cert['mechanism']}")
    return failures


def released_norm_limit(cert: dict) -> float:
    """||w|| of a genuine release is at most C plus this bound on the noise's norm (prob. 1 - 1e-9)."""
    return (cert["norm_bound"] + noise_norm_bound(cert["sigma"], cert["num_params"], NOISE_NORM_FAILURE)) * (1 + 1e-6)


def weights_failures(cert: dict, weight_paths: list[Path]) -> list[str]:
    """Hashes, the certified tensors' presence and count, and their norm against C plus the noise."""
    failures = []
    if len(weight_paths) != len(cert["weights"]):
        return [f"the certificate names {len(cert['weights'])} weights file(s), {len(weight_paths)} given"]
    for entry, path in zip(cert["weights"], weight_paths):
        actual = sha256_of(path)
        if actual != entry["sha256"]:
            failures.append(f"{path.name}: SHA-256 {actual[:16]}... differs from the certificate's "
                            f"{entry['sha256'][:16]}...")
            continue
        try:
            state = load_weights(path)
        except (SafetensorError, OSError, ValueError) as exc:  # a corrupt or disguised file
            failures.append(f"{path.name}: not a readable safetensors file ({type(exc).__name__})")
            continue
        missing = [n for n in cert["parameter_names"] if n not in state]
        if missing:
            failures.append(f"{path.name}: certified tensor {missing[0]} is missing")
            continue
        count = sum(state[n].numel() for n in cert["parameter_names"])
        if count != cert["num_params"]:
            failures.append(f"{path.name}: the certified tensors hold {count} numbers, the certificate says "
                            f"{cert['num_params']}")
            continue
        norm = math.sqrt(sum(state[n].double().pow(2).sum().item() for n in cert["parameter_names"]))
        limit = released_norm_limit(cert)
        if not norm <= limit:
            failures.append(f"{path.name}: ||w|| = {norm:.6g} exceeds C + the noise's norm bound "
                            f"({cert['norm_bound']:.6g} + sigma (sqrt(d) + sqrt(2 ln 1e9)) = {limit:.6g}); "
                            f"C or sigma is false")
    return failures


def check_certificate(cert: dict, weight_paths: list[Path]) -> list[str]:
    """Every check that needs only the certificate and the weights (empty when all hold)."""
    failures = _non_finite(cert) or _range_failures(cert)
    if failures:
        return failures
    failures += _hypothesis_failures(cert) + _algorithm_failures(cert)
    failures += _noise_failures(cert, recomputed_sensitivity(cert))
    failures += weights_failures(cert, weight_paths)
    return failures


def is_vacuous(epsilon: float, threshold: float = DEFAULT_VACUOUS_ABOVE) -> bool:
    return not epsilon <= threshold


def training_set_size(cert: dict) -> int:
    """n = |D|, the records the (epsilon, delta) statement protects: the forget plus the retain set of a step
    (the same for every step; Alg 4 moves instances from one to the other)."""
    return max(int(step["forget_size"]) + int(step["retain_size"]) for step in cert["steps"])


def delta_allowed(delta: float, n: int) -> bool:
    """delta < 1/n, the standard requirement: a mechanism that publishes one of n records at random is
    (0, 1/n)-differentially private, so a delta of 1/n or more can be met while leaking a whole record."""
    return 0.0 < delta < 1.0 / n


def vacuous_reasons(cert: dict, epsilon_above: float) -> list[str]:
    """Why a certificate that passes its checks still guarantees nothing meaningful (empty: it does)."""
    reasons = []
    if is_vacuous(cert["epsilon"], epsilon_above):
        reasons.append(f"epsilon={cert['epsilon']:.6g} > {epsilon_above:g}: an (epsilon, delta) statement this weak "
                       "protects nothing; the noise is too small for the stated constants")
    n = training_set_size(cert)
    if not delta_allowed(cert["delta"], n):
        reasons.append(f"delta={cert['delta']:.3g} is not below 1/n = {1.0 / n:.3g} (n = {n} training records): a "
                       "mechanism that publishes one record at random meets it")
    return reasons


def guarantee_lines(cert: dict) -> list[str]:
    """What a certificate that passes the checks proves, and under which assumptions."""
    k = composed_releases(cert)
    target = ("the exact regularised Pareto optimum M_theta(D) noised the same way" if k == 1 else
              f"the {k} exact regularised Pareto optima after requests 1..{k}, noised the same way")
    layers = " (the final layer only, on the start model's frozen features)" if cert["layers"] == "last" else ""
    if cert["bound"] == "residual":
        how = (f"a-posteriori residual bound: Delta = max over steps of (||r|| + sqrt(||r||^2 + 4 mu nu ||w|| "
               f"(C - ||w||))) / (2 mu), mu={cert['mu']:.6g}")
    else:
        step = {EXACT: "exact Newton step (Alg 2)", ESTIMATOR: "Newton step with the inverse-Hessian estimator (Alg 3)",
                ONLINE: "online Newton steps (Alg 4)"}[cert["algorithm"]]
        how = (f"the paper's bound for the {step}: {cert['sensitivity_formula']:.6g}, capped at 2C = "
               f"{2 * cert['norm_bound']:.6g}")
    guarantee = (f"guarantee: the released weights{layers} ({k} release(s)) are (epsilon={cert['epsilon']:.6g}, "
                 f"delta={cert['delta']:.3g})-indistinguishable from {target}: theta={cert['theta']:.4g}, "
                 f"lambda={cert['lam']:.6g}, sigma={cert['sigma']:.6g}, Delta={cert['sensitivity']:.6g} "
                 f"({cert['mechanism']}; {how})")
    return [guarantee, _assumed_line(cert), _measured_line(cert)] + condition_lines(cert)


def _assumed_line(cert: dict) -> str:
    if cert["bound"] == "residual":
        if cert["mu_rule"] == CONVEX_LOSSES:
            convexity = (f"nothing assumed: cross-entropy and {cert['uniformity']} are convex in the logits, which are "
                         f"linear in the certified weights, so mu = lambda exactly")
        elif cert["mu_rule"] == CONVEX_REDUCTION:
            convexity = (f"nothing assumed: cross-entropy and {cert['uniformity']} are convex in the logits, which are "
                         f"linear in the certified weights, and the forget losses are combined by "
                         f"{_reduction_words(cert['forget_reduction'])}, convex and nondecreasing in each, so mu = "
                         f"lambda exactly")
        else:
            convexity = (f"assumed, not measured: the forget loss's Hessian norm is at most P_K="
                         f"{cert['grad_lipschitz_forget']:.4g} (Assumption 1), so mu = lambda - theta P_K")
        return (f"{convexity}; M_theta(D) is the minimiser over ||w|| <= C={cert['norm_bound']:.6g}; the protection "
                f"of D_f is that optimum's measured uniformity (forget CD), not part of the guarantee")
    return (f"assumed, not measured: gradient Lipschitz P_K={cert['grad_lipschitz_forget']:.4g}, "
            f"P_A={cert['grad_lipschitz_retain']:.4g}; Hessian Lipschitz F_K={cert['hessian_lipschitz_forget']:.4g}, "
            f"F_A={cert['hessian_lipschitz_retain']:.4g}; ||M_theta(D)|| <= C={cert['norm_bound']:.6g}")


def _reduction_words(reduction: dict) -> str:
    if reduction["name"] == "smoothmax":
        return f"a smooth maximum at temperature {reduction['temperature']:.4g}"
    if reduction["name"] == "cvar":
        return (f"a smoothed CVaR of the largest {reduction['fraction']:.4g} at temperature "
                f"{reduction['temperature']:.4g}")
    return reduction["name"]


def _measured_line(cert: dict) -> str:
    steps = cert["steps"]
    if cert["bound"] == "residual":
        return (f"measured by the provider at the noise-free weights (checked here for consistency; --audit "
                f"remeasures): ||r||={max(s['stationarity'] for s in steps):.3g} plus a float64 rounding floor "
                f"{max(s['rounding_floor'] for s in steps):.3g}, nu={steps[-1]['multiplier']:.6g}, "
                f"||w||={steps[-1]['weights_norm']:.12g}")
    return (f"measured by the provider (checked here for consistency, not re-measured): lambda_min(H)="
            f"{min(s['lam_min_measured'] for s in steps):.6g} ({steps[0]['spectrum_method']}), "
            f"||H||={cert['hessian_norm']:.6g}, G={cert['gradient_bound']:.6g}, "
            f"residual={max(s['residual'] for s in steps):.3g}")


def trusted_line(cert: dict) -> str:
    """The constants no public check can re-measure (the weights are noised, the provider's measurements were made
    at the private noise-free weights, lambda is a setting the weights do not reveal): verify checks them for
    consistency with one another only, so a self-consistent edit of them (lambda = mu = 1 with Delta and sigma
    recomputed shrank Delta 100x) passes every check but --audit, which re-measures them."""
    steps = cert["steps"]
    if cert["bound"] == "residual":
        values = (f"lambda={cert['lam']:.6g} (and mu={cert['mu']:.6g} from it), ||r||="
                  f"{max(s['stationarity'] for s in steps):.3g}, rounding floor {max(s['rounding_floor'] for s in steps):.3g}, "
                  f"nu={steps[-1]['multiplier']:.6g}, ||w||={steps[-1]['weights_norm']:.12g}")
    else:
        values = (f"lambda={cert['lam']:.6g}, lambda_min(H)={min(s['lam_min_measured'] for s in steps):.6g}, "
                  f"||H||={cert['hessian_norm']:.6g}, G={cert['gradient_bound']:.6g}, "
                  f"residual={max(s['residual'] for s in steps):.3g}")
    return (f"taken on trust (only --audit re-measures them, at the private noise-free weights; Delta and sigma "
            f"follow from them): {values}")


def condition_lines(cert: dict) -> list[str]:
    """What the guarantee is conditional on beyond the stated constants: a Lanczos lambda_min is an estimate,
    not a bound (Ritz values lie above the true minimum)."""
    if cert["bound"] == "residual":
        return []
    lanczos = [i for i, step in enumerate(cert["steps"], 1) if step["spectrum_method"] == "lanczos"]
    if not lanczos:
        return []
    line = (f"conditional on: lambda_min(H) at step(s) {', '.join(map(str, lanczos[:10]))} being at least the "
            f"Lanczos estimate minus its margin: Ritz values lie above the true minimum, so a lower true "
            f"lambda_min makes Delta too small and the guarantee void")
    return [line]
