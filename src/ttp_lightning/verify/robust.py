"""`python -m ttp_lightning.verify robust RELEASE_DIR IMAGES_DIR [--gamma 8] [--at-most 0.1]`: re-check a
release's proven uniformity without the training data.

For every image under IMAGES_DIR (PNG or JPEG, in any subfolders; labels are not needed) it computes, from the
release's weights alone, an upper bound on the confidence distance (CD) anywhere in the L-inf ball of radius
gamma / 255 around the image (linear bound propagation, CROWN, never looser than interval bounds, computed in
float64 and sound for the network evaluated in float32, rounding included: ttp_lightning.bounds, bounds/rounding.py):
no perturbation of the image within that radius can make the released model, as load_released runs it, more
confident than that; and the image's proven radius, the largest radius (0, 1/4, ..., 16 per 255) at which that bound is
at most --at-most. A provider, an auditor or a data subject holding the images can run it; nothing is trusted
but the weights file, whose SHA-256 must match the release's config.json, and the images.

The verdict is this checker's own: --gamma and --at-most are its settings (default 8/255 and 0.1), never
numbers read from the folder. What the folder says is compared with what is recomputed, and a mismatch fails,
but it never makes a pass: a release whose config.json says it is not protected fails (unless
--allow-unprotected), and when the images are exactly the release's forget set (their set digest matches
config.json) every claim about them that can be recomputed is (the worst clean and proven CD, the counts
and shares, the mean CD, its own gate's verdict; the attacked values must lie between the clean value and the
proven bound). Every comparison fails on NaN.

Exit status: 0 every image's clean and proven CD are at most --at-most within --gamma; 1 an image is above it,
a value is not finite, a bound is below the CD measured at the image itself (UNSOUND), the release says it is not
protected, or a claim does not match what is recomputed or escapes comparison (one FAIL line each); 2 unusable or hostile input (a release folder or config.json outside the format, weights that are not
the file config.json names, an unreadable image, an image of the wrong shape, a network the bound does not
support).
"""

import argparse
import math
import statistics
from pathlib import Path

from ttp_lightning.assess.protection import stage_summary
from ttp_lightning.bounds import UnsupportedLayer
from ttp_lightning.bounds.linear import INTERMEDIATE, INTERMEDIATE_BUDGET, SLOPE_STEPS
from ttp_lightning.bounds.uniformity import BOUNDS, MAX_RADIUS, RADIUS_STEP, Prover
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.release import MAX_SLOPE_STEPS, card_cells, effect_rows, read_release_config
from ttp_lightning.release.card import card_title, metadata_failures
from ttp_lightning.release.format import EARLIER_FORMATS, EXACT_CLAIMS, card_name
from ttp_lightning.release.publish import PER_IMAGE_KEYS
from ttp_lightning.verify.common import (
    CLAIM_TOLERANCE,
    DEFAULT_AT_MOST,
    DEFAULT_GAMMA,
    EXIT_FAIL,
    EXIT_OK,
    INPUT_ERRORS,
    MAX_GAMMA,
    Subjects,
    add_release_arguments,
    cannot_verify,
    check_arguments,
    failed,
    is_forget_set,
    load_subjects,
    unprotected_failures,
)

UNSOUND_TOLERANCE = 1e-6  # a bound this far below the measured clean CD is a broken bound, not rounding
NOT_PROTECTED_TITLE = ": NOT PROTECTED"  # the model card's title of a release whose gate failed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("release", type=Path, help="the release folder (model.safetensors, config.json)")
    parser.add_argument("images", type=Path, help="a folder of the images to check (PNG or JPEG, any subfolders)")
    parser.add_argument("--gamma", type=float, default=DEFAULT_GAMMA, metavar="G",
                        help=f"L-inf radius in units of 1/255, 0..{MAX_GAMMA:g} (default {DEFAULT_GAMMA:g}; 0: the "
                             "images themselves)")
    parser.add_argument("--at-most", type=float, default=DEFAULT_AT_MOST, metavar="CD",
                        help=f"every image's proven CD must be at most this, in [0, 1) (default {DEFAULT_AT_MOST:g})")
    parser.add_argument("--bound", choices=BOUNDS, default="linear",
                        help="linear (CROWN, never looser than intervals; intervals where a layer has no linear rule) "
                             "or interval (default linear)")
    parser.add_argument("--intermediate", choices=("auto", *INTERMEDIATE), default="auto",
                        help="CROWN's pre-activation bounds: crown, ibp, or auto (crown for networks with at most "
                             f"{INTERMEDIATE_BUDGET} neurons behind a ReLU feeding another; default)")
    parser.add_argument("--slope-steps", type=int, default=SLOPE_STEPS, metavar="S",
                        help="with intermediate crown, where a ReLU feeds another: alpha-CROWN's steps on the final "
                             f"bounds' ReLU slopes, 0..1000 (default {SLOPE_STEPS}; 0: CROWN's own slopes)")
    add_release_arguments(parser)


