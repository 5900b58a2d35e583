"""The stochastic inverse-Hessian estimator of Thm. `asymptotically_unbiased_estimator` (Algs 3-4)."""

import math
from collections.abc import Callable

import torch

from ttp_lightning.core import stopping
from ttp_lightning.core.errors import TTPUserError

# (part, V (k, d), keep (k,) bool) -> row i: a fresh Hessian sample times V[i] for the kept rows, zeros elsewhere;
# the samples of every row are drawn, kept or not, so the random stream does not depend on the rank.
SampleHVP = Callable[[str, torch.Tensor, torch.Tensor], torch.Tensor]
Reduce = Callable[[torch.Tensor, str], torch.Tensor]  # (tensor, "sum" | "max") -> that over the ranks


def _local(tensor: torch.Tensor, op: str) -> torch.Tensor:
    return tensor


def stochastic_inverse_hvp(gradient: torch.Tensor, sample_hvp: SampleHVP, theta: float, lam: float, scale: float,
                           depth: int, repeats: int = 1, generator: torch.Generator | None = None,
                           slack: float = 10.0, rank: int = 0, world: int = 1, reduce: Reduce = _local) -> torch.Tensor:
    """Estimate (H + lambda I)^{-1} g with H = theta H_K + (1 - theta) H_A.

    Each of `repeats` chains runs P_0 = g, P_t = g + (I - H_t / J) P_{t-1} for `depth` steps, where H_t is
    a forget-sample Hessian plus lambda I / (2 theta) with probability theta, else a retain-sample Hessian
    plus lambda I / (2 (1 - theta)); E[H_t] = H + lambda I. Returns mean(P_n) / J. The chains advance
    together: at each step `sample_hvp(part, V, keep)` gets the (k, d) rows of the chains that drew `part`, and
    each row is multiplied by its own Hessian sample.
    While every I - H_t / J is a contraction, ||P_t|| <= (t + 1) ||g||; a chain past `slack` times that has
    diverged (J below ||H_t + share I||, or lambda too small for a non-convex H) and ends in an error that
    says what to change.

    Split over `world` processes, this one (`rank`) advances chains rank, rank + world, ...; every process
    draws every chain's random numbers from the same `generator` (so chain i sees what it would on one
    process), `reduce` sums the chains and takes the largest norm over the processes.
    """
    if not 0.0 < theta < 1.0:
        raise TTPUserError(f"method.theta={theta} is not allowed for the estimator; choose a value in (0, 1)")
    if scale <= 0 or depth < 1 or repeats < 1:
        raise TTPUserError(f"estimator needs J > 0, n >= 1, b >= 1 (got J={scale}, n={depth}, b={repeats})")
    grad_norm = gradient.norm().item()
    chains = gradient.expand(repeats, -1).clone()
    mine = torch.arange(repeats) % world == rank
    mine_here = mine.to(chains.device)
    shares = {"forget": lam / (2 * theta), "retain": lam / (2 * (1 - theta))}
    for step in range(depth):
        stopping.check()
        from_forget = torch.rand(repeats, generator=generator) < theta
        curvature = torch.zeros_like(chains)
        for part, drew in (("forget", from_forget), ("retain", ~from_forget)):
            rows = drew.nonzero().flatten()
            if len(rows):
                on = rows.to(chains.device)
                curvature[on] = sample_hvp(part, chains[on], mine[rows]) + shares[part] * chains[on]
        chains = gradient + chains - curvature / scale
        local = torch.cat([chains[mine_here].norm(dim=1), chains.new_zeros(1)]).max().reshape(1)
        norm = reduce(torch.nan_to_num(local, nan=math.inf), "max").item()
        if not math.isfinite(norm) or norm > slack * (step + 2) * grad_norm:
            raise TTPUserError(
                f"inverse-Hessian estimator diverged at step {step + 1} (||P|| = {norm:.3g}); raise "
                f"method.lam (now {lam}) so H + lambda I is positive definite, or method.scale (J, now "
                f"{scale:.4g}) above ||H + lambda I||"
            )
    return reduce(chains[mine_here].sum(dim=0), "sum") / (repeats * scale)
