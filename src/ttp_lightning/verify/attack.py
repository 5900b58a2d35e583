"""`python -m ttp_lightning.verify attack RELEASE_DIR IMAGES_DIR [--gamma 8] [--at-most 0.1] [--seeds 0 1 2 3 4]`:
attack a release around given images from random starts the release never saw.

A release's gate judged its forget images with one attack from one seed (conf/attacks' `seed`). An attack is
evidence, not proof: another seed may find what that one missed, and a release selected or tuned against one
seed's random starts can pass it alone. This command lets a provider, an auditor or a data subject holding the
images attack the released weights themselves: for each seed, APGD (attacks/apgd.py, the project's default
attack: exact gradients and two ReLU surrogates, --restarts restarts, --steps steps) on the objectives that need
no training data (logsumexp, max_softmax, and with --every-class the `targeted` objective: the log-probability of
each of the image's ten highest-scoring classes in turn, every class of a data set with at most ten), at the
radii gamma/8, gamma/4, gamma/2 and gamma, each started from the worst point the smaller radius found. Per image
the worst CD over every seed, radius and the image itself is kept. Nothing is trusted but the weights file, whose
SHA-256 must match config.json, and the images.

The verdict is this command's own (--gamma, --at-most, the seeds), never numbers read from the folder. When the
images are exactly the release's forget set (their set digest matches config.json) and the radius is the one the
release states, its claimed worst attacked CD and exposed count are compared with what this attack finds: a
release that claims less than an attack finds understates its exposure, and fails.

Exit status: 0 no attack found an image above --at-most within --gamma (evidence only: `verify robust` proves a
bound); 1 an image above it or a value that is not finite, a release that says it is not protected (unless
--allow-unprotected), or a claim this attack contradicts (one FAIL line each); 2 unusable or hostile input.
"""

import argparse
import math
from pathlib import Path
from types import SimpleNamespace

import torch

from ttp_lightning.attacks.apgd import adaptive_attack
from ttp_lightning.attacks.objectives import TARGETED
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.core.metrics import conf_dist_of_probs
from ttp_lightning.core.nn_modes import evaluating
from ttp_lightning.release import read_release_config
from ttp_lightning.verify.common import (
    CLAIM_TOLERANCE,
    DEFAULT_AT_MOST,
    DEFAULT_GAMMA,
    EXIT_FAIL,
    EXIT_OK,
    INPUT_ERRORS,
    add_release_arguments,
    cannot_verify,
    check_arguments,
    failed,
    is_forget_set,
    load_subjects,
    unprotected_failures,
)

DEFAULT_SEEDS = (0, 1, 2, 3, 4)
MAX_SEEDS, MAX_STEPS, MAX_RESTARTS = 100, 10_000, 100
CHAIN = (0.125, 0.25, 0.5, 1.0)  # fractions of gamma, each radius started from the smaller one's worst point
SURROGATE_BETAS = (None, 10.0, 1.0)  # as conf/attacks: exact gradients, then two ReLU surrogates
CHUNK = 256  # images attacked at once


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("release", type=Path, help="the release folder (model.safetensors, config.json)")
    parser.add_argument("images", type=Path, help="a folder of the images to attack (PNG or JPEG, any subfolders)")
    parser.add_argument("--gamma", type=float, default=DEFAULT_GAMMA, metavar="G",
                        help=f"the L-inf radius to attack within, in units of 1/255 (default {DEFAULT_GAMMA:g})")
    parser.add_argument("--at-most", type=float, default=DEFAULT_AT_MOST, metavar="CD",
                        help=f"the largest CD an attack may reach on any image (default {DEFAULT_AT_MOST:g})")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(DEFAULT_SEEDS), metavar="S",
                        help="the random starts' seeds, each a whole attack (default 0 1 2 3 4)")
    parser.add_argument("--steps", type=int, default=100, metavar="N", help="APGD steps per radius (default 100)")
    parser.add_argument("--restarts", type=int, default=2, metavar="R",
                        help="APGD restarts per objective, surrogate and radius (default 2)")
    parser.add_argument("--every-class", action=argparse.BooleanOptionalAction, default=True,
                        help="also maximise each class's log-probability in turn (default on; costs one objective "
                             "per class)")
    add_release_arguments(parser)


def check_attack_arguments(seeds: list[int], steps: int, restarts: int) -> None:
    """The attack's own budget: bounded work, seeds a torch.Generator takes."""
    if not 1 <= len(seeds) <= MAX_SEEDS or any(not 0 <= seed < 2**63 for seed in seeds):
        raise TTPUserError(f"--seeds={seeds} is not allowed; choose 1 to {MAX_SEEDS} integers in [0, 2**63)")
    if len(set(seeds)) != len(seeds):
        raise TTPUserError(f"--seeds={seeds} repeats a seed; each seed is a whole attack, give each once")
    if not 1 <= steps <= MAX_STEPS:
        raise TTPUserError(f"--steps={steps} is not allowed; choose an integer in [1, {MAX_STEPS}]")
    if not 1 <= restarts <= MAX_RESTARTS:
        raise TTPUserError(f"--restarts={restarts} is not allowed; choose an integer in [1, {MAX_RESTARTS}]")


