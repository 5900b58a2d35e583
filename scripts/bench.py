"""Benchmarks of the real command line; writes one JSON (numbers for the README and closing notes).

Measures: the default job's wall time (whole command, fresh cache); on mnist_mlp, Alg 1's wall time to
its best epoch and in total, the retrain baseline's wall time, and Alg 1 training steps per second, for
the experiment's minibatch mode (one step = 128 retain + 10 forget images) and for the authors' fullbatch
mode (one step = the whole forget and retain gradient, gradient surgery, forget temperature 2).
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

QUIET = ["logger=none", "trainer.enable_progress_bar=false"]


def run_job(overrides: list[str], cache_dir: str) -> dict:
    """Run one job in a fresh output dir; return its results.json plus the command's wall time."""
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, TTP_CACHE_DIR=cache_dir, WANDB_MODE="disabled")
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "ttp_lightning", *QUIET, *overrides, f"hydra.run.dir={out}"],
                              env=env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(f"benchmark job failed ({' '.join(overrides)}):\n{proc.stderr[-3000:]}")
        results = json.loads((Path(out) / "results.json").read_text())
    results["command_wall_s"] = round(wall, 2)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default="../shared/data", help="folder holding MNIST/raw")
    parser.add_argument("--out", default="bench/bench.json")
    args = parser.parse_args()
    mnist = ["+experiment=mnist_mlp", f"data.root={Path(args.data_root).resolve()}"]

    with tempfile.TemporaryDirectory() as cache:
        default = run_job([], cache)
        alg1 = run_job(mnist, cache)
        retrain = run_job(mnist + ["method=retrain"], cache)
        fullbatch = run_job(mnist + ["method.mode=fullbatch", "method.gradient_surgery=true",
                                     "method.forget_temperature=2", "method.early_stopping.enabled=false"], cache)

    pareto = alg1["metrics"]["pareto"]
    report = {
        "machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "platform": platform.platform(), "cuda": torch.cuda.is_available()},
        "default_job": {"command_wall_s": default["command_wall_s"], **default["metrics"]["pareto"],
                        "pretrain_forget_conf_dist": default["metrics"]["pretrain"]["forget_conf_dist"],
                        "pretrain_test_acc": default["metrics"]["pretrain"]["test_acc"]},
        "mnist_mlp": {
            "pretrain": alg1["metrics"]["pretrain"],
            "alg1": pareto,
            "alg1_wall_to_best_s": pareto["wall_to_best_s"],
            "alg1_steps_per_s": pareto["train_steps_per_s"],
            "alg1_fullbatch": fullbatch["metrics"]["pareto"],
            "alg1_fullbatch_steps_per_s": fullbatch["metrics"]["pareto"]["train_steps_per_s"],
            "retrain": retrain["metrics"]["retrain"],
            "retrain_wall_s": retrain["metrics"]["retrain"]["wall_s"],
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps({"default_job_wall_s": report["default_job"]["command_wall_s"],
                      "alg1_wall_to_best_s": report["mnist_mlp"]["alg1_wall_to_best_s"],
                      "retrain_wall_s": report["mnist_mlp"]["retrain_wall_s"],
                      "alg1_steps_per_s": report["mnist_mlp"]["alg1_steps_per_s"],
                      "alg1_fullbatch_steps_per_s": report["mnist_mlp"]["alg1_fullbatch_steps_per_s"]}, indent=2))
    print(f"written: {out}")


if __name__ == "__main__":
    main()
