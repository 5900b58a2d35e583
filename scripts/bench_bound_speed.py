"""Seconds per image of every bound `bounds.kind=auto` chooses from, on released networks (issue 62, item 3:
`python scripts/bench_bound_speed.py RUN_DIR [RUN_DIR ...]`).

For each run folder (a finished `python -m ttp_lightning` job with release/ or release_not_protected/) it loads
the released weights as a user would (ttp_lightning.load_released), rebuilds the images from the run's own data
settings, and for each candidate of bounds.choice.CANDIDATES (intervals, CROWN-IBP, full CROWN, alpha-CROWN)
bounds the confidence distance of up to --images images of the forget set (or of the test split, --split test)
within --radius (default 2/255), --batch images a call (full CROWN and alpha-CROWN: one), until every image is
done or --budget seconds are spent on that bound (a linear bound is stopped between its backward passes:
bounds.linear.deadline). Each bound runs in a process of its own, so that its peak resident memory is its own
(it includes the process's own: torch and the data set, about 0.9 GiB for MNIST).

Per bound it reports the images bounded, seconds per image, how many are proven at CD <= --at-most, the worst
proven CD and the peak resident memory (MiB), as a Markdown table on stdout and JSON in --out (default
bench/bound_speed.json). `--bounds "full CROWN, dense"` adds full CROWN without receptive-field windows
(bounds.windows), the same numbers by its dense coefficients, to compare their cost. A bound stopped by the
budget says so and how many images it finished: its seconds per image are those of the images it finished (none
finished: more than the budget per image). `--search` times the radius search instead (Prover.radius over
the grid 0, 1/4, ..., 16 per 255 at CD <= --at-most: what a run's proven radii cost) and reports each bound's
smallest and median proven radius. Run it alone on the machine; `--threads` sets torch's threads (default 2).
"""

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench_bounds import load_run, release_folder  # this folder's: the release and the data of a finished run
from ttp_lightning.bounds import linear
from ttp_lightning.bounds.choice import CANDIDATES
from ttp_lightning.bounds.linear import OverBudget, deadline
from ttp_lightning.bounds.propagate import UnsupportedLayer
from ttp_lightning.bounds.uniformity import MAX_RADIUS, RADIUS_STEP, Prover

CANDIDATE_NAMES = ("intervals", "CROWN-IBP", "full CROWN", "alpha-CROWN")
DENSE = "full CROWN, dense"  # not a candidate: full CROWN without receptive-field windows (bounds.linear.TILE = 0)