def check_slope_steps(slope_steps: int) -> None:
    if not 0 <= slope_steps <= MAX_SLOPE_STEPS:
        raise TTPUserError(f"--slope-steps={slope_steps} is not allowed; choose an integer in [0, {MAX_SLOPE_STEPS}]")


def _close(stated, value: float) -> bool:
    """A stated number equal to a recomputed one within CLAIM_TOLERANCE (NaN, None or text never is)."""
    return isinstance(stated, (int, float)) and not isinstance(stated, bool) and abs(stated - value) <= CLAIM_TOLERANCE


def _between(stated, low: float, high: float) -> bool:
    """A stated number within [low, high], CLAIM_TOLERANCE either side (NaN never is)."""
    return low - CLAIM_TOLERANCE <= stated <= high + CLAIM_TOLERANCE


def claim_failures(protection: dict, recomputed: "Recomputation", num_classes: int,
                   precision: str = "float32") -> list[str]:
    """config.json's claims about its forget set (these images) against what is recomputed from the weights,
    by the bound the release states it used (sound for `precision`: float64, the exact function, for releases
    before /3): each number that can be recomputed (proven CDs, radii), the attacked values between the clean
    CD and the proven bound, and the release's own gate verdict."""
    claims, gate = protection["per_image"], protection["release_gate"]
    gamma, threshold = claims["gamma"], gate["conf_dist_at_most"]
    failures = []
    if gate["gamma"] != gamma:
        failures.append(f"config.json states two radii: release_gate.gamma={gate['gamma']} and per_image.gamma={gamma}")
    if not 0.0 <= gamma <= MAX_GAMMA:
        return [*failures, f"config.json claims per_image.gamma={gamma}; a radius is in [0, {MAX_GAMMA:g}]"]
    if not 0.0 <= threshold < 1.0 - 1.0 / num_classes:
        why = f"config.json claims a release gate at CD <= {threshold}, which cannot fail with {num_classes} classes"
        return [*failures, why]
    grid = (claims.get("radius_step", RADIUS_STEP), claims.get("max_radius", MAX_RADIUS))
    if not (0 < grid[0] <= grid[1] <= MAX_GAMMA and grid[1] <= 4096 * grid[0]):
        return [*failures, f"config.json claims a radius grid of step {grid[0]} up to {grid[1]}, which no run has"]
    bound = (claims.get("bound") or "interval", claims.get("intermediate") or "crown",  # release/1: intervals
             claims.get("slope_steps") or 0)
    clean, proven = recomputed.clean, recomputed.proven(gamma, *bound, precision=precision)
    radii = recomputed.radius(threshold, *bound, *grid, precision=precision) \
        if "forget_proven_radius_min" in claims else None

    def above(values):
        return sum(not value <= threshold for value in values)

    columns = {"proven": proven, "proven_radius": radii}
    bounds = stage_summary(columns, threshold)  # as the run summarised them
    measured = {"forget_worst_conf_dist": max(clean), "forget_exposed": above(clean),
                **{key: bounds[key] for key in ("forget_proven_worst_conf_dist", "forget_proven_share_05",
                                                "forget_proven_share_10", "forget_proven_radius_min",
                                                "forget_proven_radius_median") if key in bounds}}
    for key, value in measured.items():
        if not _close(claims[key], value):
            failures.append(f"config.json claims {key} = {claims[key]} within {gamma:g}/255; recomputed from the "
                            f"weights: {value:.6g}")
    if not _close(protection["forget_conf_dist"], sum(clean) / len(clean)):
        failures.append(f"config.json claims forget_conf_dist = {protection['forget_conf_dist']}; recomputed: "
                        f"{sum(clean) / len(clean):.6g}")
    if protection["forget_size"] != len(clean):
        failures.append(f"config.json claims forget_size = {protection['forget_size']}; these are {len(clean)} images")
    # an attack finds a point in the ball: never below the clean CD, never above the proven bound
    for key, low, high in (("forget_robust_worst_conf_dist", max(clean), max(proven)),
                           ("forget_robust_exposed", above(clean), above(proven))):
        if claims[key] is not None and not _between(claims[key], low, high):
            failures.append(f"config.json claims {key} = {claims[key]} within {gamma:g}/255; an attack can only find "
                            f"a value between {low:.6g} (the images) and {high:.6g} (the proven bound)")
    return failures + gate_claim_failures(protection, clean, proven, radii)


