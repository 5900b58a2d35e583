"""The extreme eigenvalues of the Pareto objective's Hessian H, measured rather than assumed.

The certificates' Delta divides by lambda + lambda_min(H), and the theorems assume lambda > ||H||; the
paper's default lambda_min = 0 ("by convex approximation") is refuted on MNIST LogReg with the square
uniformity loss (lambda_min = -0.062 at A(D)). So:

- Alg 2 holds H explicitly and takes its eigenvalues (`exact_spectrum`, float64 `eigvalsh`): exact.
- Algs 3-4 see H only through Hessian-vector products and run `lanczos_spectrum`: m steps of Lanczos with
  full reorthogonalisation. Its extreme Ritz values lie inside the spectrum (the smallest Ritz value is
  >= lambda_min, the largest |Ritz value| <= ||H||), so they are optimistic; each is widened by its residual
  ||H y - theta y|| (an eigenvalue lies within it) and by a stated safety margin (`margin` x the largest
  |Ritz value|). This is an estimate with a margin, not a bound; the certificate says which one was used.

Lanczos is written here (a dozen lines of torch) instead of calling ARPACK (scipy's eigsh) so that its cost
is a fixed number of full-data HVPs on whatever device the model is on.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ttp_lightning.core import stopping

EXACT, LANCZOS = "exact_eigvalsh", "lanczos"


@dataclass(frozen=True)
class Spectrum:
    """lambda_min(H) and ||H|| as used by the certificate (after residual and margin), with the raw values."""

    lam_min: float          # a value at or below lambda_min(H) (exact, or Ritz - residual - margin)
    norm: float             # a value at or above ||H|| (exact, or max |Ritz| + residual + margin)
    method: str
    ritz_min: float         # the raw extreme values the two come from
    ritz_max: float
    iterations: int = 0
    margin: float = 0.0

    def as_dict(self) -> dict:
        return {"lam_min_measured": self.lam_min, "hessian_norm_measured": self.norm, "spectrum_method": self.method,
                "ritz_min": self.ritz_min, "ritz_max": self.ritz_max, "lanczos_iterations": self.iterations,
                "spectrum_margin": self.margin}


def exact_spectrum(hessian: torch.Tensor, shift: float = 0.0) -> Spectrum:
    """Extreme eigenvalues of an explicit symmetric matrix minus `shift` (H from H + lambda I; float64 eigvalsh)."""
    values = torch.linalg.eigvalsh(hessian.double())
    low, high = values[0].item() - shift, values[-1].item() - shift
    return Spectrum(lam_min=low, norm=max(abs(low), abs(high)), method=EXACT, ritz_min=low, ritz_max=high)


def lanczos_tridiagonal(matvec: Callable[[torch.Tensor], torch.Tensor], start: torch.Tensor,
                        iterations: int) -> tuple[torch.Tensor, float]:
    """m steps of Lanczos from `start` with full reorthogonalisation: the tridiagonal T (float64) and the last
    off-diagonal beta_m. Ritz values are eig(T); Ritz vector i has residual |beta_m s_{m,i}|, s the
    eigenvectors of T. The basis is kept in host memory in `start`'s dtype (m x d numbers), the products
    run wherever `matvec` runs."""
    basis = torch.empty(iterations, len(start), dtype=start.dtype)
    basis[0] = (start / start.norm()).cpu()
    alphas, betas, beta = [], [], 0.0
    for step in range(iterations):
        stopping.check()
        product = matvec(basis[step].to(start.device)).to(start.dtype).cpu()
        alpha = torch.dot(product, basis[step]).item()
        alphas.append(alpha)
        done = basis[: step + 1]
        for _ in range(2):  # full reorthogonalisation, twice ("twice is enough")
            product -= done.T @ (done @ product)
        beta = product.norm().item()
        if step == iterations - 1 or beta <= 1e-10 * max(1.0, abs(alpha)):
            break
        betas.append(beta)
        basis[step + 1] = product / beta
    size = len(alphas)
    tridiagonal = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if size > 1:
        off = torch.tensor(betas[: size - 1], dtype=torch.float64)
        tridiagonal += torch.diag(off, 1) + torch.diag(off, -1)
    return tridiagonal, beta


def lanczos_spectrum(matvec: Callable[[torch.Tensor], torch.Tensor], dim: int, iterations: int,
                     margin: float, generator: torch.Generator | None = None,
                     device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> Spectrum:
    """lambda_min(H) and ||H|| from `iterations` products with H (see the module docstring)."""
    start = torch.randn(dim, generator=generator, dtype=torch.float64).to(device, dtype)
    tridiagonal, beta = lanczos_tridiagonal(matvec, start, iterations)
    values, vectors = torch.linalg.eigh(tridiagonal)
    residuals = (beta * vectors[-1, :]).abs()
    low, high = values[0].item(), values[-1].item()
    scale = max(abs(low), abs(high))
    lam_min = low - residuals[0].item() - margin * scale
    norm = max(abs(low) + residuals[0].item(), abs(high) + residuals[-1].item()) + margin * scale
    return Spectrum(lam_min=lam_min, norm=norm, method=LANCZOS, ritz_min=low, ritz_max=high,
                    iterations=len(values), margin=margin)
