"""config.json of a release, read as untrusted input: its allowlist (the same typed fields as a certificate),
the file names, reading it and checking what a network is given against it."""

from pathlib import Path

from ttp_lightning.assess.protection import KINDS, require_problem
from ttp_lightning.config.allowlist import (
    FormatError,
    boolean,
    check_model_spec,
    count,
    finite,
    fraction,
    hex64,
    list_of,
    name,
    one_of,
    optional,
    record,
    strict_json,
)
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.core.words import BothWords, upgraded

# /3: the claims' proven values are those of bounds sound for the float32 network (bounds/rounding), and the bound-based
# words are "proven" (certified was the (epsilon, delta) certificate's word too); /2: the proven (then "certified")
# radius and the bound that gave the claims (exact for the float64 network); /1: neither
# /4: the card is README.md with a model hub's YAML metadata (release/card.py), where /1-/3 wrote MODEL_CARD.md
RELEASE_FORMAT = "ttp_lightning.release/4"
EARLIER_FORMATS = ("ttp_lightning.release/1", "ttp_lightning.release/2")  # read as well, in their own words
EXACT_CLAIMS = EARLIER_FORMATS  # formats whose proven claims were computed for the exact (float64) network
CERTIFIED_PREFIX = "backbone."  # the names in a certified release's weights (the classifier's own)
WEIGHTS, CONFIG, CARD = "model.safetensors", "config.json", "README.md"
LEGACY_CARD = "MODEL_CARD.md"  # the card's name up to release/3 (/3 is read in this format's words)
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
        raise FormatError(f"{key}={str(value)[:80]} is not allowed; a release's network takes pixels in "
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
                      "forget_proven_worst_conf_dist": optional(finite),
                      "forget_proven_share_05": optional(fraction), "forget_proven_share_10": optional(fraction)}
MAX_SLOPE_STEPS = 1000  # a checker recomputes the claims with the stated steps: a bounded amount of work


def _slope_steps(value, key):
    if count(value, key) > MAX_SLOPE_STEPS:
        raise FormatError(f"{key}={value} is not allowed; expected an integer in [0, {MAX_SLOPE_STEPS}]")
    return value


PER_IMAGE_FIELDS = {**PER_IMAGE_FIELDS_1,
                    "forget_proven_radius_min": optional(finite), "forget_proven_radius_median": optional(finite),
                    "bound": optional(one_of("linear", "interval")), "intermediate": optional(one_of("crown", "ibp")),
                    "slope_steps": optional(_slope_steps), "radius_step": finite, "max_radius": finite}


def _require(value, key):
    kinds = list_of(one_of(*KINDS), len(KINDS))(value, key)  # the CDs a release gate can require
    problem = require_problem(kinds)  # the very check a run makes of its release_gate.require before any work
    if problem:
        raise FormatError(f"{key}={kinds} is not allowed; a gate requires clean and each kind once ({problem})")
    return kinds


GATE_FIELDS_1 = {"conf_dist_at_most": finite, "require": _require, "gamma": finite, "reasons": list_of(_reason, 100)}


def _positive(value, key):
    if not finite(value, key) > 0:
        raise FormatError(f"{key}={value} is not allowed; expected a number > 0")
    return value


GATE_FIELDS = {**GATE_FIELDS_1, "min_proven_radius": optional(_positive)}


def _config_fields(gate: dict, per_image: dict, form: str) -> dict:
    protection = {
        "method": name, "label": _text, "theta": optional(fraction), "forget_size": count, "forget_fingerprint": hex64,
        "forget_set_digest": optional(hex64), "forget_conf_dist": optional(finite), "test_acc": optional(fraction),
        "certificate": boolean, "experiment": _text, "protected": boolean, "release_gate": record(gate),
        "per_image": record(per_image)}
    return {"format": one_of(form), "architecture": _architecture, "input": record(INPUT_FIELDS),
            "weights": record({"file": one_of(WEIGHTS), "sha256": hex64, "prefix": one_of("", "backbone.")}),
            "protection": record(protection), "library": record({"name": one_of("ttp_lightning"), "version": _text})}


CONFIG_FIELDS = _config_fields(GATE_FIELDS, PER_IMAGE_FIELDS, RELEASE_FORMAT)
EARLIER_FIELDS = {"ttp_lightning.release/1": _config_fields(GATE_FIELDS_1, PER_IMAGE_FIELDS_1, "ttp_lightning.release/1"),
                  "ttp_lightning.release/2": _config_fields(GATE_FIELDS, PER_IMAGE_FIELDS, "ttp_lightning.release/2"),
                  "ttp_lightning.release/3": _config_fields(GATE_FIELDS, PER_IMAGE_FIELDS, "ttp_lightning.release/3")}