def gate_claim_failures(protection: dict, clean: list[float], proven: list[float],
                        radii: list[float] | None) -> list[str]:
    """A release that says it is protected must meet its own stated gate on the recomputed values."""
    gate = protection["release_gate"]
    if not protection["protected"]:
        return []
    if gate["reasons"]:
        return [f"config.json says protected, yet lists why its gate failed: {gate['reasons'][0]}"]
    if "clean" not in gate["require"]:
        return [f"config.json says protected under a gate that does not require clean: {gate['require']}"]
    threshold, attacked = gate["conf_dist_at_most"], protection["per_image"]["forget_robust_worst_conf_dist"]
    worst = {"clean": max(clean), "proven": max(proven), "attacked": attacked}
    failures = [f"config.json says protected with every forget image's {kind} CD <= {threshold}, but the worst is "
                f"{worst[kind]}" for kind in gate["require"]
                if not (isinstance(worst[kind], (int, float)) and worst[kind] <= threshold)]
    least = gate.get("min_proven_radius")
    if least is not None and not (radii is not None and min(radii) >= least):
        failures.append(f"config.json says protected with every forget image proven within {least}/255, but the "
                        f"smallest proven radius recomputes to {None if radii is None else min(radii)}")
    return failures


def folder_failures(release: Path, config: dict) -> list[str]:
    """What the folder says about itself that must agree: the model card's title with config.json's verdict, the
    card's Effect cells with config.json's claims (which are compared with the recomputation), and `certificate`
    with the certificate beside it."""
    protection = config["protection"]
    card = card_name(config["format"])
    text = (release / card).read_text(errors="replace")
    title = card_title(text)
    failures = []
    if (NOT_PROTECTED_TITLE in title) == protection["protected"]:
        failures.append(f"{card}'s title {title[:80]!r} contradicts config.json's \"protected\": "
                        f"{str(protection['protected']).lower()}")
    claims = {**protection["per_image"], "forget_conf_dist": protection["forget_conf_dist"],
              "test_acc": protection["test_acc"]}
    gate = protection["release_gate"]
    old_words = config["format"] in EARLIER_FORMATS  # its card's labels said certified
    rows = effect_rows(gate["gamma"], gate["conf_dist_at_most"], old_words)
    cells, unreadable = card_cells(text, gate["gamma"], gate["conf_dist_at_most"], old_words)
    failures += unreadable
    if config["format"] != "ttp_lightning.release/1" and not unreadable and cells.keys() != rows.keys():
        missing = next(rows[key][0] for key in rows if key not in cells)
        failures.append(f"{card}'s Effect table has no row {missing!r}")
    for key in rows.keys() & claims.keys():
        expected = rows[key][1]({key: claims[key]})
        if cells.get(key) != expected:
            failures.append(f"{card} says {cells.get(key, 'nothing')!r} for {rows[key][0]!r}; config.json claims "
                            f"{expected!r}")
    failures += metadata_failures(text, cells, rows, protection["protected"])
    if protection["certificate"] != (release / "certificate.json").is_file():
        failures.append(f"config.json says certificate: {str(protection['certificate']).lower()}, but the folder "
                        + ("holds no" if protection["certificate"] else "holds a") + " certificate.json")
    return failures


