"""What a provider publishes: `release/model.safetensors` (no pickle), `release/config.json` (what rebuilds
the architecture and what inputs it expects) and `release/MODEL_CARD.md`; and `load_released(DIR)`.

The weights are the network's own state_dict (the names the provider's checkpoint had, no `backbone.`
prefix), so code that loaded the original model loads the protected one unchanged. (A certified release keeps
the file its certificate hashes, under the classifier's `backbone.` names; config.json says so in
`weights.prefix`.) The network takes
pixels in [0, 1] normalised by `input.mean` / `input.std` from config.json (all zeros and ones when the
model was given raw pixels, data.normalize=false); `load_released` returns a module that normalises itself.

config.json is untrusted input to whoever loads it: it may only name a registered model config (files under
conf/model) with typed settings, checked by the same allowlist as a certificate, and nothing in it is ever
imported or instantiated; the weights file must match the SHA-256 it records.
"""

import json
import math
import shutil
import warnings
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from ttp_lightning.certificates.schema import (
    SchemaError,
    boolean,
    check_model_spec,
    count,
    finite,
    fraction,
    hex64,
    list_of,
    model_settings,
    model_spec,
    name,
    one_of,
    optional,
    record,
)
from ttp_lightning.cli_checks import CONF_DIR
from ttp_lightning.dataset_info import DatasetInfo
from ttp_lightning.errors import TTPUserError
from ttp_lightning.files import atomic_tensors, atomic_text, atomic_write, sha256_of
from ttp_lightning.ibp.uniformity import MAX_RADIUS, RADIUS_STEP
from ttp_lightning.models.components import build_classifier
from ttp_lightning.models.components.checkpoint import first_non_finite
from ttp_lightning.protection import KINDS, masking_note
from ttp_lightning.version import __version__

RELEASE_FORMAT = "ttp_lightning.release/2"  # /2: the certified radius and the bound that gave the claims
EARLIER_FORMATS = ("ttp_lightning.release/1",)  # read as well (loading, and verify robust without radius claims)
CERTIFIED_PREFIX = "backbone."  # the names in a certified release's weights (the classifier's own)
WEIGHTS, CONFIG, CARD = "model.safetensors", "config.json", "MODEL_CARD.md"
MAX_CONFIG_BYTES = 1 << 20

PIXEL_RANGE = [0.0, 1.0]  # what a release's network takes (before its own normalisation); nothing else is allowed
MIN_STD = 1e-6  # a std below this is 0 to float32 arithmetic (1e-300 made every output NaN)
MAX_NORMALISATION = 1e3  # |mean| and std above this are no normalisation of [0, 1] pixels


def _text(value, key, longest: int = 200):
    """A short string shown to people (a class name, a label), never used as a path or code."""
    if isinstance(value, str) and len(value) <= longest:
        return value
    return name(value, key)  # fails with the usual message


def _reason(value, key):
    return _text(value, key, longest=4000)


def _pixel_range(value, key):
    if value != PIXEL_RANGE or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise SchemaError(f"{key}={str(value)[:80]} is not allowed; a release's network takes pixels in "
                          f"{PIXEL_RANGE} (the only range this format has)")
    return [float(v) for v in value]


def _architecture(value, key):
    return None if value is None else check_model_spec(value, key)


INPUT_FIELDS = {"channels": count, "image_size": count, "num_classes": count, "mean": list_of(finite, 4),
                "std": list_of(finite, 4), "pixel_range": _pixel_range, "layout": one_of("NCHW"),
                "class_names": list_of(_text, 100_000)}
# config.json `protection`: what the run measured and decided. Typed so that a checker reads numbers, never NaN
# (a claim is compared with what verify recomputes; it never decides a pass)
PER_IMAGE_FIELDS_1 = {"gamma": finite, "forget_worst_conf_dist": optional(finite), "forget_exposed": optional(count),
                      "forget_robust_worst_conf_dist": optional(finite), "forget_robust_exposed": optional(count),
                      "forget_certified_worst_conf_dist": optional(finite),
                      "forget_certified_share_05": optional(fraction), "forget_certified_share_10": optional(fraction)}
MAX_SLOPE_STEPS = 1000  # a checker recomputes the claims with the stated steps: a bounded amount of work


def _slope_steps(value, key):
    if count(value, key) > MAX_SLOPE_STEPS:
        raise SchemaError(f"{key}={value} is not allowed; expected an integer in [0, {MAX_SLOPE_STEPS}]")
    return value


