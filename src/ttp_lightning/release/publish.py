"""Writing a release: model.safetensors (no pickle), config.json and README.md, each by an atomic rename."""

import json
import shutil
from pathlib import Path

from torch import nn

from ttp_lightning.config.allowlist import FormatError, model_spec, record
from ttp_lightning.config.build import Part
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.core.files import atomic_tensors, atomic_text, atomic_write, sha256_of
from ttp_lightning.release.card import method_theta
from ttp_lightning.release.format import (
    CARD,
    CERTIFIED_PREFIX,
    CONFIG,
    CONFIG_FIELDS,
    RELEASE_FORMAT,
    WEIGHTS,
)
from ttp_lightning.version import __version__


def architecture_of(model: Part) -> dict | None:
    """The registered model config and settings that rebuild the network; None for a model config that is
    not one of conf/model (load model.safetensors into your own module then)."""
    try:
        return model_spec(model)
    except TTPUserError:
        return None


def write_hub_release(net: nn.Module, output_dir: str | Path, architecture: dict | None, info, protection: dict,
                      card: str, certified_file: str | None = None, folder_name: str = "release") -> Path:
    """Write <folder_name>/{model.safetensors, config.json, README.md} (each through a temporary file;
    release/, or release_not_protected/ when the release gate failed); returns the folder. A certified release's model.safetensors is already there (the certificate's file,
    under the classifier's `backbone.` names; `certified_file`) and is kept as it is; Alg 4's, which names
    one file per request, gets model.safetensors as a copy of the last one."""

    folder = Path(output_dir) / folder_name
    prefix = CERTIFIED_PREFIX if certified_file else ""
    config = {
        "format": RELEASE_FORMAT,
        "library": {"name": "ttp_lightning", "version": __version__},
        "architecture": architecture,  # architecture_of(the run's model config)
        "input": {"channels": info.channels, "image_size": info.image_size, "num_classes": info.num_classes,
                  "mean": list(info.mean), "std": list(info.std), "pixel_range": [0.0, 1.0], "layout": "NCHW",
                  "class_names": list(info.names())},
        "weights": {"file": WEIGHTS, "sha256": "0" * 64, "prefix": prefix},  # the hash once the file is written
        "protection": protection,
    }
    readable(config)  # before any file: a release is written only in the form load_released reads
    folder.mkdir(parents=True, exist_ok=True)
    # a certified release keeps the file its certificate hashes (Alg 4's last request file is copied)
    if certified_file and certified_file != WEIGHTS:
        atomic_write(folder / WEIGHTS, lambda tmp: shutil.copyfile(folder / certified_file, tmp))
    elif not certified_file:
        backbone = getattr(net, "backbone", net)
        atomic_tensors(folder / WEIGHTS, backbone.state_dict(), metadata={"format": "pt"})
    config["weights"]["sha256"] = sha256_of(folder / WEIGHTS)
    atomic_text(folder / CONFIG, json.dumps(config, indent=2))
    atomic_text(folder / CARD, card)
    return folder


def readable(config: dict) -> None:
    """config.json as read_release_config will read it (JSON, then every field against the format's allowlist);
    a TTPUserError naming the first field it would refuse (a bug or a setting the format cannot hold: nothing is
    written)."""
    try:
        record(CONFIG_FIELDS)(json.loads(json.dumps(config)), "")
    except (FormatError, ValueError) as exc:
        raise TTPUserError(f"refusing to write a release that load_released could not read: {exc}") from None


PER_IMAGE_KEYS = ("forget_worst_conf_dist", "forget_exposed", "forget_robust_worst_conf_dist", "forget_robust_exposed",
                  "forget_proven_worst_conf_dist", "forget_proven_share_05", "forget_proven_share_10",
                  "forget_proven_radius_min", "forget_proven_radius_median")


def release_protection(results: dict, method_label: str, settings) -> dict:
    """config.json's `protection`: what was done and whether the release gate passed (for people, and
    `verify robust` compares its claims with what it recomputes; never used to build anything)."""
    gate = results["release_gate"]
    after = results["metrics"][results["method"]]
    return {"method": results["method"], "label": method_label, "theta": method_theta(results, settings.method),
            "forget_size": results["data"]["forget_size"], "forget_fingerprint": results["data"]["forget_fingerprint"],
            "forget_set_digest": results["data"].get("forget_set_digest"),
            "forget_conf_dist": after.get("forget_conf_dist"), "test_acc": after.get("test_acc"),
            "certificate": "certificate" in results, "experiment": results["experiment"],
            "protected": gate["passed"],
            "release_gate": {k: gate.get(k) for k in ("conf_dist_at_most", "require", "gamma", "reasons",
                                                      "min_proven_radius")},
            "per_image": {"gamma": gate["gamma"], **{k: after.get(k) for k in PER_IMAGE_KEYS},
                          **_bound_record(results, settings.bounds)}}


def _bound_record(results: dict, bounds) -> dict:
    """How the method's proven bounds were computed (verify robust recomputes its claims the same way), with
    the run's typed `bounds` settings."""
    used = (results.get("proof_bound") or {}).get(results["method"]) or {}
    return {"bound": used.get("bound"), "intermediate": used.get("intermediate"), "slope_steps": used.get("slope_steps"),
            "radius_step": float(bounds.radius_step), "max_radius": float(bounds.max_radius)}
