"""`python -m ttp_lightning.plots PATH... --out DIR`: PNG figures from results.json files (needs matplotlib,
the `plots` extra).

  frontier.png   retain / test accuracy and forget confidence distance against theta, per method
                 (a theta sweep: one method at two or more thetas)
  forget_size.png  the same against the forget set size (a forget-set-size sweep)
  dynamics.png   the method's per-epoch retain / test accuracy and forget confidence distance
  softmax.png    softmax bars of five forget instances, pretrained vs the method's model
  attacks.png    forget confidence distance (clean, then the worst attack) against the attack radius gamma,
                 for every method in the results and the pretrained model
dynamics and softmax are drawn for the first results file given (or found). `--wandb` also logs them to an
offline wandb run under the output folder.
"""

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from ttp_lightning.reporting.tables import METHOD_LABELS, config_value, forget_set, load_results, model_name
from ttp_lightning.reporting.wandb_charts import log_summary, sweep_group


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def sweep_curves(all_results: list[dict], path: Path, x_of, x_label: str, log_x: bool = False) -> bool:
    """Retain / test accuracy and forget confidence distance against `x_of(results)`, one line per method
    that was run at two or more distinct x values (results with x None are skipped)."""
    by_method = defaultdict(list)
    for results in all_results:
        x = x_of(results)
        if x is not None:
            by_method[results["method"]].append((x, results["metrics"][results["method"]]))
    sweeps = {m: sorted(points, key=lambda p: p[0]) for m, points in by_method.items()
              if len({x for x, _ in points}) > 1}
    if not sweeps:
        return False
    plt = _pyplot()
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for method, points in sweeps.items():
        xs = [x for x, _ in points]
        for axis, key in zip(axes, ("retain_acc", "test_acc", "forget_conf_dist")):
            axis.plot(xs, [m[key] for _, m in points], marker="o", label=METHOD_LABELS.get(method, method))
    for axis, title in zip(axes, ("retain accuracy", "test accuracy", "forget confidence distance")):
        axis.set(xlabel=x_label, title=title, xscale="log" if log_x else "linear")
        axis.grid(alpha=0.3)
    axes[0].legend()
    _save(plt, figure, path)
    return True


def frontier(all_results: list[dict], path: Path) -> bool:
    """The Pareto frontier: metrics against theta."""
    return sweep_curves(all_results, path, lambda r: config_value(r, "method.theta"), "theta")


def forget_size_curves(all_results: list[dict], path: Path) -> bool:
    """The forget-set-size ablation: metrics against |D_f| (log scale), forget sets from the training data."""
    def size(results):
        size, from_test = forget_set(results)
        return None if from_test else size

    return sweep_curves(all_results, path, size, "forget set size", log_x=True)


def dynamics(results: dict, path: Path) -> bool:
    history = results["history"].get(results["method"], [])
    rows = [row for row in history if "epoch" in row]
    if not rows:
        return False
    plt = _pyplot()
    figure, (accuracy, distance) = plt.subplots(1, 2, figsize=(10, 3.8))
    epochs = [row["epoch"] for row in rows]
    for key in ("retain_acc", "test_acc", "forget_acc"):
        if key in rows[0]:
            accuracy.plot(epochs, [row[key] for row in rows], label=key.replace("_", " "))
    for key in ("forget_conf_dist", "forget_robust_conf_dist", "test_conf_dist"):
        if key in rows[0]:
            distance.plot(epochs, [row[key] for row in rows], label=key.replace("_", " "))
    for axis, title in ((accuracy, "accuracy"), (distance, "confidence distance")):
        axis.set(xlabel="epoch", title=f"{METHOD_LABELS.get(results['method'], results['method'])}: {title}")
        axis.legend()
        axis.grid(alpha=0.3)
    _save(plt, figure, path)
    return True