PER_IMAGE_FIELDS = {**PER_IMAGE_FIELDS_1,
                    "forget_certified_radius_min": optional(finite), "forget_certified_radius_median": optional(finite),
                    "bound": optional(one_of("linear", "interval")), "intermediate": optional(one_of("crown", "ibp")),
                    "slope_steps": optional(_slope_steps), "radius_step": finite, "max_radius": finite}


def _require(value, key):
    kinds = list_of(one_of(*KINDS), len(KINDS))(value, key)  # the CDs a release gate can require
    if len(set(kinds)) != len(kinds) or "clean" not in kinds:
        raise SchemaError(f"{key}={kinds} is not allowed; a gate requires clean and each kind once")
    return kinds


GATE_FIELDS_1 = {"conf_dist_at_most": finite, "require": _require, "gamma": finite, "reasons": list_of(_reason, 100)}


def _positive(value, key):
    if not finite(value, key) > 0:
        raise SchemaError(f"{key}={value} is not allowed; expected a number > 0")
    return value


GATE_FIELDS = {**GATE_FIELDS_1, "min_certified_radius": optional(_positive)}


def _config_fields(gate: dict, per_image: dict, form: str) -> dict:
    protection = {
        "method": name, "label": _text, "theta": optional(fraction), "forget_size": count, "forget_fingerprint": hex64,
        "forget_set_digest": optional(hex64), "forget_conf_dist": optional(finite), "test_acc": optional(fraction),
        "certified": boolean, "experiment": _text, "protected": boolean, "release_gate": record(gate),
        "per_image": record(per_image)}
    return {"format": one_of(form), "architecture": _architecture, "input": record(INPUT_FIELDS),
            "weights": record({"file": one_of(WEIGHTS), "sha256": hex64, "prefix": one_of("", "backbone.")}),
            "protection": record(protection), "library": record({"name": one_of("ttp_lightning"), "version": _text})}


CONFIG_FIELDS = _config_fields(GATE_FIELDS, PER_IMAGE_FIELDS, RELEASE_FORMAT)
EARLIER_FIELDS = {form: _config_fields(GATE_FIELDS_1, PER_IMAGE_FIELDS_1, form) for form in EARLIER_FORMATS}


class NotProtectedWarning(UserWarning):
    """load_released on a folder whose config.json says its release gate failed (`"protected": false`)."""


def architecture_of(model_cfg: DictConfig) -> dict | None:
    """The registered model config and settings that rebuild the network; None for a model config that is
    not one of conf/model (load model.safetensors into your own module then)."""
    try:
        return model_spec(model_cfg)
    except TTPUserError:
        return None


def write_hub_release(net: nn.Module, output_dir: str | Path, architecture: dict | None, info, protection: dict,
                      card: str, certified_file: str | None = None, folder_name: str = "release") -> Path:
    """Write <folder_name>/{model.safetensors, config.json, MODEL_CARD.md} (each through a temporary file;
    release/, or release_not_protected/ when the release gate failed); returns the folder. A certified release's model.safetensors is already there (the certificate's file,
    under the classifier's `backbone.` names; `certified_file`) and is kept as it is; Alg 4's, which names
    one file per request, gets model.safetensors as a copy of the last one."""

    folder = Path(output_dir) / folder_name
    folder.mkdir(parents=True, exist_ok=True)
    # a certified release keeps the file its certificate hashes (Alg 4's last request file is copied)
    prefix = CERTIFIED_PREFIX if certified_file else ""
    if certified_file and certified_file != WEIGHTS:
        atomic_write(folder / WEIGHTS, lambda tmp: shutil.copyfile(folder / certified_file, tmp))
    elif not certified_file:
        backbone = getattr(net, "backbone", net)
        atomic_tensors(folder / WEIGHTS, backbone.state_dict(), metadata={"format": "pt"})
    config = {
        "format": RELEASE_FORMAT,
        "library": {"name": "ttp_lightning", "version": __version__},
        "architecture": architecture,  # architecture_of(the run's model config)
        "input": {"channels": info.channels, "image_size": info.image_size, "num_classes": info.num_classes,
                  "mean": list(info.mean), "std": list(info.std), "pixel_range": [0.0, 1.0], "layout": "NCHW",
                  "class_names": list(info.names())},
        "weights": {"file": WEIGHTS, "sha256": sha256_of(folder / WEIGHTS), "prefix": prefix},
        "protection": protection,
    }
    atomic_text(folder / CONFIG, json.dumps(config, indent=2))
    atomic_text(folder / CARD, card)
    return folder


