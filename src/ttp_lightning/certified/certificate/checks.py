"""The checks anyone can run on a certificate without trusting it (`verify certificate`): finite values, every
constant in the range where the bounds are defined, the theorems' hypotheses against the measured values it
states, the estimator's depth, scale and residual, Delta from the constants, epsilon, sigma and the mechanism,
the released weights' hashes and norm; and when a certificate that passes them is vacuous."""

import math
from pathlib import Path

from safetensors import SafetensorError

from ttp_lightning.certified.certificate.arithmetic import (
    ESTIMATOR,
    EXACT,
    ONLINE,
    RELATIVE_TOLERANCE,
    composed_releases,
    delta_allowed,
    implied_global_norm_bound,
    is_vacuous,
    recomputed_sensitivity,
    relatively_close,
    released_norm_limit,
    required_depth,
    scale_b,
    step_distance_bound,
    training_set_size,
)
from ttp_lightning.certified.certificate.document import load_weights
from ttp_lightning.certified.maths.reductions import Reduction
from ttp_lightning.certified.maths.residual import NotConvex, strong_convexity
from ttp_lightning.core.files import sha256_of
from ttp_lightning.dp.mechanism import implied_epsilon
from ttp_lightning.dp.sensitivity import hypothesis_violations

EXACT_RESIDUAL_LIMIT = 1e-6  # a Cholesky solve whose residual is above this is no exact Newton step


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
        if not relatively_close(cert["mu"], mu) or cert["mu_rule"] != rule:
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
        if not relatively_close(bound, step["distance_bound"]):
            failures.append(f"step {i}: the distance bound recomputes to {bound:.6g}, the step says "
                            f"{step['distance_bound']:.6g}")
    gradient = max(step["gradient_norm"] for step in cert["steps"])
    if not relatively_close(cert["gradient_bound"], gradient):
        failures.append(f"G={cert['gradient_bound']:.6g} is not the largest measured gradient norm {gradient:.6g}")
    return failures


def _hypothesis_failures(cert: dict) -> list[str]:
    if cert["bound"] == "residual":
        return _residual_failures(cert)
    failures = []
    lam, lam_min = cert["lam"], cert["lam_min"]
    measured_min = min(step["lam_min_measured"] for step in cert["steps"])
    if not relatively_close(lam_min, min(cert["lam_min_stated"], measured_min)):
        failures.append(f"lambda_min={lam_min:.6g} is not min(stated {cert['lam_min_stated']:.6g}, measured "
                        f"{measured_min:.6g}): Delta must use the smaller")
    measured_norm = max(step["hessian_norm_measured"] for step in cert["steps"])
    if not relatively_close(cert["hessian_norm"], measured_norm):
        failures.append(f"||H||={cert['hessian_norm']:.6g} is not the largest measured {measured_norm:.6g}")
    gradient = max(step["gradient_norm"] for step in cert["steps"])
    if not relatively_close(cert["gradient_bound"], gradient):
        failures.append(f"G={cert['gradient_bound']:.6g} is not the largest measured gradient norm {gradient:.6g}")
    failures += hypothesis_violations(cert["theta"], lam, lam_min, cert["hessian_norm"],
                                      cert["grad_lipschitz_forget"], cert["grad_lipschitz_retain"])
    expected_c = implied_global_norm_bound(cert["norm_bound_config"], cert["projection"], len(cert["parameter_names"]))
    if not relatively_close(cert["norm_bound"], expected_c):
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
            formula is not None and not relatively_close(formula, cert["sensitivity_formula"])):
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
