"""`python -m ttp_lightning.plots PATH... --out DIR`: PNG figures from results.json files (needs matplotlib,
the `plots` extra).

  frontier.png   retain / test accuracy and forget confidence distance against theta, per method
                 (a theta sweep: one method at two or more thetas)
  forget_size.png  the same against the forget set size (a forget-set-size sweep)
  dynamics.png   the method's per-epoch accuracy and confidence distance, the restored epoch marked (a sweep:
                 every run's test accuracy and forget confidence distance)
  softmax.png    softmax bars of five forget instances, pretrained vs the method's model (a sweep: the first
                 run, named in the title)
  attacks.png    forget confidence distance (clean, then the worst attack) against the attack radius gamma,
                 for every run's method and the pretrained model
  worst_image.png  test accuracy against the worst forget image's confidence distance, one line per forget
                 reduction, each point a theta, and the release gate's threshold (a certified theta sweep)
Titles name the data set, model and theta; accuracies are on fixed 0-100 % axes and confidence distances on
their full range. `--wandb` also logs them to an offline wandb run under the output folder.
"""

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from ttp_lightning.reporting.run_identity import short_value
from ttp_lightning.reporting.tables import (
    forget_set,
    load_results,
    method_label,
    model_name,
    reduction_of,
    theta_of,
)
from ttp_lightning.reporting.wandb_charts import log_summary, sweep_group


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def stage_label(stage: str, results: dict) -> str:
    """How the paper names a stage: the pretrained model, Alg 1, Cert. (Alg 2), the baselines."""
    return {"pretrain": "pretrained", "pretrain_original": "pretrained (before absorbing)"}.get(
        stage, method_label(results, stage))


def describe(results: dict, theta: bool = True) -> str:
    """`digits / MLP / theta = 0.75`: data set, model and (where the method has one) theta."""
    parts = [results["config"]["data"]["name"], model_name(results)]
    value = theta_of(results)
    if theta and value is not None:
        parts.append(f"theta = {value:g}")
    return " / ".join(parts)


def run_label(results: dict) -> str:
    """A job of a sweep by its swept values (older results: theta)."""
    swept = (results.get("run") or {}).get("swept") or {}
    if swept:
        return ", ".join(f"{key.rsplit('.', 1)[-1]} = {short_value(value)}" for key, value in swept.items())
    value = theta_of(results)
    return f"theta = {short_value(float(value))}" if value is not None else results.get("experiment", "run")


def _percent_axis(axis, label: str) -> None:
    """Accuracy in percent on a fixed 0-100 % axis, so a 0.1-point change looks like one."""
    from matplotlib.ticker import PercentFormatter

    axis.set_ylim(0, 1.02)
    axis.yaxis.set_major_formatter(PercentFormatter(1.0))
    axis.set_ylabel(label)


def _distance_axis(axis, num_classes: int | None) -> None:
    """Confidence distance on its full range, 0 (uniform softmax) to 1 - 1/K (one-hot)."""
    top = 1 - 1 / num_classes if num_classes else 1.0
    axis.set_ylim(0, top * 1.04)
    axis.set_ylabel("confidence distance\n(0 = uniform softmax)")


def _num_classes(results: dict) -> int | None:
    outputs = results.get("forget_softmax") or {}
    for instances in outputs.values():
        if instances:
            return len(instances[0]["softmax"])
    return None


