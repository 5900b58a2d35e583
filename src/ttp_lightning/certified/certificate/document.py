"""Certified releases: what is public (weights + certificate.json) and what stays private (the audit record),
written and read. The checks anyone can run on a certificate are in checks.py, the arithmetic of its bound in
arithmetic.py, what a certificate that passes them proves in statement.py.

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
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from ttp_lightning.certified.certificate.format import AUDIT_FORMAT, CERTIFICATE_FORMAT
from ttp_lightning.core.files import atomic_tensors, atomic_text, sha256_of

CERTIFICATE_FILE, AUDIT_FILE = "certificate.json", "audit.json"
RELEASE_DIR, PRIVATE_DIR = "release", "private"
START_FILE, NOISE_FREE_FILE = "start.safetensors", "noise_free.safetensors"


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