class Recomputation:
    """What verify recomputes from the weights and the images alone: each image's clean CD and, per bound
    (linear or interval, CROWN's intermediate mode), proven CDs at a radius and proven radii at a
    threshold, each computed once."""

    def __init__(self, subjects: Subjects, budget: int = INTERMEDIATE_BUDGET):
        self.model, self.images, self.clean, self.budget = subjects.model, subjects.images, subjects.clean, budget
        self._provers: dict = {}
        self._values: dict = {}

    def prover(self, bound: str, intermediate: str, slope_steps: int = SLOPE_STEPS,
                  precision: str = "float32") -> Prover:
        """One Prover per bound actually used (`auto` resolved first, so it shares the mode it resolves to);
        `precision` the one the bound is sound for (float64: the exact function, as releases before /3 claimed)."""
        if intermediate == "auto" and bound == "linear":
            intermediate = Prover(self.model, bound, budget=self.budget, intermediate="auto").resolve(self.images[:1])
        linear = bound == "linear"
        key = (bound, intermediate if linear else None, slope_steps if linear and intermediate == "crown" else 0,
               precision)
        if key not in self._provers:
            self._provers[key] = Prover(self.model, bound, intermediate=intermediate, budget=self.budget,
                                              slope_steps=slope_steps, precision=precision)
        return self._provers[key]

    def proven(self, gamma: float, bound: str = "linear", intermediate: str = "auto",
                  slope_steps: int = SLOPE_STEPS, precision: str = "float32") -> list[float]:
        prover = self.prover(bound, intermediate, slope_steps, precision)
        key = ("proven", gamma, id(prover))
        if key not in self._values:
            self._values[key] = prover.conf_dist(self.images, gamma).tolist()
        return self._values[key]

    def radius(self, at_most: float, bound: str = "linear", intermediate: str = "auto",
               slope_steps: int = SLOPE_STEPS, step: float = RADIUS_STEP, largest: float = MAX_RADIUS,
               precision: str = "float32") -> list[float]:
        prover = self.prover(bound, intermediate, slope_steps, precision)
        key = ("radius", at_most, id(prover), step, largest)
        if key not in self._values:
            self._values[key] = prover.radius(self.images, at_most, step, largest).tolist()
        return self._values[key]


def image_verdict(clean: float, bound: float, at_most: float) -> str | None:
    """None when an image passes: its clean CD (the float32 network at the image) and its proven bound both
    finite and at most `at_most`, and the bound not below the clean CD (the ball holds the image, so a bound
    below a value measured there is no bound: said loudly); else why it fails."""
    if not (math.isfinite(clean) and math.isfinite(bound)):
        return f"a value is not finite (clean {clean}, proven {bound})"
    if bound < clean - UNSOUND_TOLERANCE:
        return (f"UNSOUND BOUND: proven CD {bound:.4f} is below the CD {clean:.4f} measured at the image itself "
                "(float32); the bound does not describe the network people run, and nothing it proves holds")
    if clean > at_most:
        return f"clean CD {clean:.4f} at the image itself is not <= {at_most:g}"
    if bound > at_most:
        return f"proven CD {bound:.4f} (clean {clean:.4f}) is not <= {at_most:g}"
    return None


def image_lines(args, files: list[Path], clean: list[float], bounds: list[float], radii: list[float], used) -> list[str]:
    """Print the header and one line per image; returns a failure per image that does not pass (image_verdict)."""
    how = used.bound + (f", intermediate {used.intermediate}" if used.bound == "linear" else "") + \
        (f", {used.slopes_used} slope steps" if used.slopes_used else "") + \
        (f"; linear bounds fell back: {used.fallback}" if used.fallback else "")
    print(f"{'image':<40}  {'clean CD':>8}  {'proven CD':>12}  {'radius':>6}  (L-inf {args.gamma:g}/255, at most "
          f"{args.at_most:g}; {how} bounds, sound for {used.rounding.precision})")
    failures = []
    for path, value, bound, radius in zip(files, clean, bounds, radii):
        name = str(path.relative_to(args.images))
        why = image_verdict(value, bound, args.at_most)
        verdict = "ok" if why is None else "UNSOUND" if why.startswith("UNSOUND") else "ABOVE"
        print(f"{name[-40:]:<40}  {value:8.4f}  {bound:12.4f}  {radius:6g}  {verdict}")
        if why is not None:
            failures.append(f"{name}: {why} within {args.gamma:g}/255")
    return failures


