"""Fingerprints of three runs, to show that a refactor did not move a number (issue 27).

Runs, each from an empty cache, same seed, CPU:
  default                 the embedded default job (digits + MLP + Alg 1)
  mnist_mlp               +experiment=mnist_mlp
  mnist_logreg_certified  +experiment=mnist_logreg_certified at the paper's row (theta 0.25, the mean term, C 10;
                          its noise-free weights from private/audit.json)

and writes, per run, the SHA-256 of every number results.json reports (metrics, history, per-image tables,
attacks, bounds, gate) with wall-clock times removed, and of the released weights (the certified run: of its
noise-free weights, which do not depend on the secret noise). Compare two fingerprint files with --compare.

  python scripts/same_numbers.py --out before.json [--runs default mnist_mlp ...] [--work DIR [--again]]
  python scripts/same_numbers.py --compare before.json after.json
"""

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

MNIST = Path(__file__).resolve().parents[2] / "shared" / "data"
RUNS = {
    "default": [],
    "mnist_mlp": ["+experiment=mnist_mlp", f"data.root={MNIST}"],
    # the experiment's settings before issue 39 (the paper's row), so that fingerprints stay comparable across it
    "mnist_logreg_certified": ["+experiment=mnist_logreg_certified", f"data.root={MNIST}", "pretrain.norm_bound=10",
                               "method.theta=0.25", "method.forget_reduction=mean",
                               "method.forget_reduction_temperature=null"],
}
TIMING = ("wall", "elapsed", "_s_", "seconds")
PLACES = ("_file", "_dir")  # where a run's files are (its work folder), not a number
SECTIONS = ("metrics", "history", "forget_softmax", "attacks", "attack_checks", "relearn", "proven",
            "forget_per_image", "release_gate", "noise_free", "data")


def _timeless(value):
    """The value with every wall-clock entry dropped (they differ from run to run)."""
    if isinstance(value, dict):
        return {key: _timeless(item) for key, item in value.items()
                if not (key.endswith(("_s", *PLACES)) or any(mark in key for mark in TIMING))}
    if isinstance(value, list):
        return [_timeless(item) for item in value]
    return value


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _weights_digest(path: Path) -> str:
    from safetensors.torch import load_file
    tensors = load_file(path)
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].contiguous().numpy().tobytes())
    return digest.hexdigest()


NOISED = ("metrics", "forget_softmax", "attacks", "relearn", "proven", "forget_per_image")  # a certified
# release's: they measure the released weights, which carry fresh secret noise every run


def fingerprint(run_dir: Path) -> dict:
    """The digests of a run folder's results, read in the current words (results.json /1 said certified where /2
    says proven: values are compared, not the names they are filed under)."""
    from ttp_lightning.reporting.tables import load_results

    results = {k: v for k, v in load_results([run_dir / "results.json"])[0].items() if k != "format"}
    noise_free = run_dir / "private" / "noise_free.safetensors"
    certified = noise_free.exists()
    record = {section: _digest(_timeless(results[section])) for section in SECTIONS
              if section in results and not (certified and section in NOISED)}
    if certified:  # the deterministic part: A(D), the noise-free weights and scores, the certificate's constants
        record["pretrain_metrics"] = _digest(_timeless(results["metrics"]["pretrain"]))
        record["noise_free_weights"] = _weights_digest(noise_free)
        record["certificate"] = _digest(_timeless({key: value for key, value in results["certificate"].items()
                                                   if key not in ("metrics", "weights", "format")}))
        results["metrics"] = {"pretrain": results["metrics"]["pretrain"], "noise_free": results["noise_free"]}
    else:
        folder = "release" if results["release_gate"]["passed"] else "release_not_protected"
        record["release_weights"] = _weights_digest(run_dir / folder / "model.safetensors")
    for stage, metrics in results["metrics"].items():
        record[f"{stage}.test_acc"] = metrics.get("test_acc")
        record[f"{stage}.forget_conf_dist"] = metrics.get("forget_conf_dist")
    return record


def run(name: str, work: Path) -> dict:
    run_dir, cache = work / name, work / f"{name}_cache"
    command = [sys.executable, "-m", "ttp_lightning", *RUNS[name], f"hydra.run.dir={run_dir}",
               f"paths.cache_dir={cache}", "logger=csv"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 4):
        raise SystemExit(f"error: {name} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return fingerprint(run_dir)


def compare(before: dict, after: dict) -> int:
    differing = 0
    for name, record in before.items():
        for key, value in record.items():
            same = after.get(name, {}).get(key) == value
            differing += not same
            print(f"{name:24s} {key:28s} {'identical' if same else 'DIFFERS'}")
    return 1 if differing else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--runs", nargs="*", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--compare", nargs=2, type=Path)
    parser.add_argument("--work", type=Path, help="keep the runs' folders here (default: a temporary folder)")
    parser.add_argument("--again", action="store_true", help="fingerprint the runs already in --work, run nothing")
    args = parser.parse_args()
    if args.compare:
        before, after = (json.loads(path.read_text()) for path in args.compare)
        raise SystemExit(compare(before, after))
    with tempfile.TemporaryDirectory() as temporary:
        work, record = args.work or Path(temporary), {}
        for name in args.runs:  # written after each run, so a failure keeps what was measured
            record[name] = fingerprint(work / name) if args.again else run(name, work)
            if args.out:
                args.out.write_text(json.dumps(record, indent=1))
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