def attacked_conf_dist(model, images, gamma: float, seed: int, steps: int, restarts: int, every_class: bool):
    """[N] float64: per image the highest CD (1 - 1/K scale, as everywhere) found from `seed`'s random starts at
    the radii CHAIN x gamma (in [0, 1] pixels), never below the image's own."""
    generator = torch.Generator().manual_seed(seed)
    objectives = ["logsumexp", "max_softmax"] + ([TARGETED] if every_class else [])
    cfg = SimpleNamespace(objectives=objectives, restarts=restarts, apgd_steps=steps,
                          surrogate_betas=list(SURROGATE_BETAS))
    worst = torch.full((len(images),), -math.inf, dtype=torch.float64)

    def cd(x):
        with torch.no_grad():
            return conf_dist_of_probs(model(x).softmax(-1).double())

    for start in range(0, len(images), CHUNK):
        chunk = images[start:start + CHUNK]
        found, warm = cd(chunk), None
        targets = torch.zeros(len(chunk), dtype=torch.long)  # no objective here reads them: targeted picks its own
        for fraction in CHAIN if gamma > 0 else ():
            with evaluating(model), torch.enable_grad():
                warm = adaptive_attack(model, chunk, fraction * gamma, generator, cfg, targets=targets,
                                       warm_start=warm)
            found = torch.maximum(found, cd(warm))  # NaN stays NaN: it never passes
        worst[start:start + CHUNK] = found
    return worst


def claim_failures(protection: dict, gamma: float, at_most: float, worst: list[float]) -> list[str]:
    """The release's claims about its forget set at this radius that an attack can refute: an attack found a higher
    worst CD, or more images above the gate's threshold, than the release says any attack reaches."""
    claims, gate = protection["per_image"], protection["release_gate"]
    if claims.get("gamma") != gamma:
        return []
    failures = []
    stated = claims.get("forget_robust_worst_conf_dist")
    if stated is not None and not (isinstance(stated, (int, float)) and stated >= max(worst) - CLAIM_TOLERANCE):
        failures.append(f"config.json claims forget_robust_worst_conf_dist = {stated} within {gamma:g}/255; this "
                        f"attack found {max(worst):.6g}")
    threshold, exposed = gate.get("conf_dist_at_most"), claims.get("forget_robust_exposed")
    if exposed is not None and isinstance(threshold, (int, float)):
        found = sum(not value <= threshold for value in worst)
        if not (isinstance(exposed, (int, float)) and exposed >= found):
            failures.append(f"config.json claims forget_robust_exposed = {exposed} above CD {threshold} within "
                            f"{gamma:g}/255; this attack found {found}")
    return failures


def image_lines(args, files: list[Path], clean: list[float], per_seed: "torch.Tensor") -> tuple[list[float], list[str]]:
    """Print one line per image and one per seed; returns each image's worst attacked CD over the seeds (NaN where
    any seed's is) and a failure per image above --at-most or not finite."""
    nan = per_seed.isnan().any(dim=0)
    worst = torch.where(nan, torch.full_like(per_seed[0], math.nan), per_seed.max(dim=0).values).tolist()
    by = per_seed.nan_to_num(math.inf).argmax(dim=0).tolist()
    print(f"{'image':<40}  {'clean CD':>8}  {'attacked CD':>11}  {'seed':>4}  (L-inf {args.gamma:g}/255, at most "
          f"{args.at_most:g}; APGD {args.steps} steps x {args.restarts} restarts, seeds {args.seeds})")
    failures = []
    for path, value, attacked, index in zip(files, clean, worst, by):
        name = str(path.relative_to(args.images))
        ok = attacked <= args.at_most and math.isfinite(value)  # NaN is never at most anything
        print(f"{name[-40:]:<40}  {value:8.4f}  {attacked:11.4f}  {args.seeds[index]:>4}  {'ok' if ok else 'ABOVE'}")
        if not ok:
            failures.append(f"{name}: attacked CD {attacked:.4f} (seed {args.seeds[index]}, clean {value:.4f}) is not "
                            f"<= {args.at_most:g} within {args.gamma:g}/255")
    for seed, values in zip(args.seeds, per_seed):
        print(f"seed {seed}: {int((~(values <= args.at_most)).sum())} of {len(files)} images above {args.at_most:g} "
              f"(worst {values.max().item():.4f})")
    return worst, failures


def run(args) -> int:
    """`verify attack`: one line per image (clean CD, worst attacked CD and the seed that found it); exit 0 none above
    --at-most, 1 an image above it, a non-finite value, an unprotected release or a contradicted claim, 2 unusable
    input."""
    try:
        check_arguments(args.gamma, args.at_most)
        check_attack_arguments(args.seeds, args.steps, args.restarts)
        config = read_release_config(args.release)
        subjects = load_subjects(args.release, config, args.images, args.resize)
    except INPUT_ERRORS as exc:
        return cannot_verify(exc)

    files = subjects.files
    failures = unprotected_failures(args, config, "attacks it anyway")
    per_seed = [attacked_conf_dist(subjects.model, subjects.images, args.gamma / 255.0, seed, args.steps,
                                   args.restarts, args.every_class) for seed in args.seeds]
    worst, lines = image_lines(args, files, subjects.clean, torch.stack(per_seed))
    failures += lines
    if is_forget_set(subjects.pixels, config):
        print(f"these {len(files)} images are the release's forget set (its set digest matches config.json); its "
              "attacked claims at this radius are compared with what this attack found")
        failures += claim_failures(config["protection"], args.gamma, args.at_most, worst)
    if failed(failures):
        return EXIT_FAIL
    print(f"no attack found any of the {len(files)} images above CD {args.at_most:g} within {args.gamma:g}/255 from "
          f"{len(args.seeds)} seeds (worst {max(worst):.4f}); an attack is evidence, not proof: `verify robust` "
          "proves a bound")
    return EXIT_OK


DESCRIPTION = __doc__.split("\n\n")[0]
EPILOG = ("Exit status: 0 no image found above --at-most, 1 an image above it, a non-finite value, an unprotected "
          "release or a contradicted claim, 2 unusable input.")