def read_release_config(folder: str | Path) -> dict:
    """config.json of a release, every field checked (SchemaError naming the first bad one)."""
    path = Path(folder).expanduser() / CONFIG
    if not path.is_file():
        raise TTPUserError(f"{str(path)!r} does not exist; a release folder holds {WEIGHTS}, {CONFIG}, {CARD}")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise SchemaError(f"{str(path)!r} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        document = json.loads(path.read_text())
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, an integer of thousands of digits
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).splitlines()[0]
        raise SchemaError(f"{str(path)!r} is not JSON this format can hold ({reason})") from None
    form = document.get("format") if isinstance(document, dict) else None
    try:
        return record(EARLIER_FIELDS.get(form, CONFIG_FIELDS) if isinstance(form, str) else CONFIG_FIELDS)(document, "")
    except SchemaError as exc:  # name the file, as every other line about it does
        raise SchemaError(f"{str(path)!r} {exc}") from None


def not_protected_line(folder: str | Path, config: dict) -> str | None:
    """The sentence saying a release's own config.json calls it not protected (None when it says protected)."""
    if config["protection"]["protected"]:
        return None
    return (f"{str(folder)!r} is NOT a protected release: its config.json says \"protected\": false (its release "
            "gate failed; MODEL_CARD.md gives the reasons)")


MAX_IMAGE_SIZE, MAX_CHANNELS = 4096, 4
MAX_PARAMETERS = 2_000_000_000  # a weights file above this many numbers is refused before anything is built


def check_input(given: dict, folder: Path) -> None:
    """config.json `input` values the network can be built and run with: mean and std of one value per channel,
    every std positive, a class name per class, sizes within MAX_*; one error line naming the bad value."""
    where = f"{str(folder / CONFIG)!r} input"
    if not 1 <= given["channels"] <= MAX_CHANNELS:
        raise SchemaError(f"{where}.channels={given['channels']} is not allowed; choose 1..{MAX_CHANNELS}")
    if not 1 <= given["image_size"] <= MAX_IMAGE_SIZE:
        raise SchemaError(f"{where}.image_size={given['image_size']} is not allowed; choose 1..{MAX_IMAGE_SIZE}")
    for key in ("mean", "std"):
        if len(given[key]) != given["channels"]:
            raise SchemaError(f"{where}.{key}={given[key]} is not allowed; give one value per channel "
                              f"({given['channels']})")
    if not all(MIN_STD <= value <= MAX_NORMALISATION for value in given["std"]):
        raise SchemaError(f"{where}.std={given['std']} is not allowed; every value must be in [{MIN_STD:g}, "
                          f"{MAX_NORMALISATION:g}]")
    if not all(abs(value) <= MAX_NORMALISATION for value in given["mean"]):
        raise SchemaError(f"{where}.mean={given['mean']} is not allowed; every value must be in "
                          f"[-{MAX_NORMALISATION:g}, {MAX_NORMALISATION:g}]")
    if given["num_classes"] < 2 or len(given["class_names"]) != given["num_classes"]:
        raise SchemaError(f"{where}.num_classes={given['num_classes']} is not allowed; a classifier has at least "
                          f"2 classes, one class name each ({len(given['class_names'])} given)")


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
    unprotected = not_protected_line(folder, config)
    if unprotected:
        warnings.warn(f"{unprotected}; loading it anyway", NotProtectedWarning, stacklevel=2)
    return network_of(folder, config, device)


