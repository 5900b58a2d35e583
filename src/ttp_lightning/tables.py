"""`python -m ttp_lightning.tables PATH... [--layout frontier|main|forget] [--out FILE]`: Markdown tables from
results.json files.

PATH is a results.json or a folder searched for them (a multirun sweep). `frontier` (default): one table
per data set, model and method, one row per theta, as the paper's Pareto-frontier tables (Model, theta,
retain accuracy, test accuracy, forget confidence distance), the pretrained model first. `main`: one
table per data set and model, one row per method (Pretrain, Retrain, Synthetic, GaussianUniform, Alg 1,
certified ...), as the paper's main table, with retain and test confidence distances beside the forget one.
`forget`: one table per data set, model and method, one block of rows per forget set (size, how many from
the test set), as the paper's forget-set-size ablation and test-instance tables: the pretrained model
(A(D) before and after learning outside forget instances, when there are any), then the method.
"""

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

METHOD_LABELS = {"retrain": "Retrain", "synthetic": "Synthetic", "labeldp": "LabelDP",
                 "gaussian_uniform": "GaussianUniform",
                 "pareto": "Alg 1", "certified_exact": "Cert. (Alg 2)", "certified_lissa": "Cert. (Alg 3)",
                 "certified_online": "Cert. (Alg 4)"}  # also the row order of the main table


def load_results(paths: list[Path]) -> list[dict]:
    """Every results.json under the given files/folders, in path order."""
    files = []
    for path in paths:
        if path.is_dir():
            files += sorted(path.rglob("results.json"))
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"{path} is neither a results.json nor a folder")
    if not files:
        raise FileNotFoundError(f"no results.json under {', '.join(map(str, paths))}")
    return [json.loads(f.read_text()) for f in files]


def model_name(results: dict) -> str:
    return results["config"]["model"]["_target_"].rsplit(".", 1)[-1].replace("vision_transformer", "ViT")


def percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def frontier_markdown(all_results: list[dict]) -> str:
    """One Markdown table per (data set, model, method), rows sorted by theta."""
    groups = defaultdict(list)
    for results in all_results:
        key = (results["config"]["data"]["name"], model_name(results), results["method"])
        groups[key].append(results)
    blocks = []
    for (data, model, method), runs in sorted(groups.items()):
        runs.sort(key=lambda r: r["config"]["method"].get("theta", 0.0))
        pretrain = runs[0]["metrics"]["pretrain"]
        label = f"{METHOD_LABELS.get(method, method)} {model}"
        lines = [f"### {data}: {label}", "",
                 "| Model | theta | Retain Acc. | Test Acc. | Conf. Dist. (lower better) |",
                 "|---|---|---|---|---|",
                 (f"| pretrained {model} | - | {percent(pretrain['retain_acc'])} | "
                  f"{percent(pretrain.get('test_acc', float('nan')))} | {pretrain['forget_conf_dist']:.3f} |")]
        for run in runs:
            metrics = run["metrics"][method]
            theta = run["config"]["method"].get("theta")
            lines.append(f"| {label} | {'-' if theta is None else f'{theta:.3f}'} | {percent(metrics['retain_acc'])} | "
                         f"{percent(metrics.get('test_acc', float('nan')))} | {metrics['forget_conf_dist']:.3f} |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def main_table_markdown(all_results: list[dict]) -> str:
    """One Markdown table per (data set, model): Pretrain, then one row per method in the paper's order."""
    groups = defaultdict(dict)
    for results in all_results:
        groups[(results["config"]["data"]["name"], model_name(results))][results["method"]] = results
    order = list(METHOD_LABELS)
    blocks = []
    for (data, model), by_method in sorted(groups.items()):
        methods = sorted(by_method, key=lambda m: order.index(m) if m in order else len(order))
        rows = [("Pretrain", by_method[methods[0]]["metrics"]["pretrain"])]
        rows += [(METHOD_LABELS.get(m, m), by_method[m]["metrics"][m]) for m in methods]
        lines = [f"### {data}, {model}", "",
                 "| Method | Retain Acc. | Test Acc. | Conf. Dist. (forget) | Retain CD | Test CD |",
                 "|---|---|---|---|---|---|"]
        for label, m in rows:
            lines.append(f"| {label} | {percent(m['retain_acc'])} | {percent(m.get('test_acc', float('nan')))} | "
                         f"{m['forget_conf_dist']:.3f} | {m['retain_conf_dist']:.3f} | "
                         f"{m.get('test_conf_dist', float('nan')):.3f} |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def forget_set(results: dict) -> tuple[int, int]:
    """(|D_f|, how many of them came from the test set)."""
    data = results.get("data", {})
    return data.get("forget_size", 0), data.get("forget_from_test", 0)


def forget_sets_markdown(all_results: list[dict]) -> str:
    """One Markdown table per (data set, model, method), rows grouped by forget set (size, from test)."""
    groups = defaultdict(list)
    for results in all_results:
        groups[(results["config"]["data"]["name"], model_name(results), results["method"])].append(results)
    stage_labels = {"pretrain_original": "Pretrain (D_f unseen)", "pretrain": "Pretrain"}
    blocks = []
    for (data, model, method), runs in sorted(groups.items()):
        label = METHOD_LABELS.get(method, method)
        lines = [f"### {data}: {label} {model}, by forget set", "",
                 "| Forget Size | From Test | Stage | Retain Acc. | Test Acc. | Conf. Dist. (lower better) |",
                 "|---|---|---|---|---|---|"]
        for run in sorted(runs, key=lambda r: (forget_set(r)[1] / max(forget_set(r)[0], 1), forget_set(r)[0])):
            size, from_test = forget_set(run)
            for stage, m in run["metrics"].items():
                lines.append(f"| {size} | {from_test} | {stage_labels.get(stage, label)} | {percent(m['retain_acc'])} | "
                             f"{percent(m.get('test_acc', float('nan')))} | {m['forget_conf_dist']:.3f} |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


LAYOUTS = {"frontier": frontier_markdown, "main": main_table_markdown, "forget": forget_sets_markdown}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ttp_lightning.tables", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="results.json files or folders holding them")
    parser.add_argument("--layout", choices=list(LAYOUTS), default="frontier")
    parser.add_argument("--out", type=Path, help="also write the Markdown to this file")
    args = parser.parse_args(argv)
    try:
        markdown = LAYOUTS[args.layout](load_results(args.paths))
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(markdown)
    print(markdown, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
