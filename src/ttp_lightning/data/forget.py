"""Choosing the forget set D_f (inside the training set, or test instances from outside it), and fingerprinting it."""

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from ttp_lightning.core.errors import TTPUserError


def read_index_file(path: str | Path) -> torch.Tensor:
    """Forget indices from .txt/.csv (whitespace or comma separated), .json (a list), .npy or .pt (an
    integer tensor, loaded weights-only). Only integers are accepted: a float or boolean entry is an error,
    never truncated."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise TTPUserError(f"forget index file {str(path)!r} does not exist")
    try:
        if path.suffix == ".json":
            indices = _integer_list(json.loads(path.read_text()), path)
        elif path.suffix == ".npy":
            indices = _integer_array(np.load(path, allow_pickle=False), path)
        elif path.suffix == ".pt":
            indices = _integer_tensor(torch.load(path, weights_only=True, map_location="cpu"), path)
        else:
            indices = torch.as_tensor([int(tok) for tok in path.read_text().replace(",", " ").split()],
                                      dtype=torch.long)
    except TTPUserError:
        raise
    except Exception as exc:  # any unreadable or hostile file is one error line
        raise TTPUserError(f"forget index file {str(path)!r} is not a list of integers "
                           f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from exc
    return indices.flatten()


def _not_integers(path: Path, found: str) -> TTPUserError:
    return TTPUserError(f"forget index file {str(path)!r} holds {found}; it must hold integer indices only")


def _integer_list(values, path: Path) -> torch.Tensor:
    if not isinstance(values, list):
        raise _not_integers(path, f"a JSON {type(values).__name__}")
    bad = [v for v in values if type(v) is not int]  # bool is a subclass of int: excluded here
    if bad:
        raise _not_integers(path, f"the value {bad[0]!r}")
    return torch.as_tensor(values, dtype=torch.long)


def _integer_array(array: np.ndarray, path: Path) -> torch.Tensor:
    if array.dtype.kind not in "iu":
        raise _not_integers(path, f"an array of dtype {array.dtype}")
    return torch.as_tensor(array.astype(np.int64))


def _integer_tensor(value, path: Path) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise _not_integers(path, f"a {type(value).__name__}, not a tensor")
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise _not_integers(path, f"a tensor of dtype {value.dtype}")
    return value.to(torch.long)


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


def set_digest(hashes) -> str:
    """SHA-256 over the sorted, distinct hex digests in `hashes` (one per line): a set's name, order-free."""
    return hashlib.sha256("\n".join(sorted(set(hashes))).encode()).hexdigest()
