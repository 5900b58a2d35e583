"""The provable-CNN recipe (issue 80) on CIFAR-10 for a GPU: `+experiment=cifar10_resnet8_provable trainer=gpu`,
timed stage by stage, with what it proves, in one JSON.

  python scripts/gpu_provable.py --out gpu_provable.json [--root DIR] [--tiny]

--root: a folder with CIFAR-10's python files (cifar-10-batches-py/); without one (a machine with no download,
as the lent GPU machines), CIFAR-shaped synthetic files are written (data/cifar.py: class templates plus noise;
timing only, the accuracies are not CIFAR-10's). --tiny (automatic without CUDA): a few hundred images, 2
pretraining and 2 Alg 1 epochs on the CPU, so the test suite runs the same code.

The JSON: the command, the device, the exit status, pretraining's and Alg 1's wall seconds and images/s, A(D)'s
and the release's test accuracy, the forget images proven CD <= 0.1 at 2/255 and their proven radii, the attack
table at 2/255 and 8/255 (results.json's), and the whole run's wall time. Numbers are only what the run wrote.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ttp_lightning.data.cifar import write_synthetic

REPO = Path(__file__).resolve().parents[1]


def command(root: Path, run_dir: Path, tiny: bool) -> list[str]:
    args = [sys.executable, "-m", "ttp_lightning", "+experiment=cifar10_resnet8_provable", f"data.root={root}",
            f"hydra.run.dir={run_dir}", "logger=none", "attacks.relearn.enabled=false",
            f"paths.cache_dir={run_dir / 'cache'}"]
    if tiny:
        return args + ["trainer=cpu", "data.max_train_size=600", "data.forget.size=10", "pretrain.epochs=2",
                       "method.epochs=2", "model.width=4", "attacks.apgd_steps=2", "attacks.restarts=1"]
    return args + ["trainer=gpu"]


KEYS = ("test_acc", "wall_s", "train_images_per_s", "forget_robust_exposed", "forget_proven_share_10",
        "forget_proven_radius_min", "forget_proven_radius_median")


def summary(results: dict) -> dict:
    """What the run measured, read from its results.json (nothing computed here): per stage (A(D), the
    release) its test accuracy, wall seconds, training images/s, images above 0.1 under the judged radius's
    attack, the share proven CD <= 0.1 at that radius and the proven radii; the attack table; the release."""
    metrics = results.get("metrics", {})
    return {"stages": {stage: {key: metrics.get(stage, {}).get(key) for key in KEYS}
                       for stage in ("pretrain", "pareto_robust")},
            "attacks": results.get("attacks", {}).get("pareto_robust"), "release": results.get("release")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--root", type=Path, default=None)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    tiny = args.tiny or not torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        root = args.root or write_synthetic("cifar10", scratch / "data", *((600, 200) if tiny else (50_000, 10_000)))
        run_dir = scratch / "run"
        cmd = command(root, run_dir, tiny)
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False,
                              env={**os.environ, "WANDB_MODE": "disabled"})
        wall = time.perf_counter() - start
        results_file = run_dir / "results.json"
        results = json.loads(results_file.read_text()) if results_file.exists() else {}
    report = {"command": " ".join(cmd[1:]), "device": torch.cuda.get_device_name(0) if torch.cuda.is_available()
              else "cpu", "tiny": tiny, "synthetic": args.root is None, "exit": proc.returncode,
              "wall_s": round(wall, 1), **summary(results), "stderr_tail": proc.stderr[-2000:]}
    args.out.write_text(json.dumps(report, indent=2, default=str))
    print(f"exit {proc.returncode} in {wall:.0f} s; {args.out}")
    return 0 if proc.returncode in (0, 4) else 1


if __name__ == "__main__":
    sys.exit(main())
