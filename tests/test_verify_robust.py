"""Issue 36: `verify robust` and `load_released` decide from what they recompute, never from the folder they check.

One genuine protected release (the default digits job, tiny) is attacked the way an adversary would: by editing its
own files (config.json, the weights with their SHA-256 rewritten, the card README.md and its metadata), every value replaced by NaN,
infinities, 0, a negative, 1e308, a string, a list of another length or nothing. Nothing may verify unless the
edited field takes no part in the verdict (SAFE, each with its reason)."""

import contextlib
import copy
import io
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import open_dict
from safetensors.torch import load_file, save_file

from conftest import CONF_DIR, TINY, registered_loader
from ttp_lightning.config.choices import normalize_overrides
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.core.files import sha256_of
from ttp_lightning.release import NotProtectedWarning, load_released
from ttp_lightning.release.format import CARD, LEGACY_CARD, RELEASE_FORMAT
from ttp_lightning.verify import main as verify

RUN = ["method.epochs=40", "attacks.gammas=[2]", "attacks.robust_gamma=2", "attacks.apgd_steps=10",
       "attacks.restarts=1", "attacks.relearn.enabled=false"]


@dataclass(frozen=True)
class Genuine:
    release: Path  # a protected release folder (exit 0, release/)
    forget: Path  # its 20 forget images as PNG files, in subfolders
    other: Path  # 10 test images the release was not made uncertain on


def _write_pngs(folder: Path, images) -> None:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i, image in enumerate(images):
        Image.fromarray(np.asarray(image[0], dtype=np.uint8), mode="L").save(folder / f"{i:03d}.png")


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> Genuine:
    from ttp_lightning.data.datamodule import TTPDataModule
    from ttp_lightning.run.pipeline import run

    work = tmp_path_factory.mktemp("genuine")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="main", overrides=normalize_overrides(
            [*TINY, *RUN, f"paths.output_dir={work}", f"paths.cache_dir={work / 'cache'}"]), return_hydra_config=True)
    with open_dict(cfg):
        del cfg["hydra"]
    results = run(cfg, str(work)).to_json()
    assert results["release_gate"]["passed"], results["release_gate"]
    datamodule = TTPDataModule("digits", registered_loader("digits"), split="paper", forget={"size": 20})
    datamodule.setup()
    _write_pngs(work / "forget" / "any" / "sub", datamodule.train_images[datamodule.forget_indices])
    _write_pngs(work / "other", datamodule.test_images[:10])
    return Genuine(work / "release", work / "forget", work / "other")


def _copy(genuine: Genuine, target: Path) -> Path:
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(genuine.release, target)
    return target


