"""`verify attack`: an auditor attacks a release around given images from seeds of their choosing; the verdict is
the attack's own, the release's claims can only fail against it, and NaN never passes."""

import contextlib
import io
import json
import math

import torch
from safetensors.torch import load_file, save_file

from test_verify_robust import _config, _copy, _rehash, _write_config, genuine  # noqa: F401 -- the fixture
from ttp_lightning.verify import main as verify
from ttp_lightning.verify.attack import attacked_conf_dist

CHEAP = ["--steps", "5", "--restarts", "1"]


def _attack(release, images, *extra: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = verify(["attack", str(release), str(images), *CHEAP, *extra])
    return code, out.getvalue() + err.getvalue()


class _Linear(torch.nn.Module):
    """Uniform at the grey image, confident a little way off it: any attack that moves finds confidence."""

    def __init__(self, classes: int = 4):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(classes, 16, generator=torch.Generator().manual_seed(1)) * 50)

    def forward(self, images):
        return (images.flatten(1) - 0.5) @ self.weight.T


def test_the_attack_never_reports_less_than_the_image_and_every_class_only_adds():
    model, images = _Linear(), torch.full((3, 1, 4, 4), 0.5)
    untargeted = attacked_conf_dist(model, images, 8 / 255, seed=0, steps=5, restarts=1, every_class=False)
    targeted = attacked_conf_dist(model, images, 8 / 255, seed=0, steps=5, restarts=1, every_class=True)
    assert untargeted.dtype == torch.float64 and (untargeted > 0.3).all()  # the image itself is at CD 0
    assert (targeted >= untargeted).all()  # the same seed's untargeted attack runs first, then every class
    still = attacked_conf_dist(model, images, 0.0, seed=0, steps=5, restarts=1, every_class=True)
    assert torch.allclose(still, torch.zeros(3, dtype=torch.float64), atol=1e-6)  # radius 0: the images alone
    again = attacked_conf_dist(model, images, 8 / 255, seed=0, steps=5, restarts=1, every_class=True)
    assert torch.equal(again, targeted)  # a seed is a reproducible attack


def test_verify_attack_passes_within_what_an_attack_can_reach_and_fails_confident_images(genuine, tmp_path):  # noqa: F811
    release = _copy(genuine, tmp_path / "release")
    code, text = _attack(release, genuine.forget, "--gamma", "0", "--seeds", "3")
    assert code == 0 and "no attack found any of the 20 images" in text and "evidence, not proof" in text, text
    assert "the release's forget set" in text
    code, text = _attack(release, genuine.forget, "--gamma", "2", "--at-most", "0.899", "--seeds", "0", "1")
    assert code == 0 and "seed 0:" in text and "seed 1:" in text, text  # nothing exceeds 1 - 1/K
    code, text = _attack(release, genuine.other, "--gamma", "0")
    assert code == 1 and "ABOVE" in text and "no attack found" not in text  # confident on images it never forgot


def test_a_claim_below_what_the_attack_finds_fails(genuine, tmp_path):  # noqa: F811
    """The release says no attack reaches above its worst; an attack that finds more refutes the claim, whatever
    the threshold."""
    release = _copy(genuine, tmp_path / "release")
    config = _config(release)
    gamma = config["protection"]["per_image"]["gamma"]
    config["protection"]["per_image"]["forget_robust_worst_conf_dist"] = 0.0
    _write_config(release, config)
    code, text = _attack(release, genuine.forget, "--gamma", f"{gamma:g}", "--at-most", "0.899", "--seeds", "0")
    assert code == 1 and "claims forget_robust_worst_conf_dist = 0.0" in text and "this attack found" in text, text


def test_nan_never_passes_and_bad_arguments_end_in_one_error_line(genuine, tmp_path, monkeypatch):  # noqa: F811
    release = _copy(genuine, tmp_path / "release")
    state = load_file(str(release / "model.safetensors"))
    last = max(state)
    state[last] = torch.full_like(state[last], math.nan)
    save_file(state, str(release / "model.safetensors"))
    _write_config(release, _rehash(release, _config(release)))
    code, text = _attack(release, genuine.forget, "--gamma", "1", "--seeds", "0")
    assert code == 2 and "non-finite values" in text, text  # NaN weights are no model

    from ttp_lightning.verify import attack as verify_attack

    real = verify_attack.conf_dist_of_probs
    monkeypatch.setattr(verify_attack, "conf_dist_of_probs", lambda probs: real(probs) * math.nan)  # whatever made it
    code, text = _attack(genuine.release, genuine.forget, "--gamma", "1", "--at-most", "0.899", "--seeds", "0")
    assert code == 1 and text.count("ABOVE") == 20 and "no attack found" not in text, text
    monkeypatch.undo()

    for argument in (["--seeds", "-1"], ["--seeds", "2", "2"], ["--steps", "0"], ["--restarts", "0"],
                     ["--gamma", "nan"], ["--at-most", "nan"], ["--gamma", "300"]):
        code, text = _attack(genuine.release, genuine.forget, *argument)
        assert code == 2 and text.startswith("error: cannot verify:") and text.count("\n") == 1, (argument, text)
    assert _attack(tmp_path, genuine.forget)[0] == 2  # not a release folder
    json.loads((genuine.release / "config.json").read_text())  # the fixture's own release is untouched