def sweep_curves(all_results: list[dict], path: Path, x_of, x_label: str, log_x: bool = False) -> bool:
    """Retain / test accuracy (percent, 0-100 %) and forget confidence distance (its full range) against
    `x_of(results)`, one line per method run at two or more distinct x values, and the pretrained model as
    a dashed reference line (results with x None are skipped)."""
    by_method = defaultdict(list)
    for results in all_results:
        x = x_of(results)
        if x is not None:
            by_method[results["method"]].append((x, results["metrics"][results["method"]], results))
    sweeps = {m: sorted(points, key=lambda p: p[0]) for m, points in by_method.items()
              if len({x for x, _, _ in points}) > 1}
    if not sweeps:
        return False
    plt = _pyplot()
    figure, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    keys = ("retain_acc", "test_acc", "forget_conf_dist")
    first = next(iter(sweeps.values()))[0][2]
    for points in sweeps.values():
        xs = [x for x, _, _ in points]
        for axis, key in zip(axes, keys):
            axis.plot(xs, [m[key] for _, m, _ in points], marker="o", label=method_label(points[0][2]))
    pretrained = first["metrics"]["pretrain"]
    for axis, key in zip(axes, keys):
        axis.axhline(pretrained[key], color="grey", linestyle="--", linewidth=1, label="pretrained model")
    for axis, title in zip(axes, ("retain accuracy", "test accuracy", "forget confidence distance")):
        axis.set(xlabel=x_label, title=title, xscale="log" if log_x else "linear")
        axis.grid(alpha=0.3)
    _percent_axis(axes[0], "accuracy on D_r")
    _percent_axis(axes[1], "accuracy on the test set")
    _distance_axis(axes[2], _num_classes(first))
    axes[2].legend(fontsize=8)
    runs = sum(len(points) for points in sweeps.values())
    figure.suptitle(f"{describe(first, theta=False)}: {runs} runs, every one shown")
    _save(plt, figure, path)
    return True


def frontier(all_results: list[dict], path: Path) -> bool:
    """The Pareto frontier: metrics against theta."""
    return sweep_curves(all_results, path, lambda r: theta_of(r),
                        "theta (weight of the forget set's uniformity loss)")


def forget_size_curves(all_results: list[dict], path: Path) -> bool:
    """The forget-set-size ablation: metrics against |D_f| (log scale), forget sets from the training data."""
    def size(results):
        size, from_test = forget_set(results)
        return None if from_test else size

    return sweep_curves(all_results, path, size, "forget set size |D_f| (log scale)", log_x=True)


def _history(results: dict) -> list[dict]:
    return [row for row in results["history"].get(results["method"], []) if "epoch" in row]


def dynamics(all_results: list[dict], path: Path) -> bool:
    """Per-epoch curves of the method's fit with the restored (released) epoch marked: for one run its
    retain / test / forget accuracy and forget / test confidence distance; for a sweep, every job's test
    accuracy and forget confidence distance, one colour per job."""
    runs = [results for results in all_results if _history(results)]
    if not runs:
        return False
    plt = _pyplot()
    figure, (accuracy, distance) = plt.subplots(1, 2, figsize=(12, 4.2))
    label = method_label(runs[0])
    if len(runs) == 1:
        results, rows = runs[0], _history(runs[0])
        epochs = [row["epoch"] for row in rows]
        for key, name in (("retain_acc", "retain (D_r)"), ("test_acc", "test"), ("forget_acc", "forget (D_f)")):
            if key in rows[0]:
                accuracy.plot(epochs, [row[key] for row in rows], label=name)
        for key, name in (("forget_conf_dist", "forget (D_f)"), ("forget_robust_conf_dist", "forget under attack"),
                          ("test_conf_dist", "test")):
            if key in rows[0]:
                distance.plot(epochs, [row[key] for row in rows], label=name)
        _mark_restored(results, (accuracy, distance))
        title = f"{label} on {describe(results)}"
    else:
        for index, results in enumerate(runs):
            rows, colour = _history(results), f"C{index}"
            epochs = [row["epoch"] for row in rows]
            accuracy.plot(epochs, [row["test_acc"] for row in rows], color=colour, label=run_label(results))
            distance.plot(epochs, [row["forget_conf_dist"] for row in rows], color=colour, label=run_label(results))
            _mark_restored(results, (accuracy, distance), colour=colour,
                           label="restored epoch of each run (dotted, its colour)" if index == 0 else None)
        title = f"{label} on {describe(runs[0], theta=False)}: all {len(runs)} runs (test accuracy, forget CD)"
    from matplotlib.ticker import MaxNLocator

    for axis, name in ((accuracy, "accuracy"), (distance, "confidence distance")):
        axis.set(xlabel="epoch of the method's finetuning", title=name)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.legend(fontsize=8)
        axis.grid(alpha=0.3)
    _percent_axis(accuracy, "accuracy")
    _distance_axis(distance, _num_classes(runs[0]))
    figure.suptitle(title)
    _save(plt, figure, path)
    return True