def softmax_bars(results: dict, path: Path) -> bool:
    outputs = results.get("forget_softmax")
    if not outputs:
        return False
    plt = _pyplot()
    stages = list(outputs)
    count = len(outputs[stages[0]])
    figure, axes = plt.subplots(len(stages), count, figsize=(2.6 * count, 2.3 * len(stages)), squeeze=False)
    for row, stage in enumerate(stages):
        for column, instance in enumerate(outputs[stage]):
            axis = axes[row][column]
            probs = instance["softmax"]
            colours = ["tab:red" if c == instance["label"] else "tab:blue" for c in range(len(probs))]
            axis.bar(range(len(probs)), probs, color=colours)
            axis.axhline(1 / len(probs), color="grey", linestyle="--", linewidth=0.8)
            axis.set_ylim(0, 1)
            axis.set_title(f"{stage}: forget #{column} (label {instance['label']})", fontsize=8)
    _save(plt, figure, path)
    return True


def _worst_case(by_attack: dict) -> dict[float, float]:
    """Forget CD per gamma of the worst attack ("worst" per image; older results: the worst mean)."""
    if "worst" in by_attack:
        return {float(g): v["forget_conf_dist"] for g, v in by_attack["worst"].items()}
    curves = [{float(g): v["forget_conf_dist"] for g, v in per_gamma.items()}
              for name, per_gamma in by_attack.items() if name != "none"]
    return {g: max(curve[g] for curve in curves if g in curve) for g in curves[0]} if curves else {}


def attack_curves(all_results: list[dict], path: Path) -> bool:
    """Forget CD against the attack radius for every method in the results (and the pretrained model):
    gamma 0 is the clean forget CD, each larger gamma the worst attack's."""
    curves, settings = {}, set()
    for results in all_results:
        if results.get("attacks"):
            settings.add(f"{results['config']['data']['name']}, {model_name(results)}")
        for stage, by_attack in results.get("attacks", {}).items():
            label = "pretrained" if stage == "pretrain" else METHOD_LABELS.get(stage, stage)
            if stage == "pretrain_original" or label in curves:
                continue
            points = {0.0: by_attack["none"]["0"]["forget_conf_dist"], **_worst_case(by_attack)}
            curves[label] = sorted(points.items())
    if not curves:
        return False
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(6.4, 4.2))
    for label, points in curves.items():
        axis.plot([g for g, _ in points], [cd for _, cd in points], marker="o", label=label,
                  linestyle="--" if label == "pretrained" else "-")
    axis.set(xlabel="attack radius gamma (L-inf, x 1/255; 0 = clean)",
             ylabel="forget confidence distance (worst attack)", ylim=(0, 1),
             title=f"{' / '.join(sorted(settings))}: forget CD under attack (0 = uniform softmax)")
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    _save(plt, figure, path)
    return True


def _save(plt, figure, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def draw_figures(all_results: list[dict], out: Path) -> list[Path]:
    """Every figure the results allow, as PNGs in `out`; the per-run ones from the first results."""
    out.mkdir(parents=True, exist_ok=True)
    first = all_results[0]
    figures = {"frontier": lambda p: frontier(all_results, p),
               "forget_size": lambda p: forget_size_curves(all_results, p),
               "dynamics": lambda p: dynamics(first, p),
               "softmax": lambda p: softmax_bars(first, p),
               "attacks": lambda p: attack_curves(all_results, p)}
    return [out / f"{name}.png" for name, draw in figures.items() if draw(out / f"{name}.png")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ttp_lightning.plots", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="results.json files or folders holding them")
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNG files")
    parser.add_argument("--wandb", action="store_true",
                        help="also log the figures to a wandb run (offline unless WANDB_MODE says otherwise)")
    args = parser.parse_args(argv)
    try:
        all_results = load_results(args.paths)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    drawn = draw_figures(all_results, args.out)
    print("wrote " + ", ".join(map(str, drawn)) if drawn else "nothing to draw")
    if args.wandb and drawn:
        print(f"wandb: {log_summary('figures', args.out, images=drawn, group=sweep_group(all_results))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