def digest_failures(protection: dict) -> list[str]:
    """A release that makes claims about its forget set must say which set (its digest): without one no images can
    be matched to the claims, so none would ever be compared."""
    if protection["forget_set_digest"] is not None:
        return []
    claimed = [key for key in PER_IMAGE_KEYS if protection["per_image"].get(key) is not None]
    claimed += ["forget_conf_dist"] if protection["forget_conf_dist"] is not None else []
    if not claimed:
        return []
    value = protection["per_image"].get(claimed[0], protection["forget_conf_dist"])
    why = (f"config.json claims {claimed[0]} = {value} and more about its forget set but states no "
           "forget_set_digest: no images can be matched to those claims, so none of them can be compared")
    return [why]


def run(args) -> int:
    """`verify robust`: one line per image (clean CD, proven CD within --gamma/255, proven radius); exit 0
    every image's clean and proven CD at --at-most, 1 an image above it, a non-finite value, an unsound bound, an
    unprotected release or a claim the recomputation contradicts or that escapes comparison, 2 unusable input."""
    try:
        check_arguments(args.gamma, args.at_most)
        check_slope_steps(args.slope_steps)
        config = read_release_config(args.release)
        subjects = load_subjects(args.release, config, args.images, args.resize)
        recomputed = Recomputation(subjects)
        how = (args.bound, args.intermediate, args.slope_steps)
        bounds, radii, used = recomputed.proven(args.gamma, *how), recomputed.radius(args.at_most, *how), \
            recomputed.prover(*how)
    except (*INPUT_ERRORS, UnsupportedLayer) as exc:
        return cannot_verify(exc)

    files = subjects.files
    failures = unprotected_failures(args, config, "checks its bounds anyway")
    failures += image_lines(args, files, recomputed.clean, bounds, radii, used)
    failures += folder_failures(args.release, config)
    failures += forget_set_failures(config, subjects, recomputed)
    if failed(failures):
        return EXIT_FAIL
    print(f"verified: every one of the {len(files)} images has proven CD <= {args.at_most:g} anywhere within "
          f"{args.gamma:g}/255 (worst {max(bounds):.4f}; proven radius min {min(radii):g}/255, median "
          f"{statistics.median(radii):g}/255), from the weights alone")
    return EXIT_OK


def forget_set_failures(config: dict, subjects: Subjects, recomputed: Recomputation) -> list[str]:
    """The claims about the forget set: none without a digest naming it, and, when these images are that set, every
    claim that can be recomputed (by the bounds the release's format wrote its claims with)."""
    protection = config["protection"]
    failures = digest_failures(protection)
    files = subjects.files
    if not is_forget_set(subjects.pixels, config):
        print(f"these {len(files)} images are not exactly the release's forget set (set digest differs from "
              "config.json); each bound above is still a proof for its own image" +
              ("; if they are the images you asked to protect, the release names another set, and none of its "
               "claims is about them" if len(files) == protection["forget_size"] else ""))
        return failures
    print(f"these {len(files)} images are the release's forget set (its set digest matches config.json); its "
          "claims about them are compared with what is recomputed")
    exact = config["format"] in EXACT_CLAIMS  # its claims were computed for the exact function (the verdict never)
    if exact:
        print(f"its claims were written by {config['format']}, for the exact function of the weights: compared "
              "with bounds of that function (the verdict above is for the float32 network)")
    return failures + claim_failures(protection, recomputed, config["input"]["num_classes"],
                                     "float64" if exact else "float32")


DESCRIPTION, EPILOG = __doc__.split("\n\n")[0], __doc__.split("\n\n")[-1]