def measure(run: Path, candidate: int, images: int, radius: float, batch: int, budget: float, at_most: float,
            slope_steps: int, split: str = "forget", search: bool = False) -> dict:
    """One bound (CANDIDATES[candidate]) on one run's first `images` images of `split` (in this process): its
    proven CD at `radius`, or (`search`) its proven radius at `at_most`."""
    net, data = load_run(run)
    forget, _ = data.dataset(split).everything()
    forget = forget[:images]
    dense = candidate == len(CANDIDATES)
    bound, intermediate, optimised = CANDIDATES[CANDIDATE_NAMES.index("full CROWN") if dense else candidate]
    if dense:
        linear.TILE = 0
    if intermediate == "crown":  # seconds per image on a CNN: one image a call, so a stop loses one image's work
        batch = 1
    prover = Prover(net, bound, intermediate=intermediate or "ibp", slope_steps=slope_steps if optimised else 0)
    prover.conf_dist(forget[:1], 0.0)  # untimed: one-time costs (tracing, first transposes)
    values, note, start = [], None, time.perf_counter()
    finished = 0.0  # seconds until the last call that finished: an unfinished call's time is not an image's
    try:
        with deadline(budget):
            for first in range(0, len(forget), batch):
                if time.perf_counter() - start > budget:  # intervals and CROWN-IBP do not check the deadline
                    raise OverBudget("past the budget")
                chosen = forget[first:first + batch]
                values.append(prover.radius(chosen, at_most, RADIUS_STEP, MAX_RADIUS) if search
                              else prover.conf_dist(chosen, radius))
                finished = time.perf_counter() - start
    except OverBudget:
        note = f"stopped at the budget of {budget:g} s"
    except UnsupportedLayer as exc:
        note = f"no rule: {exc}"
    seconds = time.perf_counter() - start
    done = torch.cat(values) if values else torch.zeros(0, dtype=torch.float64)
    if prover.fallback:
        note = f"fell back to intervals: {prover.fallback}"
    return {"bound": DENSE if dense else CANDIDATE_NAMES[candidate], "split": split, "images": len(forget),
            "bounded": len(done),
            "seconds": round(seconds, 2), "s_per_image": round(finished / len(done), 4) if len(done) else None,
            "search": search,
            "proven": int((done > 0).sum() if search else (done <= at_most).sum()),
            "worst": (float(done.min()) if search else float(done.max())) if len(done) else None,
            "median_radius": float(done.median()) if search and len(done) else None,
            "slope_steps": prover.slopes_used, "peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "note": note}


def row(run: Path, result: dict) -> str:
    def shown(value, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    # a search's smallest and median proven radius, else the worst proven CD
    found = [shown(result["worst"], "g"), shown(result["median_radius"], "g")] if result.get("search") else \
        [shown(result["worst"], ".3f")]
    cells = [run.name, result["bound"], f"{result['bounded']} / {result['images']}",
             shown(result["s_per_image"], ".3f"), str(result["proven"]), *found, str(result["peak_mib"]),
             result["note"] or ""]
    return f"| {' | '.join(cells)} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished run folders")
    parser.add_argument("--images", type=int, default=100, help="images per run (default 100)")
    parser.add_argument("--split", choices=("forget", "test"), default="forget",
                        help="whose images: the forget set (default) or the test split (a forget set of 5)")
    parser.add_argument("--radius", type=float, default=2.0, help="L-inf radius in 1/255 (default 2)")
    parser.add_argument("--batch", type=int, default=10, help="images per bound call (default 10)")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds per bound and run (default 300)")
    parser.add_argument("--at-most", type=float, default=0.1, help="the proof's CD threshold (default 0.1)")
    parser.add_argument("--search", action="store_true",
                        help="time the radius search at --at-most (the grid 0, 1/4, ..., 16 per 255) instead")
    parser.add_argument("--slope-steps", type=int, default=20, help="alpha-CROWN's Adam steps (default 20)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--bounds", nargs="+", choices=CANDIDATE_NAMES + (DENSE,), default=list(CANDIDATE_NAMES),
                        help=f"the bounds to time (default: the four candidates; '{DENSE}': full CROWN without "
                             "receptive-field windows, to compare)")
    parser.add_argument("--out", type=Path, default=Path("bench/bound_speed.json"))
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: one bound, in this process
    args = parser.parse_args(argv)
    for run in args.runs:
        try:
            release_folder(run)
        except SystemExit as exc:  # its one `error:` line, with this script's exit code for bad input
            print(exc, file=sys.stderr)
            return 2
    if args.one is not None:
        torch.set_num_threads(args.threads)
        result = measure(args.runs[0], args.one, args.images, args.radius, args.batch, args.budget, args.at_most,
                         args.slope_steps, args.split, args.search)
        print(json.dumps(result))
        return 0
    report = {"machine": platform.platform(), "threads": args.threads, "split": args.split, "radius": args.radius,
              "at_most": args.at_most, "budget_s": args.budget, "search": args.search, "runs": {}}
    lines = [(f"| run | bound | images bounded | s / image | proven <= {args.at_most:g} at {args.radius:g}/255 | "
              "worst proven CD | peak MiB | note |"), "|---|---|---:|---:|---:|---:|---:|---|"]
    if args.search:
        lines = [(f"| run | bound | images bounded | s / image (radius search) | radius > 0 at CD <= "
                  f"{args.at_most:g} | smallest radius | median radius | peak MiB | note |"),
                 "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for run in args.runs:
        report["runs"][str(run)] = []
        for candidate in ((CANDIDATE_NAMES + (DENSE,)).index(name) for name in args.bounds):
            child = [sys.executable, __file__, str(run), "--one", str(candidate)] + [
                f"--{key.replace('_', '-')}={getattr(args, key)}"
                for key in ("images", "split", "radius", "batch", "budget", "at_most", "slope_steps", "threads")] + (
                ["--search"] if args.search else [])
            done = subprocess.run(child, capture_output=True, text=True, check=False)
            if done.returncode:
                print(done.stderr, file=sys.stderr)
                return done.returncode
            result = json.loads(done.stdout.strip().splitlines()[-1])
            report["runs"][str(run)].append(result)
            lines.append(row(run, result))
            print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
