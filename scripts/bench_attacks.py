"""Attack benchmark on mnist_mlp (or another experiment): the default attack evaluation's wall time and findings per model, and an
independent cross-check of the released model with a maintained attack library (torchattacks, dev extra).

Runs `+experiment=<experiment> method=<method>` through the real command line (pretraining cached under
TTP_CACHE_DIR), then reads results.json: per stage the attack evaluation's wall time, the worst-case forget
CD at every gamma, the share of zero-gradient forget images and the unbounded check. The released weights
are then attacked with torchattacks' PGD (targeted at the true label) and APGD-T (targeted DLR towards every
other class than the model's own prediction; torchattacks' APGD skips images it finds misclassified, so it
is handed the model's predictions as labels), each with exact gradients and with this project's ReLU surrogate active during the library's
backward passes; the worst case per image over all of them is reported at each gamma.
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
from omegaconf import OmegaConf

from ttp_lightning.core.errors import EXIT_NOT_PROTECTED

QUIET = ["logger=none", "trainer.enable_progress_bar=false"]


def run_job(overrides: list[str], out: Path) -> dict:
    env = dict(os.environ, WANDB_MODE="disabled")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ttp_lightning", *QUIET, *overrides, f"hydra.run.dir={out}"],
                          env=env, capture_output=True, text=True, check=False)
    if proc.returncode not in (0, EXIT_NOT_PROTECTED):  # 4: finished, not released as protected
        sys.exit(f"benchmark job failed ({' '.join(overrides)}):\n{proc.stderr[-3000:]}")
    results = json.loads((out / "results.json").read_text())
    results["command_wall_s"] = round(time.perf_counter() - start, 2)
    return results


def released_model(results: dict, out: Path):
    from ttp_lightning.data import build_datamodule
    from ttp_lightning.models.components import build_classifier
    from ttp_lightning.release import load_released

    datamodule = build_datamodule(OmegaConf.create(results["config"]["data"]))
    weights = out / results["weights_file"]
    if "certificate" not in results:  # the release folder (config.json + model.safetensors)
        return load_released(weights.parent, device="cpu"), datamodule.dataset("forget")
    from safetensors.torch import load_file

    net = build_classifier(OmegaConf.create(results["config"]["model"]), datamodule.info)
    net.load_state_dict(load_file(weights))
    return net.eval(), datamodule.dataset("forget")


def library_cross_check(net, forget, gammas: list[float], steps: int) -> dict:
    """Forget CD per gamma under torchattacks (worst per image over its attacks and surrogates)."""
    import torchattacks

    from ttp_lightning.attacks import smooth_relu_gradients

    images, labels = forget.everything()
    with torch.no_grad():
        predicted = net(images).argmax(-1)
    num_classes = net(images[:1]).shape[-1]
    report = {}
    for gamma in gammas:
        eps = gamma / 255
        worst = net(images).softmax(-1).max(-1).values.detach()
        per_attack = {}
        for beta in (None, 10.0, 1.0):
            attacks = {"pgd_targeted": torchattacks.PGD(net, eps=eps, alpha=eps / 4, steps=steps, random_start=True),
                       "apgdt_dlr": torchattacks.APGDT(net, eps=eps, steps=steps, n_classes=num_classes, n_restarts=1)}
            attacks["pgd_targeted"].set_mode_targeted_by_label(quiet=True)
            for name, attack in attacks.items():
                with smooth_relu_gradients(beta):
                    adversarial = attack(images, labels if name == "pgd_targeted" else predicted)
                with torch.no_grad():
                    confidence = net(adversarial).softmax(-1).max(-1).values
                per_attack[f"{name}/beta={beta}"] = round(float((confidence - 1 / num_classes).mean()), 6)
                worst = torch.maximum(worst, confidence)
        report[f"{gamma:g}"] = {"worst_forget_conf_dist": round(float((worst - 1 / num_classes).mean()), 6),
                                "per_attack": per_attack}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default="../shared/data", help="folder holding MNIST/raw")
    parser.add_argument("--experiment", default="mnist_mlp", help="experiment config, e.g. mnist_mlp_robust")
    parser.add_argument("--method", default="pareto", help="method config, e.g. pareto or pareto_robust")
    parser.add_argument("--library-steps", type=int, default=100)
    parser.add_argument("--out", default=None, help="JSON file (default bench/attacks_<method>.json)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run's output folder here")
    parser.add_argument("--run", type=Path, default=None, help="attack this finished run folder instead of running")
    args = parser.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    overrides = [f"+experiment={args.experiment}", f"data.root={Path(args.data_root).resolve()}",
                 f"method={args.method}"]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.run or args.keep or Path(tmp)
        if args.run:
            results = json.loads((run_dir / "results.json").read_text())
            results["command_wall_s"] = None
        else:
            results = run_job(overrides, run_dir)
        net, forget = released_model(results, run_dir)
        gammas = [float(g) for g in results["config"]["attacks"]["gammas"]]
        try:
            library = library_cross_check(net, forget, gammas, args.library_steps)
        except ImportError:
            library = "torchattacks not installed (pip install -e '.[dev]')"
    method = results["method"]
    report = {
        "machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "platform": platform.platform()},
        "method": method, "command_wall_s": results["command_wall_s"],
        "method_wall_s": results["metrics"][method].get("wall_s"),
        "metrics": {k: results["metrics"][method].get(k) for k in
                    ("retain_acc", "test_acc", "forget_conf_dist", "forget_robust_conf_dist")},
        "attack_evaluation": {stage: {"wall_s": checks["wall_s"],
                                      "worst_forget_conf_dist": {g: v["forget_conf_dist"] for g, v in
                                                                 results["attacks"][stage]["worst"].items()},
                                      **{k: checks[k] for k in ("zero_gradient_share", "monotone_in_gamma",
                                                                "unbounded")}}
                              for stage, checks in results["attack_checks"].items()},
        "torchattacks_cross_check": library,
    }
    out = Path(args.out or f"bench/attacks_{method}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
