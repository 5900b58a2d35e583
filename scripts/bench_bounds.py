"""Proven uniformity of released models, interval bounds and linear bounds (CROWN) side by side, with their
cost (`python scripts/bench_bounds.py RUN_DIR [RUN_DIR ...]`; issue 37).

For each run folder (a finished `python -m ttp_lightning` job: results.json and release/ or
release_not_protected/) it loads the released weights (ttp_lightning.load_released, as a user would), rebuilds the
forget images from the run's own data settings (results.json's `config.data`), and for each bound:

  - the share of forget images proven at CD <= 0.05 and <= --at-most (default 0.1) within 1 / 2 / 4 / 8 per 255;
  - each image's proven radius at --at-most (0, 1/4, ..., 16 per 255): minimum, median, maximum;
  - the wall time of the shares and of the radius search, and the time per image.

Rows go to stdout as a Markdown table and to --out (JSON, default bench/bounds.json). Run it alone on the machine
(`OMP_NUM_THREADS` is the torch thread count).
"""

import argparse
import json
import platform
import statistics
import time
import warnings
from pathlib import Path

import torch

from ttp_lightning.bounds.rounding import PRECISIONS
from ttp_lightning.bounds.uniformity import MAX_RADIUS, RADIUS_STEP, Prover
from ttp_lightning.data.datamodule import build_datamodule
from ttp_lightning.release import NotProtectedWarning, load_released

GAMMAS = (1.0, 2.0, 4.0, 8.0)


def release_folder(run: Path) -> Path:
    for name in ("release", "release_not_protected"):
        if (run / name / "config.json").is_file():
            return run / name
    raise SystemExit(f"error: {run} holds no release folder (release/ or release_not_protected/)")


def load_run(run: Path):
    """(the released network, loaded as a user would, protected or not; the run's data module, rebuilt from its
    own data settings in results.json)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotProtectedWarning)
        net = load_released(release_folder(run))
    return net, build_datamodule(json.loads((run / "results.json").read_text())["config"]["data"])


def measure(net, images: torch.Tensor, bound: str, intermediate: str, at_most: float,
            precision: str = "float32") -> dict:
    prover = Prover(net, bound, intermediate=intermediate, precision=precision)
    start, by_gamma = time.perf_counter(), {}
    for gamma in GAMMAS:
        by_gamma[gamma] = prover.conf_dist(images, gamma)
    shares_s = time.perf_counter() - start
    start = time.perf_counter()
    radius = prover.radius(images, at_most, RADIUS_STEP, MAX_RADIUS, known=by_gamma).tolist()
    radius_s = time.perf_counter() - start
    return {
        "bound": prover.bound, "intermediate": prover.intermediate if prover.bound == "linear" else None,
        "precision": precision,
        "fallback": prover.fallback,
        "share_05": {f"{g:g}": float((v <= 0.05).double().mean()) for g, v in by_gamma.items()},
        "share_at_most": {f"{g:g}": float((v <= at_most).double().mean()) for g, v in by_gamma.items()},
        "worst": {f"{g:g}": float(v.max()) for g, v in by_gamma.items()},
        "radius": {"min": min(radius), "median": statistics.median(radius), "max": max(radius)},
        "shares_s": round(shares_s, 2), "radius_s": round(radius_s, 2),
        "s_per_image": round((shares_s + radius_s) / len(images), 3),
    }


def row(name: str, images: int, result: dict) -> str:
    bound = result["bound"] + (f" ({result['intermediate']})" if result["intermediate"] else "") + \
        f", {result['precision']}"
    shares = " / ".join(f"{100 * result['share_05'][f'{g:g}']:.0f}" for g in GAMMAS)
    shares_at = " / ".join(f"{100 * result['share_at_most'][f'{g:g}']:.0f}" for g in GAMMAS)
    radius = result["radius"]
    return (f"| {name} | {images} | {bound} | {shares} | {shares_at} | {radius['min']:g} / {radius['median']:g} | "
            f"{result['shares_s']:.1f} + {result['radius_s']:.1f} | {result['s_per_image']:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished run folders")
    parser.add_argument("--at-most", type=float, default=0.1, help="the radius's CD threshold (default 0.1)")
    parser.add_argument("--intermediate", default="auto", help="CROWN's pre-activation bounds (auto, crown, ibp)")
    parser.add_argument("--precision", nargs="+", default=["float32"], choices=PRECISIONS,
                        help="the precision each bound is sound for (default float32, what load_released runs; "
                             "float64 is, in effect, the exact function of the weights: the rounding term's price)")
    parser.add_argument("--out", type=Path, default=Path("bench/bounds.json"))
    args = parser.parse_args(argv)
    report = {"machine": platform.platform(), "torch_threads": torch.get_num_threads(), "at_most": args.at_most,
              "runs": {}}
    lines = [("| run | images | bound | proven <= 0.05 at 1/2/4/8 per 255 (%) | "
              f"<= {args.at_most:g} (%) | radius min / median (1/255) | seconds (shares + radius) | s / image |"),
             "|---|---:|---|---|---|---|---:|---:|"]
    for run in args.runs:
        net, datamodule = load_run(run)
        images, _ = datamodule.dataset("forget").everything()
        report["runs"][str(run)] = {}
        for bound in ("interval", "linear"):
            for precision in args.precision:
                result = measure(net, images, bound, args.intermediate, args.at_most, precision)
                report["runs"][str(run)][f"{bound}_{precision}"] = result
                lines.append(row(run.name, len(images), result))
                print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
