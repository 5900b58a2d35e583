"""Benchmarks of the real command line; writes one JSON (numbers for the docs and closing notes).

Measures: the default job's wall time (whole command, fresh cache); on mnist_mlp, Alg 1's wall time to
its best epoch and in total, the retrain baseline's wall time, and Alg 1 training steps per second, for
the experiment's minibatch mode (one step = 128 retain + 10 forget images) and for the authors' fullbatch
mode (one step = the whole forget and retain gradient, gradient surgery, forget temperature 2).
Monitoring: mnist_mlp Alg 1 steps/s with the default logger (wandb, offline) and progress bar against
none, over epochs 2..N (the first epoch holds the logger's start-up, reported apart). Side by side: the
default job's command time alone and with a second default job started at the same moment.
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

from ttp_lightning.core.errors import EXIT_NOT_PROTECTED

QUIET = ["logger=none", "trainer.enable_progress_bar=false"]


def start_job(overrides: list[str], cache_dir: str, out: str, quiet: bool = True) -> tuple:
    env = dict(os.environ, TTP_CACHE_DIR=cache_dir, WANDB_MODE="offline" if not quiet else "disabled")
    command = [sys.executable, "-m", "ttp_lightning", *(QUIET if quiet else []), *overrides, f"hydra.run.dir={out}"]
    return subprocess.Popen(command, env=env, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), \
        time.perf_counter()


def finish_job(job: tuple, out: str, overrides: list[str]) -> dict:
    proc, start = job
    _, stderr = proc.communicate()
    wall = time.perf_counter() - start
    if proc.returncode not in (0, EXIT_NOT_PROTECTED):  # 4: finished, not released as protected
        sys.exit(f"benchmark job failed ({' '.join(overrides)}):\n{stderr[-3000:]}")
    results = json.loads((Path(out) / "results.json").read_text())
    results["command_wall_s"] = round(wall, 2)
    return results


def run_job(overrides: list[str], cache_dir: str, quiet: bool = True) -> dict:
    """Run one job in a fresh output dir; return its results.json plus the command's wall time."""
    with tempfile.TemporaryDirectory() as out:
        return finish_job(start_job(overrides, cache_dir, out, quiet), out, overrides)


def steady_steps_per_s(results: dict) -> float:
    """Alg 1 steps per second over epochs 2..N of the fit (validation included, start-up excluded)."""
    rows, metrics = results["history"]["pareto"], results["metrics"]["pareto"]
    per_epoch = metrics["train_steps"] / len(rows)
    return round(per_epoch * (len(rows) - 1) / (rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]), 1)


def monitoring(mnist: list[str], cache: str) -> dict:
    """Default logger + progress bar against none, on the same cached A(D)."""
    fixed = [*mnist, "method.epochs=10", "method.early_stopping.enabled=false", "attacks.enabled=false"]
    runs = {"none": [], "wandb_and_progress_bar": []}
    for _ in range(2):  # alternated and repeated: this machine's speed drifts by about 15 % between runs
        runs["none"].append(run_job(fixed, cache))
        runs["wandb_and_progress_bar"].append(run_job(fixed, cache, quiet=False))
    report = {name: {"steps_per_s": max(steady_steps_per_s(r) for r in results),
                     "fit_wall_s": min(r["metrics"]["pareto"]["wall_s"] for r in results)}
              for name, results in runs.items()}
    report["slowdown"] = round(report["none"]["steps_per_s"] / report["wandb_and_progress_bar"]["steps_per_s"], 3)
    return report


def side_by_side(cache: str) -> dict:
    """The default job alone, then two default jobs started together (same cached A(D))."""
    with tempfile.TemporaryDirectory() as first, tempfile.TemporaryDirectory() as second:
        alone = finish_job(start_job([], cache, first), first, [])["command_wall_s"]
        jobs = [(start_job([], cache, out), out) for out in (first, second)]
        together = [finish_job(job, out, [])["command_wall_s"] for job, out in jobs]
    return {"alone_s": alone, "together_s": together, "ratio": round(max(together) / alone, 2),
            "threads": "auto"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default="../shared/data", help="folder holding MNIST/raw")
    parser.add_argument("--out", default="bench/bench.json")
    args = parser.parse_args()
    mnist = ["+experiment=mnist_mlp", f"data.root={Path(args.data_root).resolve()}"]

    with tempfile.TemporaryDirectory() as cache:
        default = run_job([], cache)
        parallel = side_by_side(cache)
        logging_cost = monitoring(mnist, cache)
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
            "monitoring": logging_cost,
        },
        "two_default_jobs_side_by_side": parallel,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps({"default_job_wall_s": report["default_job"]["command_wall_s"],
                      "alg1_wall_to_best_s": report["mnist_mlp"]["alg1_wall_to_best_s"],
                      "retrain_wall_s": report["mnist_mlp"]["retrain_wall_s"],
                      "alg1_steps_per_s": report["mnist_mlp"]["alg1_steps_per_s"],
                      "alg1_fullbatch_steps_per_s": report["mnist_mlp"]["alg1_fullbatch_steps_per_s"],
                      "monitoring": logging_cost, "two_default_jobs_side_by_side": parallel}, indent=2))
    print(f"written: {out}")


if __name__ == "__main__":
    main()