def network_of(folder: Path, config: dict, device: str | torch.device = "cpu") -> nn.Module:
    """load_released's network from a config.json already read by read_release_config."""
    if config["architecture"] is None:
        raise TTPUserError(f"{str(folder)!r} was built from a model config that is not part of ttp_lightning; "
                           f"load {WEIGHTS} into your own module (its input is described in {CONFIG})")
    weights = folder / WEIGHTS
    if not weights.is_file() or sha256_of(weights) != config["weights"]["sha256"]:
        raise TTPUserError(f"{str(weights)!r} is missing or is not the file {CONFIG} names (SHA-256 differs)")
    spec = config["architecture"]
    model_cfg = OmegaConf.load(CONF_DIR / "model" / f"{spec['name']}.yaml")
    for key, value in model_settings(spec).items():
        model_cfg[key] = value
    for key in ("pretrained", "pretrained_file", "checkpoint"):  # nothing downloaded or read but the release
        if key in model_cfg:
            model_cfg[key] = False if key == "pretrained" else None
    given = config["input"]
    check_input(given, folder)
    info = DatasetInfo(given["num_classes"], given["channels"], given["image_size"], tuple(given["mean"]),
                       tuple(given["std"]), class_names=tuple(given["class_names"]))
    prefix = config["weights"]["prefix"]
    try:
        with torch.device("meta"):  # sizes from config.json cost no memory here
            shapes = {prefix + k: tuple(v.shape) for k, v in build_classifier(model_cfg, info).backbone.state_dict().items()}
    except Exception as exc:  # noqa: BLE001 -- settings the architecture cannot take: one line
        raise TTPUserError(f"{str(folder / CONFIG)!r} architecture {spec} cannot be built ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    total = sum(math.prod(shape) for shape in shapes.values())
    if total > MAX_PARAMETERS:
        raise TTPUserError(f"{str(folder / CONFIG)!r} describes a network of {total:,} numbers, above the "
                           f"{MAX_PARAMETERS:,} a release may hold")
    tensors = read_weights(weights, shapes)
    net = build_classifier(model_cfg, info)
    net.backbone.load_state_dict({k[len(prefix):]: v for k, v in tensors.items()})
    return net.to(device).eval()


# ------------------------------------------------------------------------------------------- model card
ATTACKS_TEXT = ("An adversary who holds these weights perturbs a protected image to recover a confident "
                "prediction (the forget confidence distance it reaches; higher is worse). `certified` rows are "
                "upper bounds no perturbation within that radius can exceed; `relearn` rows finetune the weights "
                "on labelled images without the forget set (the test split, a sample of the retain data) for "
                "that many steps at several learning rates, and show the worst of them:")
CERTIFICATE_TEXT = ("The certificate and the hashes of the released weights are in the run's release/ folder "
                    "(`python -m ttp_lightning.verify`).")
LIMITATIONS = (
    ("- Protection covers the listed forget images (matched by their pixels) and is measured on them; images "
     "that differ from them (other photos of the same person, crops, recompression) are not covered unless "
     "they were in the forget set."),
    ("- The attack table is empirical: stronger attacks than those run here may do better. The certified bound is "
     "a proof, but only for the L-inf ball of the stated radius around each forget image; beyond it nothing is "
     "certified."),
    ("- Open weights can be finetuned: the `relearn` rows show how far a short finetune on public images brings "
     "the forget images' predictions back; no change to the weights alone can rule that out."),
    "- Accuracy elsewhere was measured on the test set named above only.",
    "- The forget images themselves are not in this release; only their fingerprint is.",
)
LOAD_LINE = 'model = ttp_lightning.load_released("release")  # [N, C, H, W] pixels in [0, 1] -> logits'
PLAIN_LOADING = (f'or with safetensors alone: `load_file("release/{WEIGHTS}")` into the architecture (config.json '
                 "`architecture`), inputs normalised by config.json `input.mean` / `input.std`.")

def effect_rows(gamma: float, threshold: float) -> dict:
    """The model card's Effect table: {key: (row label, how a stage's metrics give its cell)}, in order (verify
    robust reads the cells back from a card with the same labels)."""
    radius = f"{gamma:g}/255"
    rows = [("retain accuracy", "retain_acc", True), ("test accuracy", "test_acc", True),
            ("forget accuracy", "forget_acc", True),
            ("forget confidence distance (0 = uniform softmax)", "forget_conf_dist", False),
            ("forget confidence distance under attack", "forget_robust_conf_dist", False),
            ("test confidence distance", "test_conf_dist", False),
            ("worst forget image's confidence distance", "forget_worst_conf_dist", False),
            (f"worst forget image under attack ({radius})", "forget_robust_worst_conf_dist", False),
            (f"worst forget image, certified bound ({radius})", "forget_certified_worst_conf_dist", False),
            (f"smallest certified radius (1/255, CD <= {threshold:g})", "forget_certified_radius_min", None),
            (f"median certified radius (1/255, CD <= {threshold:g})", "forget_certified_radius_median", None)]
    counts = [(f"forget images with confidence distance > {threshold:g}", "forget_exposed", False),
              (f"forget images with confidence distance > {threshold:g} under attack ({radius})",
               "forget_robust_exposed", False),
              (f"forget images certified <= 0.05 within {radius}", "forget_certified_share_05", True),
              (f"forget images certified <= 0.1 within {radius}", "forget_certified_share_10", True)]
    table = {key: (label, lambda values, key=key, pct=pct: _metric(values, key, pct)) for label, key, pct in rows}
    table.update({key: (label, lambda values, key=key, pct=pct: _count(values, key, pct)) for label, key, pct in counts})
    return table


def card_cells(card: str, gamma: float, threshold: float) -> dict[str, str]:
    """{key: the "after" cell} of each Effect row a model card holds (rows are found by their labels)."""
    labels = {f"| {label} |": key for key, (label, _) in effect_rows(gamma, threshold).items()}
    cells = {}
    for line in card.splitlines():
        for start, key in labels.items():
            if line.startswith(start):
                parts = [part.strip() for part in line.strip().strip("|").split("|")]
                cells[key] = parts[-1] if len(parts) == 3 else "?"
    return cells


def _metric(values: dict, key: str, percent: bool | None) -> str:
    """A cell: a percentage, a CD to 4 places, or (percent None) a radius as it is."""
    value = values.get(key)
    if not isinstance(value, (int, float)):
        return "-"
    if percent is None:
        return f"{value:g}"
    return f"{100 * value:.2f} %" if percent else f"{value:.4f}"


def _count(values: dict, key: str, percent: bool) -> str:
    value = values.get(key)
    if not isinstance(value, (int, float)):
        return "-"
    return f"{100 * value:.0f} %" if percent else f"{value:d}"


def model_card(results: dict, method_label: str, attack_table: str | None, certificate_line: str | None) -> str:
    """MODEL_CARD.md: whether the release gate passed, what was done and why, the settings, the measured
    effect (per image too) and the limitations."""
    config, data, metrics, gate = results["config"], results["data"], results["metrics"], results["release_gate"]
    method = results["method"]
    before, after = metrics.get("pretrain_original", metrics["pretrain"]), metrics[method]
    theta = method_theta(results)
    gamma = f"{gate['gamma']:g}/255"
    table = "\n".join(f"| {label} | {cell(before)} | {cell(after)} |"
                      for label, cell in effect_rows(gate["gamma"], gate["conf_dist_at_most"]).values())
    source = config["model"].get("checkpoint")
    start = "the provider's checkpoint (model.checkpoint)" if source else "a model pretrained by ttp_lightning"
    what = (f"This model was rewritten with ttp_lightning ({method_label}) so that it is maximally uncertain (a "
            f"uniform softmax) on a protected forget set of {data['forget_size']} images while keeping its "
            f"accuracy elsewhere (test-time privacy). It starts from {start}. ")
    what += ("Every forget image passed the release gate (" + _gate_rule(gate) + "): anyone who runs it on a "
             "protected image gets no confident prediction for it." + _unrequired_sentence(gate, data["forget_size"])
             + _radius_sentence(after, gate) if gate["passed"] else
             "It did NOT pass the release gate (" + _gate_rule(gate) + "): do not publish it as protected.")
    settings = [
        f"- method: {method} ({method_label})" + (f", theta = {theta}{_theta_source(config)}" if theta is not None else ""),
        (f"- data: {config['data']['name']}; training set {data['train_size']} images, test set "
         f"{data['test_size']} images"),
        (f"- forget set: {data['forget_size']} images ({data.get('forget_from_test', 0)} from outside the "
         f"training data); SHA-256 fingerprint `{data['forget_fingerprint']}`"),
    ]
    title = f"# Model card: {results['experiment']} ({method_label})" + ("" if gate["passed"] else ": NOT PROTECTED")
    lines = [title, ""]
    if not gate["passed"]:
        lines += ["## Not protected", "", *[f"- {reason}" for reason in gate["reasons"]], "",
                  (f"{len(gate['failing_images'])} forget image(s) failed; the run's results.json lists them "
                   "(`release_gate.failing_images`, `forget_per_image`)." if gate["failing_images"] else
                   "Every forget image met the per-image bound; the reasons above concern how the model was "
                   "obtained, so it is not released as protected either."), ""]
    lines += ["## What was done and why", "", what,
              "", "## Settings", "", *settings, "", "## Effect", "", "| measure | before | after |", "|---|---|---|",
              table, "", PER_IMAGE_TEXT.format(gamma=gamma), ""]
    if attack_table:
        lines += ["## Attacks on the forget set", "", ATTACKS_TEXT, "", "```", attack_table, "```", ""]
    if certificate_line:
        lines += ["## Certificate", "", certificate_line, "", CERTIFICATE_TEXT, ""]
    masking = masking_note((results.get("attack_checks") or {}).get(method), data["forget_size"])
    lines += ["## Limitations", "", *LIMITATIONS, *([f"- The attacked CDs: {masking}."] if masking else []), "",
              "## Loading", "", "```python", "import ttp_lightning", "",
              LOAD_LINE, "```", "", PLAIN_LOADING, ""]
    return "\n".join(lines)


def _unrequired_sentence(gate: dict, forget_size: int) -> str:
    """Passed at the images, not within the radius: say it where a publisher reads."""
    above = gate.get("unrequired_above") or {}
    if not above:
        return ""
    parts = " and ".join(f"{count} of {forget_size} images have {kind} confidence distance above "
                         f"{gate['conf_dist_at_most']:g}" for kind, count in above.items())
    return (f" It is NOT protected against an attacker who may change a protected image by up to "
            f"{gate['gamma']:g}/255 per pixel: {parts} within that radius (the gate did not require it; "
            f"`release_gate.require=[clean,{','.join(above)}]` would have refused this release).")


def _radius_sentence(after: dict, gate: dict) -> str:
    """What is proven within a radius, from the smallest certified radius (nothing when it is 0 or unknown)."""
    least = after.get("forget_certified_radius_min")
    if not least:
        return ""
    return (f" Provably, from these weights alone: no change of up to {least:g}/255 per pixel to any protected "
            f"image brings its confidence distance above {gate['conf_dist_at_most']:g} (the smallest certified "
            "radius below).")


def _gate_rule(gate: dict) -> str:
    return (f"every forget image's {' / '.join(gate['require'])} confidence distance at most "
            f"{gate['conf_dist_at_most']:g}" + (f", within {gate['gamma']:g}/255" if len(gate["require"]) > 1 else ""))


PER_IMAGE_TEXT = ("Per image: a release is judged by its worst protected image, not the mean. The certified bound is "
                  "an upper bound on the confidence distance anywhere within {gamma} (L-inf, pixels in [0, 1]) of "
                  "each forget image, computed from these weights alone (linear bound propagation, CROWN, never "
                  "looser than interval bounds); an image's certified radius is the largest L-inf radius at which "
                  "that bound is at most the gate's threshold. Anyone holding the weights and the images can "
                  "recompute both: `python -m ttp_lightning.verify robust RELEASE_DIR IMAGES_DIR`.")
PER_IMAGE_KEYS = ("forget_worst_conf_dist", "forget_exposed", "forget_robust_worst_conf_dist", "forget_robust_exposed",
                  "forget_certified_worst_conf_dist", "forget_certified_share_05", "forget_certified_share_10",
                  "forget_certified_radius_min", "forget_certified_radius_median")


def _theta_source(config: dict) -> str:
    return " (chosen by the theta rule: method.theta=auto)" if config["method"].get("theta") == "auto" else ""


def method_theta(results: dict):
    """The theta the method used: the one its rule chose (`method.theta=auto`), else the configured one."""
    return results["metrics"][results["method"]].get("theta", results["config"]["method"].get("theta"))


def release_protection(results: dict, method_label: str) -> dict:
    """config.json's `protection`: what was done and whether the release gate passed (for people, and
    `verify robust` compares its claims with what it recomputes; never used to build anything)."""
    gate = results["release_gate"]
    after = results["metrics"][results["method"]]
    return {"method": results["method"], "label": method_label, "theta": method_theta(results),
            "forget_size": results["data"]["forget_size"], "forget_fingerprint": results["data"]["forget_fingerprint"],
            "forget_set_digest": results["data"].get("forget_set_digest"),
            "forget_conf_dist": after.get("forget_conf_dist"), "test_acc": after.get("test_acc"),
            "certified": "certificate" in results, "experiment": results["experiment"],
            "protected": gate["passed"],
            "release_gate": {k: gate.get(k) for k in ("conf_dist_at_most", "require", "gamma", "reasons",
                                                      "min_certified_radius")},
            "per_image": {"gamma": gate["gamma"], **{k: after.get(k) for k in PER_IMAGE_KEYS},
                          **_bound_record(results)}}


def _bound_record(results: dict) -> dict:
    """How the method's certified bounds were computed (verify robust recomputes its claims the same way)."""
    used = (results.get("certified_bound") or {}).get(results["method"]) or {}
    bounds = results["config"].get("bounds") or {}
    return {"bound": used.get("bound"), "intermediate": used.get("intermediate"), "slope_steps": used.get("slope_steps"),
            "radius_step": float(bounds.get("radius_step", RADIUS_STEP)),
            "max_radius": float(bounds.get("max_radius", MAX_RADIUS))}