def _mark_restored(results: dict, axes, colour: str = "black", label: str | None = "") -> None:
    """A dotted vertical line at the epoch whose weights were kept (early stopping's choice)."""
    best = results["metrics"].get(results["method"], {}).get("best_epoch")
    if not isinstance(best, (int, float)):
        return
    for axis in axes:
        axis.axvline(best, color=colour, linestyle=":", linewidth=1.2,
                     label=f"restored epoch {best} (the released weights)" if label == "" else label)


def softmax_bars(all_results: list[dict], path: Path) -> bool:
    """Softmax outputs on five forget instances, one row per stage (pretrained, the method): bars per
    class, the true class in red, the uniform level 1/K dashed. A sweep shows its first run, and says so."""
    results = next((r for r in all_results if r.get("forget_softmax")), None)
    if results is None:
        return False
    outputs = results["forget_softmax"]
    plt = _pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    stages = list(outputs)
    count = len(outputs[stages[0]])
    figure, axes = plt.subplots(len(stages), count, figsize=(2.8 * count, 2.5 * len(stages) + 0.9),
                                squeeze=False, sharey=True)
    for row, stage in enumerate(stages):
        for column, instance in enumerate(outputs[stage]):
            axis = axes[row][column]
            probs = instance["softmax"]
            colours = ["tab:red" if c == instance["label"] else "tab:blue" for c in range(len(probs))]
            axis.bar(range(len(probs)), probs, color=colours)
            axis.axhline(1 / len(probs), color="grey", linestyle="--", linewidth=0.8)
            axis.set_ylim(0, 1)
            step = max(1, len(probs) // 10)
            axis.set_xticks(range(0, len(probs), step))
            axis.set_title(f"{stage_label(stage, results)}: forget image {column + 1} (class {instance['label']})", fontsize=8)
            if row == len(stages) - 1:
                axis.set_xlabel("class")
            if column == 0:
                axis.set_ylabel("softmax probability")
    handles = [Patch(color="tab:red", label="true class"), Patch(color="tab:blue", label="other classes"),
               Line2D([], [], color="grey", linestyle="--", label="uniform 1/K (the target)")]
    figure.legend(handles=handles, loc="lower center", ncol=3, fontsize=8)
    label = method_label(results)
    several = len(all_results) > 1
    shown = f"\nrun 1 of {len(all_results)} shown ({run_label(results)}); each run's own is in its figures/" \
        if several else ""
    figure.suptitle(f"Softmax on forget images, pretrained vs {label}: {describe(results, theta=not several)}{shown}")
    figure.tight_layout(rect=(0, 0.06, 1, 0.97 if several else 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def _worst_case(by_attack: dict) -> dict[float, float]:
    """Forget CD per gamma of the worst attack ("worst" per image; older results: the worst mean)."""
    if "worst" in by_attack:
        return {float(g): v["forget_conf_dist"] for g, v in by_attack["worst"].items()}
    curves = [{float(g): v["forget_conf_dist"] for g, v in per_gamma.items()}
              for name, per_gamma in by_attack.items() if name != "none"]
    return {g: max(curve[g] for curve in curves if g in curve) for g in curves[0]} if curves else {}


def attack_curves(all_results: list[dict], path: Path) -> bool:
    """Forget CD against the attack radius for every run's method (a sweep: one line per run) and the
    pretrained model: gamma 0 is the clean forget CD, each larger gamma the worst attack's."""
    curves, settings = {}, set()
    several = len([r for r in all_results if r.get("attacks")]) > 1
    for results in all_results:
        if results.get("attacks"):
            settings.add(describe(results, theta=not several))
        for stage, by_attack in results.get("attacks", {}).items():
            label = stage_label(stage, results)
            if stage != "pretrain" and several:
                label = f"{label} ({run_label(results)})"
            if stage == "pretrain_original" or label in curves:
                continue
            points = {0.0: by_attack["none"]["0"]["forget_conf_dist"], **_worst_case(by_attack)}
            curves[label] = sorted(points.items())
    if not curves:
        return False
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7.5, 4.6))
    for label, points in curves.items():
        axis.plot([g for g, _ in points], [cd for _, cd in points], marker="o", label=label,
                  linestyle="--" if label == "pretrained" else "-")
    axis.set(xlabel="attack radius gamma (L-inf, in units of 1/255; 0 = no attack)",
             title=f"Forget CD under the worst attack: {' | '.join(sorted(settings))}")
    _distance_axis(axis, _num_classes(all_results[0]))
    axis.set_ylabel("forget confidence distance, worst attack\n(0 = uniform softmax, higher = attack wins)")
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    _save(plt, figure, path)
    return True


def worst_image_curves(all_results: list[dict], path: Path) -> bool:
    """Test accuracy against the worst forget image's CD: one line per forget reduction (of a certified theta
    sweep with two or more thetas), points labelled with theta; the gate's threshold dashed, the pretrained
    model a grey point."""
    lines = defaultdict(list)
    for results in all_results:
        metrics = results["metrics"][results["method"]]
        if "sensitivity" in metrics and theta_of(results) is not None:
            lines[reduction_of(results)].append((theta_of(results), metrics, results))
    lines = {name: sorted(points, key=lambda p: p[0]) for name, points in lines.items() if len(points) > 1}
    if not lines:
        return False
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7.5, 5))
    first = next(iter(lines.values()))[0][2]
    for name, points in sorted(lines.items()):
        xs = [m["forget_worst_conf_dist"] for _, m, _ in points]
        ys = [m["test_acc"] for _, m, _ in points]
        axis.plot(xs, ys, marker="o", label=f"forget reduction: {name}")
        for (theta, _, _), x, y in zip(points, xs, ys):
            axis.annotate(f"{theta:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    pretrained = first["metrics"]["pretrain"]
    axis.scatter([pretrained["forget_worst_conf_dist"]], [pretrained["test_acc"]], color="grey", zorder=3,
                 label="pretrained model")
    threshold = (first.get("release_gate") or {}).get("conf_dist_at_most")
    if threshold is not None:
        axis.axvline(threshold, color="black", linestyle="--", linewidth=1,
                     label=f"release gate: every image <= {threshold:g}")
    top = 1 - 1 / _num_classes(first) if _num_classes(first) else 1.0
    axis.set_xlim(0, top * 1.04)
    axis.set_xlabel("worst forget image's confidence distance (0 = uniform softmax)")
    _percent_axis(axis, "accuracy on the test set")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="lower right")
    axis.set_title(f"{describe(first, theta=False)}, {method_label(first)}: labels are theta", fontsize=10)
    _save(plt, figure, path)
    return True


def _save(plt, figure, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def draw_figures(all_results: list[dict], out: Path) -> list[Path]:
    """Every figure the results allow, as PNGs in `out`; the per-run ones from the first results."""
    out.mkdir(parents=True, exist_ok=True)
    figures = {"frontier": lambda p: frontier(all_results, p),
               "forget_size": lambda p: forget_size_curves(all_results, p),
               "dynamics": lambda p: dynamics(all_results, p),
               "softmax": lambda p: softmax_bars(all_results, p),
               "attacks": lambda p: attack_curves(all_results, p),
               "worst_image": lambda p: worst_image_curves(all_results, p)}
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
