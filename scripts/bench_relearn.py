"""The relearning attack at full strength on released models (`python scripts/bench_relearn.py RUN_DIR [RUN_DIR ...]`;
issue 38).

For each run folder (a finished `python -m ttp_lightning` job: results.json and release/ or
release_not_protected/) it loads the released weights (ttp_lightning.load_released, as a user would), rebuilds the
run's data from its own settings (results.json's `config.data`) and finetunes copies of the released model with
Adam from every source (the test split, a random sample of the retain data) at every learning rate, as the
pipeline's `attacks.relearn` does with its defaults (attacks/relearn.py; --steps, --lrs, --retain-size change
them). Printed per run and number of steps: the worst case over the runs (highest forget CD, worst image's CD,
forget accuracy, and the run that reached the highest forget CD); every run goes to --out (JSON, default
bench/relearn.json). Run it alone on the machine (`OMP_NUM_THREADS` is the torch thread count).
"""

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from bench_bounds import load_run  # this folder's: the release and the data of a finished run
from ttp_lightning.attacks.relearn import relearn_worst
from ttp_lightning.config.schema import RelearnSchema
from ttp_lightning.run.assessment import relearn_sources


def main(argv: list[str] | None = None) -> int:
    defaults = RelearnSchema()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished run folders")
    parser.add_argument("--steps", type=int, nargs="+", default=defaults.steps)
    parser.add_argument("--lrs", type=float, nargs="+", default=defaults.lrs)
    parser.add_argument("--data", nargs="+", default=defaults.data, help="test and/or retain")
    parser.add_argument("--retain-size", type=int, default=defaults.retain_size)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/relearn.json"))
    args = parser.parse_args(argv)
    settings = RelearnSchema(True, args.steps, args.lrs, args.data, args.retain_size, args.batch_size)
    report = {"machine": platform.platform(), "torch_threads": torch.get_num_threads(),
              "settings": vars(settings), "runs": {}}
    lines = ["| run | steps | forget CD (worst case) | worst image | forget acc | reached by |", "|---|---:|---:|---:|---:|---|"]
    for run in args.runs:
        net, datamodule = load_run(run)
        start = time.perf_counter()
        worst, runs = relearn_worst(net, relearn_sources(datamodule, settings, args.seed), datamodule.dataset("forget"),
                                    settings.steps, settings.lrs, settings.batch_size, args.seed, "cpu")
        report["runs"][str(run)] = {"worst": worst, "runs": runs, "seconds": round(time.perf_counter() - start, 1)}
        for steps, scores in worst.items():
            lines.append(f"| {run.name} | {steps} | {scores['forget_conf_dist']:.4f} | "
                         f"{scores['forget_worst_conf_dist']:.4f} | {scores['forget_acc']:.2%} | {scores['run']} |")
            print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