def _check(release: Path, images: Path, *extra: str) -> tuple[int, str]:
    """verify robust in this process (anything a folder smuggled in would run right here): exit code, output."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = verify(["robust", str(release), str(images), *extra])
    return code, out.getvalue() + err.getvalue()


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _write_config(folder: Path, config: dict) -> None:
    (folder / "config.json").write_text(json.dumps(config))


def _rehash(folder: Path, config: dict) -> dict:
    config["weights"]["sha256"] = sha256_of(folder / "model.safetensors")
    return config


def test_verify_robust_rechecks_a_release_from_its_weights_and_the_images(genuine, tmp_path):
    """A genuine release verifies at its own radius; other images, a weights file swapped without or with its hash
    rewritten, images of the wrong shape or a folder that is no release do not."""
    release = _copy(genuine, tmp_path / "release")
    claimed = _config(release)["protection"]["per_image"]
    assert claimed["gamma"] == 2.0 and claimed["forget_proven_worst_conf_dist"] is not None
    code, text = _check(release, genuine.forget, "--gamma", "0")
    assert code == 0 and "its claims about them are compared" in text, text  # the clean CDs, all <= 0.1
    assert _check(release, genuine.forget, "--gamma", "2", "--at-most", "0.899")[0] == 0
    assert _check(release, genuine.forget, "--at-most", "0.899")[0] in (0, 1)  # verify's own 8/255
    assert _check(release, genuine.other, "--gamma", "0")[0] == 1  # confident on other images

    weights = release / "model.safetensors"
    state = load_file(str(weights))
    last = max(state)
    state[last] = state[last] * 3  # a sharper model
    save_file(state, str(weights))
    assert _check(release, genuine.forget, "--gamma", "2", "--at-most", "0.899")[0] == 2  # hash differs: refused
    _write_config(release, _rehash(release, _config(release)))
    code, text = _check(release, genuine.forget, "--gamma", "2", "--at-most", "0.899")
    assert code == 1 and "recomputed from the weights" in text  # its claims no longer hold

    _write_pngs(tmp_path / "wrong", torch.zeros(2, 1, 9, 9, dtype=torch.uint8))
    assert _check(release, tmp_path / "wrong")[0] == 2
    assert _check(tmp_path, genuine.forget)[0] == 2  # not a release folder


def test_a_std_that_float32_cannot_hold_is_refused_and_nan_never_passes(genuine, tmp_path, monkeypatch):
    """Issue 36, case 1: std 1e-300 with mean 0.5 (weights and hash untouched) made every image NaN and verified.
    Now load_released refuses such a std in one line; and a NaN bound, whatever produced it, fails."""
    release = _copy(genuine, tmp_path / "release")
    config = _config(release)
    config["input"].update(std=[1e-300], mean=[0.5])
    _write_config(release, config)
    code, text = _check(release, genuine.forget, "--gamma", "1")
    assert code == 2 and "input.std=[1e-300] is not allowed" in text and "[1e-06, 1000]" in text
    with pytest.raises(TTPUserError, match=r"std=\[1e-300\] is not allowed"):
        load_released(release)

    from ttp_lightning.verify import robust as verify_robust

    release = _copy(genuine, tmp_path / "nan")
    monkeypatch.setattr(verify_robust.Prover, "conf_dist",
                        lambda self, images, gamma: torch.full((len(images),), math.nan, dtype=torch.float64))
    code, text = _check(release, genuine.forget, "--gamma", "1")
    assert code == 1 and "ABOVE" in text and "verified" not in text
    for argument in (["--gamma", "nan"], ["--at-most", "nan"], ["--gamma", "inf"], ["--at-most", "1"]):
        code, text = _check(release, genuine.forget, *argument)
        assert code == 2 and "is not allowed" in text, argument


def test_the_threshold_is_verifys_own_never_the_folders(genuine, tmp_path):
    """Issue 36, case 2: one class's bias raised by 50 (every image fully confident), the hash rewritten, and
    config.json's gate threshold and per-image claims edited to match: verify's own 0.1 fails every image, and a
    gate claimed at 0.95 is one that cannot fail."""
    release = _copy(genuine, tmp_path / "release")
    state = load_file(str(release / "model.safetensors"))
    bias = [name for name in state if name.endswith("bias")][-1]
    state[bias][3] += 50.0
    save_file(state, str(release / "model.safetensors"))
    config = _rehash(release, _config(release))
    config["protection"]["release_gate"]["conf_dist_at_most"] = 0.95
    config["protection"]["per_image"].update(forget_worst_conf_dist=0.9, forget_exposed=0,
                                            forget_proven_worst_conf_dist=0.9, forget_proven_share_05=0.0,
                                            forget_proven_share_10=0.0)
    _write_config(release, config)
    code, text = _check(release, genuine.forget, "--gamma", "0")
    assert code == 1 and text.count("ABOVE") == 20 and "at most 0.1" in text
    assert "which cannot fail with 10 classes" in text and "verified" not in text.split("FAIL")[-1]


def test_a_release_that_says_it_is_not_protected_fails_unless_asked_and_load_released_warns(genuine, tmp_path):
    """Issue 36, case 7: verify robust on a release_not_protected/ folder said "verified"; load_released loaded it
    without a word."""
    release = _copy(genuine, tmp_path / "release_not_protected")
    config = _config(release)
    config["protection"]["protected"] = False
    config["protection"]["release_gate"]["reasons"] = ["4 of 20 forget images keep clean CD > 0.1"]
    _write_config(release, config)
    card = (release / CARD).read_text().splitlines()
    title = _title_index(card)
    marked = [line.replace("protected: true", "protected: false").replace("- protected", "- not-protected")
              for line in card[:title]]  # the metadata of a refused release says so too
    assert marked != card[:title]
    (release / CARD).write_text("\n".join([*marked, card[title] + ": NOT PROTECTED", *card[title + 1:]]))
    code, text = _check(release, genuine.forget, "--gamma", "0")
    assert code == 1 and text.startswith("FAIL: ") and "is NOT a protected release" in text.splitlines()[0]
    code, text = _check(release, genuine.forget, "--gamma", "0", "--allow-unprotected")
    assert code == 0 and text.startswith("checked as asked (--allow-unprotected)")
    with pytest.warns(NotProtectedWarning, match="NOT a protected release"):
        load_released(release)
    (release / CARD).write_text("\n".join([*marked, *card[title:]]))  # a title that says protected beside it
    code, text = _check(release, genuine.forget, "--gamma", "0", "--allow-unprotected")
    assert code == 1 and f"{CARD}'s title" in text
    (release / CARD).write_text("\n".join([*card[:title], card[title] + ": NOT PROTECTED", *card[title + 1:]]))
    code, text = _check(release, genuine.forget, "--gamma", "0", "--allow-unprotected")  # metadata says protected
    assert code == 1 and "metadata (ttp_lightning.protected, tags) contradicts" in text, text


@pytest.mark.parametrize("change, message", [
    ({"image_size": "5000 digits"}, "is not JSON this format can hold"),
    ({"pixel_range": [0, 255]}, r"pixel_range=\[0, 255\] is not allowed"),
    ({"mean": [1e6]}, r"mean=\[1000000.0\] is not allowed"),
    ({"std": [math.inf]}, "expected a finite number"),
])
def test_load_released_refuses_input_it_would_otherwise_ignore_or_crash_on(genuine, tmp_path, change, message):
    """Issue 36, case 7: a 5000-digit image_size raised a raw ValueError; pixel_range was accepted and ignored."""
    release = _copy(genuine, tmp_path / "release")
    config = _config(release)
    config["input"].update(change)
    if "image_size" in change:  # Python's own json writer refuses such an integer: written as an adversary would
        config["input"]["image_size"] = 0
        text = json.dumps(config).replace('"image_size": 0', '"image_size": ' + "9" * 5000)
    else:
        text = json.dumps(config)
    (release / "config.json").write_text(text)
    with pytest.raises(TTPUserError, match=message):
        load_released(release)
    code, out = _check(release, genuine.forget, "--gamma", "0")
    assert code == 2 and out.startswith("error: cannot verify:") and out.count("\n") == 1


# ------------------------------------------------------------------------------------------------ the fuzz
MISSING, LONGER = object(), object()
REPLACEMENTS = {"NaN": math.nan, "inf": math.inf, "-inf": -math.inf, "0": 0, "negative": -1.5, "1e308": 1e308,
                "a string": "x", "a list of another length": LONGER, "missing": MISSING}
# The fields whose edit may still verify: they take no part in the verdict, and why each is safe. Every other
# single edit must end in exit 1 or 2.
UNREAD = "text for people; verify reads no part of it"
SAFE = {
    "config.json library.version": "the version of the software that wrote the release: " + UNREAD,
    "config.json input.class_names[*]": "a class's name: the verdict is about confidence, whatever the classes are "
                                        "called",
    "config.json protection.method": "the method's name: " + UNREAD,
    "config.json protection.label": "the method's label: " + UNREAD,
    "config.json protection.experiment": "the experiment's name: " + UNREAD,
    "config.json protection.theta": "the method's setting, any fraction (or none): " + UNREAD,
    "config.json protection.test_acc": "accuracy on test data verify does not have; the card must agree with it",
    "config.json protection.per_image.forget_robust_worst_conf_dist": "an attack's result, not a bound: verify "
        "checks only that it lies between the clean CD and the proven bound; the verdict never uses it",
    "config.json protection.per_image.forget_robust_exposed": "the same, as a count",
    "config.json protection.per_image.slope_steps": "how the claims were computed (alpha-CROWN's steps): they are "
        "recomputed that way and must still match (on this tiny MLP CROWN's own slopes give the same worst bounds); "
        "the verdict uses verify's own --slope-steps",
    "README.md (prose and the before column)": "text and the starting model's numbers, for people: verify reads "
        "only the title (against \"protected\") and the after cells config.json also claims",
    "README.md row 'retain accuracy'": "needs the retain set, which verify does not have",
    "README.md row 'forget accuracy'": "needs the forget images' labels, which verify does not read",
    "README.md row 'forget confidence distance under attack'": "the mean of an attack's results: not a bound",
    "README.md row 'test confidence distance'": "needs the test set, which verify does not have",
}


def _paths(value, prefix: tuple = ()):
    if prefix:
        yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


def _edited(document: dict, path: tuple, replacement):
    """A copy of `document` with the value at `path` replaced (None when the edit changes nothing)."""
    edited = copy.deepcopy(document)
    parent = edited
    for key in path[:-1]:
        parent = parent[key]
    old = parent[path[-1]]
    if replacement is MISSING:
        del parent[path[-1]]
        return edited
    new = ([*old, old[-1]] if old else ["x"]) if isinstance(old, list) and replacement is LONGER else \
        [old, old] if replacement is LONGER else replacement
    if new == old and isinstance(new, bool) == isinstance(old, bool):  # 0 for 0.0 is no edit; 0 for false is
        return None
    parent[path[-1]] = new
    return edited


def _name(path: tuple) -> str:
    return ".".join(str(p) if isinstance(p, str) else "[*]" for p in path).replace(".[*]", "[*]")


def _verdicts(folder: Path, images: Path) -> tuple[int, str]:
    """(verify robust's exit, what load_released did): load_released may refuse in one TTPUserError line or load
    a network whose outputs on the images are finite; anything else (a raw exception, NaN) fails the test."""
    from ttp_lightning.verify.common import image_files, read_images

    code, _ = _check(folder, images, "--gamma", "0")
    try:
        net = load_released(folder)
    except TTPUserError as exc:
        assert "\n" not in str(exc)
        return code, "refused"
    with torch.no_grad():
        assert torch.isfinite(net(read_images(image_files(images), 1, 8, False).float() / 255)).all()
    return code, "loaded"


def test_no_single_edit_of_a_release_verifies_unless_the_field_takes_no_part(genuine, tmp_path):
    """At least 200 single-field edits of config.json, the weights (hash rewritten) and the model card."""
    import warnings

    folder = _copy(genuine, tmp_path / "release")
    original = _config(folder)
    card = (folder / CARD).read_text()
    weights, weights_file = load_file(str(folder / "model.safetensors")), (folder / "model.safetensors").read_bytes()
    assert _check(folder, genuine.forget, "--gamma", "0")[0] == 0  # the genuine release verifies
    passed, tried = {}, 0
    warnings.simplefilter("ignore", NotProtectedWarning)

    def attempt(field: str) -> None:
        nonlocal tried
        tried += 1
        code, loaded = _verdicts(folder, genuine.forget)
        if code == 0:
            passed.setdefault(field, []).append(loaded)

    def outputs() -> torch.Tensor:  # the released network on the forget images: all verify --gamma 0 reads
        from ttp_lightning.verify.common import image_files, read_images

        with torch.no_grad():
            return load_released(folder)(read_images(image_files(genuine.forget), 1, 8, False).float() / 255)

    genuine_outputs = outputs()

    for path in _paths(original):
        for replacement in REPLACEMENTS.values():
            edited = _edited(original, path, replacement)
            if edited is None:
                continue
            (folder / "config.json").write_text(json.dumps(edited))  # NaN and Infinity as Python writes them
            attempt(f"config.json {_name(path)}")
    _write_config(folder, original)

    for name, tensor in weights.items():  # the weights, with the hash in config.json rewritten to match
        for label, change in (("NaN", lambda t: t.flatten().index_fill(0, torch.tensor([0]), math.nan).view_as(t)),
                              ("inf", lambda t: t.flatten().index_fill(0, torch.tensor([0]), math.inf).view_as(t)),
                              ("zeros", torch.zeros_like), ("negated", torch.neg), ("x3", lambda t: t * 3),
                              ("one value +1", lambda t: t.flatten().index_add(0, torch.tensor([0]),
                                                                                 torch.ones(1)).view_as(t))):
            save_file({**weights, name: change(tensor)}, str(folder / "model.safetensors"))
            _write_config(folder, _rehash(folder, copy.deepcopy(original)))
            if label == "one value +1" and torch.equal(outputs(), genuine_outputs):
                continue  # the value takes no part in the images' outputs (a dead ReLU's weight, a blank pixel's)
            attempt(f"model.safetensors {name} {label}")
    (folder / "model.safetensors").write_bytes(weights_file)
    _write_config(folder, original)
    assert _check(folder, genuine.forget, "--gamma", "0")[0] == 0  # restored

    lines = card.splitlines()
    effect = [i for i, line in enumerate(lines) if line.startswith("| ") and line.count("|") == 4
              and not line.startswith("| measure")]
    title = _title_index(lines)
    edits = [(title, lines[title] + ": NOT PROTECTED", "README.md title"),
             (title, "# Model card", "README.md (prose and the before column)")]
    values = [i for i, line in enumerate(lines[:title]) if line.strip().startswith("value:")]
    assert values, "the metadata states the Effect table's values"
    for i in values:  # the hub metadata restates the claims: an edit there is a claim that must be compared too
        stated = lines[i].split("value:")[1].strip()
        for value in ("0.0", "-1.5", "1e308", ".nan", "x"):
            if value != ".nan" and value != "x" and float(value) == float(stated):
                continue  # the same number, written differently: the same claim
            edits.append((i, lines[i].split("value:")[0] + f"value: {value}", "README.md metadata"))
    for i in effect:
        label, before, after = (part.strip() for part in lines[i].strip("|").split("|"))
        for value in ("nan", "0.0000", "x", "-1.5000", "1e308"):
            if value != after:
                edits.append((i, f"| {label} | {before} | {value} |", f"README.md row {label!r}"))
        edits.append((i, f"| {label} | 0.1234 | {after} |", "README.md (prose and the before column)"))
    for i, text, field in edits:
        (folder / CARD).write_text("\n".join(lines[:i] + [text] + lines[i + 1:]))
        attempt(field)
    (folder / CARD).write_text(card)

    assert tried >= 200, tried
    unsafe = {field: how for field, how in passed.items() if field not in SAFE}
    assert not unsafe, unsafe
    print(f"{tried} edits; verified after an edit of: {sorted(passed)}")


def test_verify_robust_recomputes_each_images_proven_radius_and_fails_an_edited_claim(genuine, tmp_path):
    """Issue 37: the release claims its forget images' smallest and median proven radius (linear bounds, at its
    gate's threshold); verify robust recomputes both from the weights and the images and fails a changed claim."""
    release = _copy(genuine, tmp_path / "release")
    claims = _config(release)["protection"]["per_image"]
    assert claims["bound"] == "linear" and claims["forget_proven_radius_min"] is not None
    code, text = _check(release, genuine.forget, "--gamma", "0")
    assert code == 0 and f"proven radius min {claims['forget_proven_radius_min']:g}/255" in text
    config = _config(release)
    config["protection"]["per_image"]["forget_proven_radius_min"] += 0.25
    _write_config(release, config)
    code, text = _check(release, genuine.forget, "--gamma", "0")
    assert code == 1 and "config.json claims forget_proven_radius_min" in text


def test_the_stated_slope_steps_are_bounded_work_and_verifys_own_are_checked(genuine, tmp_path):
    """alpha-CROWN's steps: the release states the ones its claims were computed with (recomputed the same way);
    a number that would make a checker spin is refused in one line, and so is verify's own out of range."""
    release = _copy(genuine, tmp_path / "release")
    config = _config(release)
    assert config["protection"]["per_image"]["slope_steps"] == 0  # one ReLU layer: CROWN's own slopes
    for steps in (1001, 10**9):
        config["protection"]["per_image"]["slope_steps"] = steps
        _write_config(release, config)
        code, text = _check(release, genuine.forget, "--gamma", "0")
        assert code == 2 and "slope_steps" in text and "not allowed" in text and text.count("\n") == 1
    code, text = _check(genuine.release, genuine.forget, "--gamma", "0", "--slope-steps", "-1")
    assert code == 2 and text.startswith("error: cannot verify: --slope-steps=-1 is not allowed")
    code, text = _check(genuine.release, genuine.forget, "--gamma", "2", "--slope-steps", "0")
    assert code in (0, 1) and "slope steps" not in text.splitlines()[0]


def test_a_release_of_the_earlier_format_loads_and_verifies_without_radius_claims(genuine, tmp_path):
    """ttp_lightning.release/1 (before the proven radius): still loaded and verified; its claims were computed
    with interval bounds, and it claims no radius."""
    from ttp_lightning.bounds.uniformity import Prover
    from ttp_lightning.verify.common import image_files, read_images

    release = _copy(genuine, tmp_path / "release")
    config = _config(release)
    config["format"] = "ttp_lightning.release/1"
    for key in ("forget_proven_radius_min", "forget_proven_radius_median", "bound", "intermediate",
                "slope_steps", "radius_step", "max_radius"):
        del config["protection"]["per_image"][key]
    del config["protection"]["release_gate"]["min_proven_radius"]
    net = load_released(release)
    images = read_images(image_files(genuine.forget), 1, 8, False).float() / 255
    interval = Prover(net, "interval", precision="float64").conf_dist(images, 2.0)  # release/1: exact bounds
    config["protection"]["per_image"].update(forget_proven_worst_conf_dist=round(float(interval.max()), 6),
                                             forget_proven_share_05=float((interval <= 0.05).double().mean()),
                                             forget_proven_share_10=float((interval <= 0.1).double().mean()))
    _rewrite_card(release, config)  # the card of a release/1 run states the interval bounds too
    _as_earlier(release)
    _in_old_words(release, config)
    with pytest.warns(UserWarning, match="is a ttp_lightning.release/1 release, read as"):
        load_released(release)
    code, text = _check(release, genuine.forget, "--gamma", "0")
    assert code == 0, text
    config = _config(release)
    config["format"] = RELEASE_FORMAT  # the new format without its new fields is refused
    _write_config(release, config)
    assert _check(release, genuine.forget, "--gamma", "0")[0] == 2


def _in_old_words(release: Path, config: dict) -> None:
    """config.json and the card written as releases before /3 wrote them: "certified" where they now say "proven",
    and `protection.certified` for the certificate beside it."""
    protection = config["protection"]
    protection["certified"] = protection.pop("certificate")
    for part in (protection["per_image"], protection["release_gate"]):
        for key in list(part):
            if "proven" in key:
                part[key.replace("proven", "certified")] = part.pop(key)
    gate = protection["release_gate"]
    gate["require"] = ["certified" if kind == "proven" else kind for kind in gate["require"]]
    _write_config(release, config)
    text = (release / LEGACY_CARD).read_text().splitlines()
    (release / LEGACY_CARD).write_text("\n".join(line.replace("proven", "certified") if line.startswith("| ")
                                                 else line for line in text))


def test_a_release_2_written_before_the_float32_bound_verifies_its_exact_claims(genuine, tmp_path):
    """Issue 59: ttp_lightning.release/2 claims were computed by bounds exact for the float64 network. They are
    compared with bounds of that function (said in a line); the verdict is still the float32-sound one."""
    from ttp_lightning.bounds.uniformity import Prover
    from ttp_lightning.verify.common import image_files, read_images

    release = _copy(genuine, tmp_path / "release")
    config = _config(release)
    assert config["format"] == RELEASE_FORMAT
    net = load_released(release)
    images = read_images(image_files(genuine.forget), 1, 8, False).float() / 255
    claims = config["protection"]["per_image"]
    exact = Prover(net, "linear", intermediate=claims["intermediate"], precision="float64")
    float32 = Prover(net, "linear", intermediate=claims["intermediate"])
    worst = float(exact.conf_dist(images, claims["gamma"]).max())
    assert float(float32.conf_dist(images, claims["gamma"]).max()) - worst > 1e-6  # the two do differ here
    config["protection"]["per_image"]["forget_proven_worst_conf_dist"] = round(worst, 6)
    config["format"] = "ttp_lightning.release/2"
    _rewrite_card(release, config)
    _as_earlier(release)
    _in_old_words(release, config)  # and in /2's words
    assert "forget_certified_worst_conf_dist" in (release / "config.json").read_text()
    code, text = _check(release, genuine.forget, "--gamma", "0")
    assert "for the exact function of the weights" in text and "sound for float32" in text, text
    assert code == 0, text
    config = _config(release)  # an old and a new word for one claim: refused, not guessed
    config["protection"]["per_image"]["forget_proven_worst_conf_dist"] = 0.0
    _write_config(release, config)
    code, text = _check(release, genuine.forget, "--gamma", "0")
    assert code == 2 and "is stated twice" in text, text


def _rewrite_card(release: Path, config: dict) -> None:
    """The card's Effect cells made to say what config.json claims, and its metadata to restate them (as the run
    that wrote both would)."""
    from huggingface_hub import ModelCard

    from ttp_lightning.release import effect_rows
    from ttp_lightning.release.card import number_of

    protection = config["protection"]
    gate = protection["release_gate"]
    claims = {**protection["per_image"], "forget_conf_dist": protection["forget_conf_dist"],
              "test_acc": protection["test_acc"]}
    card = release / CARD
    lines = card.read_text().splitlines()
    cells = {}
    for key, (label, cell) in effect_rows(gate["gamma"], gate["conf_dist_at_most"]).items():
        for i, line in enumerate(lines):
            if line.startswith(f"| {label} |") and key in claims:
                before = line.strip().strip("|").split("|")[1].strip()
                cells[key] = cell({key: claims[key]})
                lines[i] = f"| {label} | {before} | {cells[key]} |"
    rewritten = ModelCard("\n".join(lines))
    for result in rewritten.data.eval_results or []:
        if result.metric_type in cells:
            result.metric_value = number_of(cells[result.metric_type])
    card.write_text(rewritten.content)


def _as_earlier(release: Path) -> None:
    """The card as releases /1-/3 wrote it: MODEL_CARD.md, without the hub metadata."""
    from ttp_lightning.release.card import split_front_matter

    text = (release / CARD).read_text()
    (release / LEGACY_CARD).write_text(split_front_matter(text)[1].lstrip("\n"))
    (release / CARD).unlink()


def _title_index(lines: list[str]) -> int:
    return next(i for i, line in enumerate(lines) if line.startswith("# "))


def _forge_float32(release: Path, forget: Path, scale: float = 2.0 ** 24):
    """Issue 59's forgery (Jia & Rinard 2021): two hidden units with biases `scale` and `scale` - gap on one pixel
    cancel exactly (every logit 0: uniform everywhere, so an exact bound proves CD 0 at any radius) but not in
    float32, where moving that pixel by 8/255 rounds them apart and one logit jumps to 16. Every claim in
    config.json and the card is rewritten as the exact network would give it (CD 0, radius 16). Returns the
    exposed image (uint8 pixels, [1, 1, 8, 8]): a forget image with that one pixel moved by 8/255."""
    from ttp_lightning.verify.common import image_files, read_images

    pixels = read_images(image_files(forget), 1, 8, False)
    config = _config(release)
    mean, std = config["input"]["mean"][0], config["input"]["std"][0]
    flat = pixels.flatten(1).double() / 255
    # a pixel where one image (the one to expose) is above the mean, above every other image and has room to move
    # up by 8/255: a positive weight then keeps every image's t = a * x_norm below 0.5 (they round together) and
    # takes that image's t past 0.5 after the move
    best, others = flat.max(0), flat.topk(2, dim=0).values[1]
    room = (best.values <= 1 - 9 / 255) & (best.values > others) & ((best.values - mean) / std > 0.3)
    pixel = int(torch.argmax(torch.where(room, best.values - others, -1.0)))
    target = int(best.indices[pixel])
    normalised = (flat[:, pixel] - mean) / std
    step = 8 / 255 / std
    gap = scale * 2.0 ** -24  # float32's spacing just below `scale` (above it the spacing doubles)
    weight = 0.499 * gap / float(normalised[target])
    state = {name: torch.zeros_like(tensor) for name, tensor in load_file(str(release / "model.safetensors")).items()}
    state["1.weight"][0, pixel] = state["1.weight"][1, pixel] = weight
    state["1.bias"][0], state["1.bias"][1] = scale, scale - gap
    state["3.weight"][0, 0], state["3.weight"][0, 1], state["3.bias"][0] = -16.0, 16.0, 16.0 * gap
    save_file(state, str(release / "model.safetensors"))
    _rehash(release, config)
    protection = config["protection"]
    protection.update(forget_conf_dist=0.0, protected=True)
    protection["per_image"].update(forget_worst_conf_dist=0.0, forget_exposed=0, forget_robust_worst_conf_dist=0.0,
                                   forget_robust_exposed=0, forget_proven_worst_conf_dist=0.0,
                                   forget_proven_share_05=1.0, forget_proven_share_10=1.0,
                                   forget_proven_radius_min=16.0, forget_proven_radius_median=16.0)
    protection["release_gate"].update(require=["clean", "attacked", "proven"], min_proven_radius=16.0)
    _write_config(release, config)
    _rewrite_card(release, config)
    exposed = pixels[target:target + 1].clone()
    exposed.view(-1)[pixel] = int(exposed.view(-1)[pixel]) + 8
    assert float(normalised.abs().max()) * abs(weight) < gap and weight * step > 0.002 * gap
    return exposed


def _exact_bounds(monkeypatch) -> None:
    """The bound before issue 59: exact for the float64 network, blind to float32 rounding."""
    from ttp_lightning.bounds import rounding

    monkeypatch.setattr(rounding.Rounding, "noise", lambda self, net, node, env: None)


@pytest.mark.parametrize("scale", [2.0 ** 24, 2.0 ** 26])
def test_a_network_that_rounding_makes_confident_is_never_certified(genuine, tmp_path, monkeypatch, scale):
    """Issue 59, critical: the float32 forgery verified at 8/255 ("radius 16") and the image it exposes
    (CD 0.897 under load_released) printed `clean 0.8970, certified 0.0000 ok`. The bound now covers float32's
    rounding, so neither verifies; with the old exact bound the exposed image is named as an UNSOUND bound (the
    verdict compares the clean CD measured in float32 with the bound), and the forget set would still pass it."""
    release = _copy(genuine, tmp_path / "release")
    exposed = _forge_float32(release, genuine.forget, scale)
    _write_pngs(tmp_path / "exposed", exposed)
    net = load_released(release)
    forget = torch.stack([torch.as_tensor(np.asarray(__import__("PIL.Image").Image.open(p)))[None]
                          for p in sorted(genuine.forget.rglob("*.png"))]).float() / 255
    from ttp_lightning.core.metrics import conf_dist_of_probs

    with torch.no_grad():
        assert float(conf_dist_of_probs(net(forget).softmax(-1)).max()) < 1e-6  # uniform on every forget image
        assert float(conf_dist_of_probs(net(exposed.float() / 255).softmax(-1))[0]) > 0.85  # 8/255 away: confident

    code, text = _check(release, genuine.forget, "--gamma", "8")
    assert code == 1 and text.count("ABOVE") == 20 and "proven CD 0.9000" in text, text
    assert "sound for float32" in text and "verified" not in text.split("FAIL")[-1]
    code, text = _check(release, tmp_path / "exposed", "--gamma", "8")
    assert code == 1 and "clean CD 0.9000 at the image itself" in text and "ABOVE" in text, text

    _exact_bounds(monkeypatch)  # the old bound: the hole, and the concrete check that now catches the image
    code, text = _check(release, genuine.forget, "--gamma", "8")
    assert code == 0, text  # blind to rounding, the forget set is "proven at radius 16" (why the term exists)
    code, text = _check(release, tmp_path / "exposed", "--gamma", "8")
    assert code == 1 and "UNSOUND BOUND" in text and "below the CD" in text, text


def _forged_claims(config: dict) -> dict:
    """config.json claiming everything a data subject would want: radius 16, every image proven, none exposed."""
    protection = config["protection"]
    protection["per_image"].update(forget_proven_worst_conf_dist=0.0, forget_proven_share_05=1.0,
                                   forget_proven_share_10=1.0, forget_proven_radius_min=16.0,
                                   forget_proven_radius_median=16.0, forget_robust_worst_conf_dist=0.0,
                                   forget_robust_exposed=0)
    return config


def test_claims_without_a_set_digest_are_refused(genuine, tmp_path):
    """Issue 59 (a): forget_set_digest null with forged claims (radius 16, 100 % proven) and a card to match
    verified ("set digest differs", so nothing was compared). A release that makes claims must name its set."""
    release = _copy(genuine, tmp_path / "release")
    config = _forged_claims(_config(release))
    config["protection"]["forget_set_digest"] = None
    _write_config(release, config)
    _rewrite_card(release, config)
    code, text = _check(release, genuine.forget, "--gamma", "0")
    assert code == 1 and "states no forget_set_digest" in text and "verified" not in text.split("FAIL")[-1], text
    config["protection"]["per_image"].update({key: None for key in (
        "forget_worst_conf_dist", "forget_exposed", "forget_robust_worst_conf_dist", "forget_robust_exposed",
        "forget_proven_worst_conf_dist", "forget_proven_share_05", "forget_proven_share_10",
        "forget_proven_radius_min", "forget_proven_radius_median")})
    config["protection"]["forget_conf_dist"] = None
    _write_config(release, config)
    _rewrite_card(release, config)
    assert "states no forget_set_digest" not in _check(release, genuine.forget, "--gamma", "0")[1]  # no claims


def _card_with(release: Path, edit) -> None:
    lines = (release / CARD).read_text().splitlines()
    (release / CARD).write_text("\n".join(edit(lines)))


@pytest.mark.parametrize("where", ["above", "below", "outside", "no pipes", "html", "missing", "reordered"])
def test_a_card_with_a_second_row_for_a_claim_or_any_other_table_is_refused(genuine, tmp_path, where):
    """Issue 59 (b): a second "smallest proven radius" row above the genuine one (16 over 3.75), or a second
    attack row showing 0 exposed, verified, because only the last matching row was read. The card is read whole:
    each claim once, in the Effect table, nothing else shaped like a table."""
    release = _copy(genuine, tmp_path / "release")
    config = _config(release)
    gate = config["protection"]["release_gate"]
    from ttp_lightning.release import effect_rows

    rows = effect_rows(gate["gamma"], gate["conf_dist_at_most"])
    radius_label, exposed_label = rows["forget_proven_radius_min"][0], rows["forget_robust_exposed"][0]

    def edit(lines):
        index = next(i for i, line in enumerate(lines) if line.startswith(f"| {radius_label} |"))
        exposed = next(i for i, line in enumerate(lines) if line.startswith(f"| {exposed_label} |"))
        forged, forged_exposed = f"| {radius_label} | 0 | 16 |", f"| {exposed_label} | 20 | 0 |"
        if where == "above":
            return lines[:index] + [forged] + lines[index:]
        if where == "below":
            return lines[:exposed + 1] + [forged_exposed] + lines[exposed + 1:]
        if where == "outside":
            return lines + ["", "| measure | before | after |", "|---|---|---|", forged]
        if where == "no pipes":
            return lines + ["", "measure | before | after", "--- | --- | ---", f"{radius_label} | 0 | 16"]
        if where == "html":
            return lines + [f"<table><tr><td>{radius_label}</td><td>16</td></tr></table>"]
        if where == "missing":
            return lines[:index] + lines[index + 1:]
        return lines[:index - 1] + [lines[index], lines[index - 1]] + lines[index + 1:]

    assert _check(release, genuine.forget, "--gamma", "0")[0] == 0
    _card_with(release, edit)
    code, text = _check(release, genuine.forget, "--gamma", "0")
    assert code == 1 and CARD in text.split("FAIL")[-1] and "verified" not in text.split("FAIL")[-1], text
    message = {"above": "two rows for", "below": "two rows for", "outside": "outside the Effect table",
               "no pipes": "outside the Effect table", "html": "HTML table", "missing": "has no row",
               "reordered": "not in the order"}[where]
    assert message in text, text


@pytest.mark.parametrize("step, largest", [(1.7e308, 1.7e308), (1e308, 1.7e308), (1.7e308, 16.0), (1.0, 300.0)])
def test_a_radius_grid_no_run_has_is_one_failure_line(genuine, tmp_path, step, largest):
    """Issue 59, minor: a claimed grid of step 1.7e308 was a traceback (torch's arange of 0 -> inf)."""
    release = _copy(genuine, tmp_path / "release")
    config = _config(release)
    config["protection"]["per_image"].update(radius_step=step, max_radius=largest)
    _write_config(release, config)
    code, text = _check(release, genuine.forget, "--gamma", "0")
    assert code == 1 and "which no run has" in text and "Traceback" not in text, text


def test_a_forget_folder_with_a_repeated_image_is_checked_as_the_set_it_is(genuine, tmp_path):
    """Issue 59, minor: one image twice made verify say "these are 21 images" against forget_size 20 (and the mean
    and shares differ). Each distinct image is checked once, and the repeat is named."""
    folder = tmp_path / "forget"
    shutil.copytree(genuine.forget, folder)
    first = min(folder.rglob("*.png"))
    shutil.copyfile(first, folder / "again.png")
    code, text = _check(genuine.release, folder, "--gamma", "0")
    assert code == 0 and "again.png" in text.split("holds the same pixels as")[1].split("\n")[0] + \
        text.split("holds the same pixels as")[0] and "checked once, as one image" in text, text
    assert "these 20 images are the release's forget set" in text


def test_a_huge_sparse_weights_file_is_refused_before_it_is_hashed(genuine, tmp_path):
    """Issue 59, minor: a 3 GB sparse model.safetensors was hashed whole before any size check."""
    import time

    release = _copy(genuine, tmp_path / "release")
    with open(release / "model.safetensors", "r+b") as handle:
        handle.truncate(3 << 30)  # sparse: no disk used
    started = time.monotonic()
    code, text = _check(release, genuine.forget, "--gamma", "0")
    assert code == 2 and "3,221,225,472 bytes" in text and "at most" in text, text
    assert time.monotonic() - started < 20  # hashing 3 GB takes longer than this on 2 cores
    with pytest.raises(TTPUserError, match="bytes; the network config.json describes holds"):
        load_released(release)


def test_a_pipe_in_the_cards_prose_is_no_table(genuine, tmp_path):
    """An experiment named `a|b` puts a pipe in the card's title: prose, not a table (no delimiter row), so the
    genuine release still verifies; the same words as a table do not."""
    release = _copy(genuine, tmp_path / "release")
    _card_with(release, lambda lines: [lines[0] + " a|b", *lines[1:], "", "see runs a | b for more"])
    code, text = _check(release, genuine.forget, "--gamma", "0")
    assert code == 0, text
    _card_with(release, lambda lines: [*lines, "", "~~~", "| forget images proven <= 0.1 within 2/255 | 0 % | 100 % |",
                                       "~~~"])
    assert _check(release, genuine.forget, "--gamma", "0")[0] == 1


def test_a_key_twice_in_config_json_is_refused(genuine, tmp_path):
    """A JSON object with "protected" twice is read as its last value by Python and its first by other readers: an
    ambiguity no checker should resolve for the folder."""
    release = _copy(genuine, tmp_path / "release")
    text = (release / "config.json").read_text()
    (release / "config.json").write_text(text.replace('"protected": true', '"protected": false, "protected": true'))
    code, text = _check(release, genuine.forget, "--gamma", "0")
    assert code == 2 and "'protected' appears twice" in text and text.count("\n") == 1, text
    with pytest.raises(TTPUserError, match="appears twice"):
        load_released(release)


def test_the_card_is_a_hub_readme_whose_metadata_restates_the_effect_table(genuine):
    """Issue 63: README.md as a model hub reads it (huggingface_hub.ModelCard.load): licence, library, tags, the data
    set and the Effect table's after values as model-index results; load and verify take it as it is."""
    from huggingface_hub import ModelCard

    from ttp_lightning.release.card import card_cells, number_of

    card = ModelCard.load(genuine.release / CARD)
    data, config = card.data, _config(genuine.release)
    assert data.license == "other" and data.library_name == "pytorch" and data.pipeline_tag == "image-classification"
    assert {"ttp_lightning", "protected"} <= set(data.tags) and "not-protected" not in data.tags
    assert data.datasets == ["digits"] and data.to_dict()["ttp_lightning"]["protected"] is True
    gate = config["protection"]["release_gate"]
    cells, failures = card_cells((genuine.release / CARD).read_text(), gate["gamma"], gate["conf_dist_at_most"])
    assert not failures
    stated = {result.metric_type: result.metric_value for result in data.eval_results}
    assert stated == {key: number_of(cell) for key, cell in cells.items() if number_of(cell) is not None}
    assert "test_acc" in stated and "forget_proven_worst_conf_dist" in stated
    assert card.text.lstrip().startswith("# Model card")
    load_released(genuine.release)
    assert _check(genuine.release, genuine.forget, "--gamma", "0")[0] == 0


def test_metadata_the_hub_reader_cannot_parse_fails_instead_of_escaping_comparison(genuine, tmp_path):
    """A model-index result without its `dataset` is dropped whole when metadata errors are ignored: its numbers
    (here a test accuracy the Effect table does not state) would reach a hub page compared with nothing."""
    release = _copy(genuine, tmp_path / "release")
    lines = (release / CARD).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "dataset:")
    assert lines[start + 1].strip().startswith("name:") and lines[start + 2].strip().startswith("type:")
    edited = lines[:start] + lines[start + 3:]
    value = next(i for i, line in enumerate(edited) if line.strip().startswith("value:"))
    edited[value] = edited[value].split("value:")[0] + "value: 12.0"
    (release / CARD).write_text("\n".join(edited))
    code, text = _check(release, genuine.forget, "--gamma", "0")
    assert code == 1 and "metadata cannot be read" in text, text
