"""Releasing a certified model (weights + certificate JSON) and checking a certificate independently."""

import hashlib
import json
import os
from pathlib import Path

import torch

from ttp_lightning.certify.bounds import (
    estimator_depth,
    estimator_scale_b,
    estimator_sensitivity,
    exact_newton_sensitivity,
)
from ttp_lightning.certify.mechanism import noise_sigma
from ttp_lightning.report import write_weights

CERTIFICATE_FILE = "certificate.json"
RELATIVE_TOLERANCE = 1e-6
EXACT, ESTIMATOR, ONLINE = "alg2_exact_newton", "alg3_hessian_estimator", "alg4_online"


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def release(net: torch.nn.Module, certificate: dict, output_dir: str | Path) -> tuple[Path, Path]:
    """Write the weights and, naming their SHA-256, the certificate (each via a temporary file)."""
    output_dir = Path(output_dir)
    weights = write_weights(net, output_dir)
    document = {**certificate, "weights_file": weights.name, "weights_sha256": sha256_of(weights)}
    cert = output_dir / CERTIFICATE_FILE
    cert.with_suffix(".tmp").write_text(json.dumps(document, indent=2))
    os.replace(cert.with_suffix(".tmp"), cert)
    return cert, weights


def scale_b(cert: dict) -> float:
    """B of the estimator bound, the largest over the (forget, retain) set sizes of every Newton step."""
    return max(estimator_scale_b(cert["theta"], cert["lam"], cert["grad_lipschitz_forget"],
                                 cert["grad_lipschitz_retain"], forget, retain)
               for forget, retain in zip(cert["forget_sizes"], cert["retain_sizes"], strict=True))


def required_depth(cert: dict) -> int:
    """The n that eq. `hessian_estimator_bound` requires: 2 B / (lambda + lambda_min) ln(B b / (lambda + lambda_min))."""
    return estimator_depth(scale_b(cert), cert["lam"], cert["lam_min"], cert["repeats"])


def recomputed_sensitivity(cert: dict) -> float:
    """Delta from the constants the certificate states, by its algorithm's formula."""
    algorithm = cert["algorithm"]
    if algorithm == EXACT:
        return exact_newton_sensitivity(cert["norm_bound"], cert["theta"], cert["hessian_lipschitz_forget"],
                                        cert["hessian_lipschitz_retain"], cert["lam"], cert["lam_min"])
    if algorithm in (ESTIMATOR, ONLINE):
        return estimator_sensitivity(
            cert["norm_bound"], cert["theta"], cert["hessian_lipschitz_forget"], cert["hessian_lipschitz_retain"],
            cert["grad_lipschitz_forget"], cert["grad_lipschitz_retain"], cert["lam"], cert["lam_min"],
            cert["gradient_bound"], scale_b(cert), cert["zeta_min"], cert["num_params"], cert["rho"],
            cert["repeats"])
    raise ValueError(f"unknown algorithm {algorithm!r}")


def calibrated_sensitivity(cert: dict, sensitivity: float) -> float:
    """What the noise is calibrated to: Delta, or for Alg 4 the paper's Delta / k over k requests
    (its sigma = Delta / (k epsilon) sqrt(2 ln(1.25 / delta)))."""
    return sensitivity / len(cert["forget_sizes"]) if cert["algorithm"] == ONLINE else sensitivity


def check_certificate(cert: dict, weights_path: str | Path) -> list[str]:
    """Failures (empty when the certificate holds): weights hash, Delta from the stated constants, and
    sigma at least what (Delta, epsilon, delta) require under the stated mechanism."""
    failures = []
    actual = sha256_of(weights_path)
    if actual != cert["weights_sha256"]:
        failures.append(f"weights SHA-256 {actual[:16]}... differs from the certificate's "
                        f"{cert['weights_sha256'][:16]}...")
    sensitivity = recomputed_sensitivity(cert)
    if abs(sensitivity - cert["sensitivity"]) > RELATIVE_TOLERANCE * sensitivity:
        failures.append(f"Delta recomputed from the stated constants is {sensitivity:.6g}, "
                        f"the certificate says {cert['sensitivity']:.6g}")
    if cert["algorithm"] in (ESTIMATOR, ONLINE) and cert["depth"] < required_depth(cert):
        failures.append(f"depth n={cert['depth']} is below the n={required_depth(cert)} the estimator bound requires")
    required, mechanism = noise_sigma(calibrated_sensitivity(cert, sensitivity), cert["epsilon"], cert["delta"])
    if mechanism != cert["mechanism"]:
        failures.append(f"epsilon={cert['epsilon']:.6g} calls for the {mechanism} calibration, "
                        f"the certificate names {cert['mechanism']}")
    if cert["sigma"] < required * (1 - RELATIVE_TOLERANCE):
        failures.append(f"sigma={cert['sigma']:.6g} is smaller than the {required:.6g} that "
                        f"(Delta={sensitivity:.6g}, epsilon={cert['epsilon']:.6g}, delta={cert['delta']:.3g}) require")
    return failures
