"""`load_released(DIR)`: a release's network rebuilt from its config.json (nothing in it imported or
instantiated) with the weights whose SHA-256 it records, normalising its own input."""

import math
import warnings
from pathlib import Path

import torch
from torch import nn

from ttp_lightning.config.allowlist import model_settings
from ttp_lightning.config.build import Part, registered_file
from ttp_lightning.core.dataset_info import DatasetInfo
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.core.files import sha256_of
from ttp_lightning.models.components import build_classifier
from ttp_lightning.models.components.checkpoint import first_non_finite
from ttp_lightning.release.format import (
    CONFIG,
    EARLIER_FORMATS,
    RELEASE_FORMAT,
    WEIGHTS,
    check_input,
    not_protected_line,
    read_release_config,
)


class EarlierFormatWarning(UserWarning):
    """load_released on a release written in an earlier config.json format (read in the current one's words)."""


class NotProtectedWarning(UserWarning):
    """load_released on a folder whose config.json says its release gate failed (`"protected": false`)."""


MAX_PARAMETERS = 2_000_000_000  # a weights file above this many numbers is refused before anything is built
MAX_BYTES_PER_NUMBER, MAX_HEADER_BYTES = 8, 100 << 20  # float64 at most; safetensors caps its header at 100 MB


def read_weights(weights: Path, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The tensors of a weights file whose header names exactly `shapes` (checked before any tensor is read),
    every value finite; one error line otherwise."""
    from safetensors import safe_open

    try:
        with safe_open(str(weights), framework="pt") as handle:
            found = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118 -- a safe_open handle, not a dict
            if found != shapes:
                differ = sorted(set(found) ^ set(shapes)) or [k for k in shapes if found[k] != shapes[k]]
                raise TTPUserError(f"{str(weights)!r} does not fit the architecture in {CONFIG} ({differ[0]!r}: "
                                   f"{found.get(differ[0])} in the file, {shapes.get(differ[0])} in the network)")
            tensors = {key: handle.get_tensor(key) for key in found}
    except TTPUserError:
        raise
    except Exception as exc:  # noqa: BLE001 -- a corrupt header or body: one line naming the file
        raise TTPUserError(f"{str(weights)!r} cannot be read as safetensors ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    bad = first_non_finite(tensors)
    if bad is not None:
        raise TTPUserError(f"{str(weights)!r} holds non-finite values (NaN or infinity) in {bad!r}; it is no "
                           "usable model")
    return tensors


def load_released(folder: str | Path, device: str | torch.device = "cpu") -> nn.Module:
    """The released classifier, ready for inference: it takes [N, C, H, W] pixels in [0, 1], normalises
    them itself and returns logits (eval mode, on `device`). Every value of config.json is checked, the
    network is first built without memory (the meta device) and compared with the weights file's header, and
    the weights must be finite, before anything is allocated; each failure is one error line.

    The SHA-256 in config.json proves only that model.safetensors is the file config.json was written with:
    whoever can replace one can rewrite the other. It is no signature; trust the folder as far as you trust where
    it came from (a signed commit, a hub's own signing)."""

    folder = Path(folder).expanduser()
    config = read_release_config(folder)
    if config["format"] in EARLIER_FORMATS:  # read, and said: its claims were written in that format's words
        warnings.warn(f"{str(folder)!r} is a {config['format']} release, read as {RELEASE_FORMAT} (its claims' "
                      "words and bounds are that format's)", EarlierFormatWarning, stacklevel=2)
    unprotected = not_protected_line(folder, config)
    if unprotected:
        warnings.warn(f"{unprotected}; loading it anyway", NotProtectedWarning, stacklevel=2)
    return network_of(folder, config, device)


def network_of(folder: Path, config: dict, device: str | torch.device = "cpu") -> nn.Module:
    """load_released's network from a config.json already read by read_release_config."""
    weights = folder / WEIGHTS
    if not weights.is_file():
        raise TTPUserError(f"{str(weights)!r} is missing; a release folder holds {WEIGHTS}, {CONFIG} and its card")
    model, info, shapes = architecture_of_release(folder, config)
    check_size(weights, sum(math.prod(shape) for shape in shapes.values()))
    if sha256_of(weights) != config["weights"]["sha256"]:
        raise TTPUserError(f"{str(weights)!r} is not the file {CONFIG} names (SHA-256 differs)")
    tensors = read_weights(weights, shapes)
    net = build_classifier(model, info)
    prefix = config["weights"]["prefix"]
    net.backbone.load_state_dict({k[len(prefix):]: v for k, v in tensors.items()})
    return net.to(device).eval()


def architecture_of_release(folder: Path, config: dict) -> tuple[Part, DatasetInfo, dict[str, tuple[int, ...]]]:
    """(the model Part, the data's description, {tensor name: shape} of the weights file) from config.json alone:
    the network is built on the meta device (no memory), and one that would hold more than MAX_PARAMETERS numbers
    is refused."""
    if config["architecture"] is None:
        raise TTPUserError(f"{str(folder)!r} was built from a model config that is not part of ttp_lightning; "
                           f"load {WEIGHTS} into your own module (its input is described in {CONFIG})")
    spec = config["architecture"]
    model_cfg = registered_file("model", spec["name"])
    for key, value in model_settings(spec).items():
        model_cfg[key] = value
    for key in ("pretrained", "pretrained_file", "checkpoint"):  # nothing downloaded or read but the release
        if key in model_cfg:
            model_cfg[key] = False if key == "pretrained" else None
    model = Part.of(model_cfg)
    given = config["input"]
    check_input(given, folder)
    info = DatasetInfo(given["num_classes"], given["channels"], given["image_size"], tuple(given["mean"]),
                       tuple(given["std"]), class_names=tuple(given["class_names"]))
    prefix = config["weights"]["prefix"]
    try:
        with torch.device("meta"):  # sizes from config.json cost no memory here
            shapes = {prefix + k: tuple(v.shape) for k, v in build_classifier(model, info).backbone.state_dict().items()}
    except Exception as exc:  # noqa: BLE001 -- settings the architecture cannot take: one line
        raise TTPUserError(f"{str(folder / CONFIG)!r} architecture {spec} cannot be built ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    total = sum(math.prod(shape) for shape in shapes.values())
    if total > MAX_PARAMETERS:
        raise TTPUserError(f"{str(folder / CONFIG)!r} describes a network of {total:,} numbers, above the "
                           f"{MAX_PARAMETERS:,} a release may hold")
    return model, info, shapes


def check_size(weights: Path, numbers: int) -> None:
    """A weights file no larger than `numbers` float64 values and safetensors' largest header, checked before a byte
    of it is hashed or read (a 3 GB sparse file was hashed whole first)."""
    largest = numbers * MAX_BYTES_PER_NUMBER + MAX_HEADER_BYTES
    size = weights.stat().st_size
    if size > largest:
        raise TTPUserError(f"{str(weights)!r} is {size:,} bytes; the network {CONFIG} describes holds {numbers:,} "
                           f"numbers, at most {largest:,} bytes as safetensors")
