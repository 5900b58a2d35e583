"""Releasing a certified model (weights + certificate JSON) and checking a certificate independently."""

import hashlib
import json
import os
from pathlib import Path

import torch

from ttp_lightning.certify.bounds import exact_newton_sensitivity
from ttp_lightning.certify.mechanism import noise_sigma

CERTIFICATE_FILE, WEIGHTS_FILE = "certificate.json", "model.pt"
RELATIVE_TOLERANCE = 1e-6


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def release(net: torch.nn.Module, certificate: dict, output_dir: str | Path) -> tuple[Path, Path]:
    """Write the weights and, naming their SHA-256, the certificate (each via a temporary file)."""
    output_dir = Path(output_dir)
    weights = output_dir / WEIGHTS_FILE
    torch.save(net.state_dict(), weights.with_suffix(".tmp"))
    os.replace(weights.with_suffix(".tmp"), weights)
    document = {**certificate, "weights_file": WEIGHTS_FILE, "weights_sha256": sha256_of(weights)}
    cert = output_dir / CERTIFICATE_FILE
    cert.with_suffix(".tmp").write_text(json.dumps(document, indent=2))
    os.replace(cert.with_suffix(".tmp"), cert)
    return cert, weights


def recomputed_sensitivity(cert: dict) -> float:
    if cert["algorithm"] != "alg2_exact_newton":
        raise ValueError(f"unknown algorithm {cert['algorithm']!r}")
    return exact_newton_sensitivity(cert["norm_bound"], cert["theta"], cert["hessian_lipschitz_forget"],
                                    cert["hessian_lipschitz_retain"], cert["lam"], cert["lam_min"])


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
    required, mechanism = noise_sigma(sensitivity, cert["epsilon"], cert["delta"])
    if mechanism != cert["mechanism"]:
        failures.append(f"epsilon={cert['epsilon']:.6g} calls for the {mechanism} calibration, "
                        f"the certificate names {cert['mechanism']}")
    if cert["sigma"] < required * (1 - RELATIVE_TOLERANCE):
        failures.append(f"sigma={cert['sigma']:.6g} is smaller than the {required:.6g} that "
                        f"(Delta={sensitivity:.6g}, epsilon={cert['epsilon']:.6g}, delta={cert['delta']:.3g}) require")
    return failures
