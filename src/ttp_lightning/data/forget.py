"""Choosing the forget set D_f (inside the training set, or test instances from outside it), and fingerprinting it."""

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from ttp_lightning.errors import TTPUserError


def read_index_file(path: str | Path) -> torch.Tensor:
    """Forget indices from .txt/.csv (whitespace or comma separated), .json (a list), .npy or .pt."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise TTPUserError(f"forget index file {str(path)!r} does not exist")
    try:
        if path.suffix == ".json":
            values = json.loads(path.read_text())
        elif path.suffix == ".npy":
            values = np.load(path).tolist()
        elif path.suffix == ".pt":
            values = torch.load(path, weights_only=True).tolist()
        else:
            values = [int(tok) for tok in path.read_text().replace(",", " ").split()]
        indices = torch.as_tensor(values, dtype=torch.long).flatten()
    except (ValueError, TypeError, json.JSONDecodeError) as exc:
        raise TTPUserError(f"forget index file {str(path)!r} is not a list of integers ({exc})") from exc
    return indices


def select_forget(num_train: int, size: int | None, seed: int, indices_file: str | None,
                  pool: str = "training set") -> torch.Tensor:
    """Sorted forget indices into `pool` (the training set, or the test set for data.forget.source=test):
    from a file, or `size` drawn at random by `seed`."""
    if indices_file:
        indices = read_index_file(indices_file)
        if len(indices) == 0:
            raise TTPUserError(f"forget index file {indices_file!r} is empty")
        bad = indices[(indices < 0) | (indices >= num_train)]
        if len(bad):
            raise TTPUserError(
                f"forget index {int(bad[0])} out of range; allowed 0..{num_train - 1} ({pool} size {num_train})"
            )
        if len(indices.unique()) != len(indices):
            raise TTPUserError(f"forget index file {indices_file!r} repeats an index")
        return indices.sort().values
    if size is None or not 1 <= int(size) < num_train:
        raise TTPUserError(
            f"data.forget.size={size} is not allowed; choose 1..{num_train - 1} ({pool} size {num_train})"
        )
    order = torch.randperm(num_train, generator=torch.Generator().manual_seed(int(seed)))
    return order[: int(size)].sort().values


def select_forget_requests(num_train: int, requests: list, seed: int) -> list[torch.Tensor]:
    """Disjoint, sorted index sets, one per forget request in order (Alg 4): an integer draws that many
    not-yet-requested training instances at random (by `seed`), a string names an index file."""
    if not requests:
        raise TTPUserError("data.forget.requests is empty; give a list of sizes or index files, e.g. [50,50]")
    taken = torch.zeros(num_train, dtype=torch.bool)
    generator = torch.Generator().manual_seed(int(seed))
    selected = []
    for number, request in enumerate(requests, start=1):
        if isinstance(request, str):
            indices = select_forget(num_train, None, seed, request)
            if taken[indices].any():
                raise TTPUserError(f"forget request {number} ({request!r}) repeats index "
                                   f"{int(indices[taken[indices]][0])} of an earlier request")
        else:
            free = (~taken).nonzero().flatten()
            if isinstance(request, bool) or not isinstance(request, int) or not 1 <= request < len(free):
                raise TTPUserError(f"forget request {number} = {request!r} is not allowed; choose a size in "
                                   f"1..{len(free) - 1} or an index file")
            indices = free[torch.randperm(len(free), generator=generator)[:request]].sort().values
        taken[indices] = True
        selected.append(indices)
    if taken.all():
        raise TTPUserError("data.forget.requests cover the whole training set; the retain set would be empty")
    return selected


def fingerprint(*tensors: torch.Tensor) -> str:
    """SHA-256 over the raw bytes of tensors: identifies data and forget selections in cache keys."""
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()
