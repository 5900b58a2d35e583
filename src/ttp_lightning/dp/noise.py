"""The Gaussian noise of a certified release, drawn from a secret seed through a cryptographic stream.

A release's noise must be unpredictable to anyone who reads the public files: a seed that appears in a
config or a certificate (or a small one that can be enumerated) lets an attacker regenerate the noise and
subtract it, recovering the noise-free, forget-set-dependent weights. So:

- the seed is 32 bytes from the operating system's CSPRNG (`secrets`), fresh for every release, and only
  ever written to the provider's private audit record;
- the noise is a deterministic function of the seed (so an auditor holding the record can reproduce the
  release): SHAKE-256 in counter mode (block i = SHAKE-256(domain || seed || i)) gives uniform 53-bit
  fractions, and the Box-Muller transform turns pairs of them into standard normals, in float64.

The stream index separates several releases made from one seed (Alg 4 releasing every request).
"""

import hashlib
import math
import secrets

import numpy as np
import torch

SEED_BYTES = 32
DOMAIN = b"ttp_lightning/certified-release-noise/v1"
_BLOCK_PAIRS = 1 << 16  # normals come in pairs; 2**16 pairs (1 MiB of stream) per SHAKE call


def fresh_seed() -> str:
    """A new 256-bit secret seed (hex) from the operating system's CSPRNG."""
    return secrets.token_hex(SEED_BYTES)


def _uniform_pairs(seed: bytes, stream: int, block: int, pairs: int) -> tuple[np.ndarray, np.ndarray]:
    """Two arrays of `pairs` uniforms, the first in (0, 1], the second in [0, 1), from one SHAKE block."""
    label = DOMAIN + seed + stream.to_bytes(8, "big") + block.to_bytes(8, "big")
    words = np.frombuffer(hashlib.shake_256(label).digest(16 * pairs), dtype=">u8").astype(np.uint64)
    fractions = (words >> np.uint64(11)).astype(np.float64) * 2.0**-53  # 53 random bits, [0, 1)
    return 1.0 - fractions[0::2], fractions[1::2]


def gaussian_noise(seed_hex: str, size: int, stream: int = 0) -> torch.Tensor:
    """`size` independent N(0, 1) draws (float64) determined by the secret seed and the stream index."""
    seed = bytes.fromhex(seed_hex)
    if len(seed) != SEED_BYTES:
        raise ValueError(f"a noise seed has {SEED_BYTES} bytes ({2 * SEED_BYTES} hex digits), got {len(seed)}")
    pairs_needed = math.ceil(size / 2)
    chunks = []
    for block in range(math.ceil(pairs_needed / _BLOCK_PAIRS)):
        pairs = min(_BLOCK_PAIRS, pairs_needed - block * _BLOCK_PAIRS)
        u1, u2 = _uniform_pairs(seed, stream, block, pairs)
        radius = np.sqrt(-2.0 * np.log(u1))
        angle = 2.0 * np.pi * u2
        chunks.append(np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1).reshape(-1))
    normals = np.concatenate(chunks) if chunks else np.zeros(0)
    return torch.from_numpy(normals[:size].copy())


def noise_norm_bound(sigma: float, dim: int, failure_probability: float = 1e-9) -> float:
    """A bound that ||N(0, sigma^2 I_d)||_2 exceeds with probability at most `failure_probability`:
    sigma (sqrt(d) + sqrt(2 ln(1/p))) (the norm is 1-Lipschitz and E||z|| <= sqrt(d); Gaussian
    concentration), i.e. sigma sqrt(d) (1 + t) with t = sqrt(2 ln(1/p) / d)."""
    return sigma * (math.sqrt(dim) + math.sqrt(2.0 * math.log(1.0 / failure_probability)))