def read_release_config(folder: str | Path) -> dict:
    """config.json of a release, every field checked (FormatError naming the first bad one)."""
    path = Path(folder).expanduser() / CONFIG
    if not path.is_file():
        raise TTPUserError(f"{str(path)!r} does not exist; a release folder holds {WEIGHTS}, {CONFIG}, {CARD} (its card)")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise FormatError(f"{str(path)!r} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        document = strict_json(path.read_text())
    except FormatError as exc:  # a key twice
        raise FormatError(f"{str(path)!r} is not JSON this format can hold ({exc})") from None
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, an integer of thousands of digits
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).splitlines()[0]
        raise FormatError(f"{str(path)!r} is not JSON this format can hold ({reason})") from None
    form = document.get("format") if isinstance(document, dict) else None
    try:
        if form in EARLIER_FORMATS:  # read in this format's words, so every reader reads one set of names
            document = earlier_in_current_words(document)
        return record(EARLIER_FIELDS.get(form, CONFIG_FIELDS) if isinstance(form, str) else CONFIG_FIELDS)(document, "")
    except (FormatError, BothWords) as exc:  # name the file, as every other line about it does
        raise FormatError(f"{str(path)!r} {exc}") from None


def earlier_in_current_words(document: dict) -> dict:
    """A /1 or /2 config.json in /3's words: `protection.certified` (a certificate is beside it) is
    `protection.certificate`, and the bound-based claims' "certified" is "proven" (core.words)."""
    protection = document.get("protection")
    if isinstance(protection, dict) and "certified" in protection:
        if "certificate" in protection:
            raise BothWords("protection.certificate is stated twice (as 'certified' and 'certificate')")
        protection = {("certificate" if key == "certified" else key): value for key, value in protection.items()}
        document = {**document, "protection": protection}
    return upgraded(document)


def not_protected_line(folder: str | Path, config: dict) -> str | None:
    """The sentence saying a release's own config.json calls it not protected (None when it says protected)."""
    if config["protection"]["protected"]:
        return None
    return (f"{str(folder)!r} is NOT a protected release: its config.json says \"protected\": false (its release "
            "gate failed; its card gives the reasons)")


def card_name(form: str) -> str:
    """The card's file name in a release of format `form` (config.json's `format`)."""
    return CARD if form == RELEASE_FORMAT else LEGACY_CARD


MAX_IMAGE_SIZE, MAX_CHANNELS = 4096, 4
def check_input(given: dict, folder: Path) -> None:
    """config.json `input` values the network can be built and run with: mean and std of one value per channel,
    every std positive, a class name per class, sizes within MAX_*; one error line naming the bad value."""
    where = f"{str(folder / CONFIG)!r} input"
    if not 1 <= given["channels"] <= MAX_CHANNELS:
        raise FormatError(f"{where}.channels={given['channels']} is not allowed; choose 1..{MAX_CHANNELS}")
    if not 1 <= given["image_size"] <= MAX_IMAGE_SIZE:
        raise FormatError(f"{where}.image_size={given['image_size']} is not allowed; choose 1..{MAX_IMAGE_SIZE}")
    for key in ("mean", "std"):
        if len(given[key]) != given["channels"]:
            raise FormatError(f"{where}.{key}={given[key]} is not allowed; give one value per channel "
                              f"({given['channels']})")
    if not all(MIN_STD <= value <= MAX_NORMALISATION for value in given["std"]):
        raise FormatError(f"{where}.std={given['std']} is not allowed; every value must be in [{MIN_STD:g}, "
                          f"{MAX_NORMALISATION:g}]")
    if not all(abs(value) <= MAX_NORMALISATION for value in given["mean"]):
        raise FormatError(f"{where}.mean={given['mean']} is not allowed; every value must be in "
                          f"[-{MAX_NORMALISATION:g}, {MAX_NORMALISATION:g}]")
    if given["num_classes"] < 2 or len(given["class_names"]) != given["num_classes"]:
        raise FormatError(f"{where}.num_classes={given['num_classes']} is not allowed; a classifier has at least "
                          f"2 classes, one class name each ({len(given['class_names'])} given)")
