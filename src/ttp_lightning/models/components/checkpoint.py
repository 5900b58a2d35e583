"""A provider's own trained weights as A(D): `model.checkpoint=PATH` (a plain state_dict, a safetensors file
or a Lightning .ckpt) loaded into the configured architecture.

A checkpoint is a user file: it is read with safetensors or `torch.load(weights_only=True)` only, so loading
it never runs code, and whatever is in it must be a mapping of names to tensors. Its names are matched to
the network's (the backbone's own names, the same names under `backbone.`, or either under one or two
prefixes that every key shares, as a LightningModule's `model.` or `net.`); anything that does not fit is one
error line naming the missing, unexpected and mis-shaped keys.
"""

from pathlib import Path

import torch
from torch import nn

from ttp_lightning.core.errors import TTPUserError

SHOWN = 3  # keys named per kind in a mismatch error


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def read_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint file: safetensors (by suffix) or a torch file loaded weights-only, either a
    state_dict or a dict holding one under `state_dict` (Lightning's .ckpt)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise TTPUserError(f"model.checkpoint={str(path)!r} does not exist or is not a file")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 -- any unreadable or hostile file is one error line
        raise TTPUserError(f"model.checkpoint={str(path)!r} cannot be read as safetensors or as a weights-only "
                           f"torch file ({_first_line(exc)}); save the model's state_dict with torch.save or "
                           "safetensors") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not state:
        raise TTPUserError(f"model.checkpoint={str(path)!r} holds no state_dict (found a "
                           f"{type(state).__name__}); save model.state_dict()")
    bad = [key for key, value in state.items() if not isinstance(key, str) or not isinstance(value, torch.Tensor)]
    if bad:
        raise TTPUserError(f"model.checkpoint={str(path)!r} entry {bad[0]!r} is not a tensor; a state_dict maps "
                           "parameter names to tensors")
    return state


def _strip(state: dict, prefix: str) -> dict:
    return {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}


def _candidates(state: dict) -> list[dict]:
    """The checkpoint's names as they are, and without `backbone.` or up to two prefixes that every key
    shares (a LightningModule's attribute names)."""
    found, current = [state], state
    for _ in range(3):
        heads = {key.split(".", 1)[0] for key in current}
        if len(heads) != 1 or not all("." in key for key in current):
            break
        current = _strip(current, f"{heads.pop()}.")
        found.append(current)
    return found


def _mismatch(state: dict, expected: dict) -> tuple[list, list, list]:
    missing = [key for key in expected if key not in state]
    unexpected = [key for key in state if key not in expected]
    shapes = [f"{key} (checkpoint {list(state[key].shape)}, model {list(expected[key].shape)})"
              for key in expected if key in state and state[key].shape != expected[key].shape]
    return missing, unexpected, shapes


def _listed(label: str, keys: list) -> str:
    more = f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
    return f"{len(keys)} {label} ({', '.join(map(str, keys[:SHOWN]))}{more})"


def match_state(state: dict, backbone: nn.Module, path: str, model_name: str) -> dict:
    """The checkpoint's tensors under the backbone's names, or TTPUserError naming what does not fit."""
    expected = backbone.state_dict()
    best = None
    for candidate in _candidates(state):
        for names in (candidate, _strip(candidate, "backbone.")):
            problems = _mismatch(names, expected)
            if not any(problems):
                return names
            score = sum(map(len, problems))
            if names and (best is None or score < best[0]):
                best = (score, problems)
    missing, unexpected, shapes = best[1]
    parts = [_listed(label, keys) for label, keys in (("missing keys", missing), ("unexpected keys", unexpected),
                                                      ("mis-shaped keys", shapes)) if keys]
    raise TTPUserError(f"model.checkpoint={path!r} does not fit model {model_name}: {'; '.join(parts)}; choose "
                       "the model config (model=..., its settings) the checkpoint was trained with")


def first_non_finite(tensors: dict[str, torch.Tensor]) -> str | None:
    """The name of the first floating-point tensor holding a NaN or an infinity, or None."""
    return next((key for key, value in tensors.items() if value.is_floating_point() and not torch.isfinite(value).all()),
                None)


def load_checkpoint(net: nn.Module, path: str | Path, model_name: str = "") -> None:
    """Load `path` into `net` (a Classifier: its backbone) or fail with one error line."""
    backbone = getattr(net, "backbone", net)
    state = match_state(read_checkpoint(path), backbone, str(path), model_name)
    bad = first_non_finite(state)
    if bad is not None:
        raise TTPUserError(f"checkpoint {str(path)!r} holds non-finite values (NaN or infinity) in {bad!r}; it is no "
                           "usable model (was it saved after its training diverged?)")
    with torch.no_grad():
        backbone.load_state_dict({key: value.to(backbone.state_dict()[key].dtype) for key, value in state.items()})
