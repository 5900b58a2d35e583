"""`python -m ttp_lightning.tables PATH... [--layout frontier|main|forget] [--by KEY] [--out FILE] [--wandb]`:
Markdown tables from results.json files.

PATH is a results.json or a folder searched for them (a multirun sweep).
`frontier` (default): one table per data set, model and method, one row per theta (or per value of the
config key `--by`, e.g. method.k), as the paper's Pareto-frontier tables (Model, theta, retain accuracy,
test accuracy, forget confidence distance), the pretrained model first.
`main`: one table per data set and model, one row per method (Pretrain, Retrain, Synthetic, LabelDP,
GaussianUniform, Alg 1, certified ...), as the paper's main table, with retain and test confidence
distances beside the forget one.
`certified`: one table per data set, model and certified method, one row per forget reduction and theta: test
accuracy and CD, the mean and worst forget CD, the images above the release gate's threshold, the gate's
verdict, Delta, sigma and epsilon (a certified theta sweep run with both reductions).
`forget`: one table per data set, model and method, one block of rows per forget set (size, how many from
the test set), as the paper's forget-set-size ablation and test-instance tables: the pretrained model
(A(D) before and after learning outside forget instances, when there are any), then the method.
"""

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ttp_lightning.core.files import SUPERSEDED
from ttp_lightning.core.words import RESULTS_FORMAT, BothWords, upgraded
from ttp_lightning.reporting.wandb_charts import log_summary, sweep_group

MAIN_TABLE_ORDER = ("retrain", "synthetic", "labeldp", "gaussian_uniform", "pareto", "pareto_robust", "certified_exact",
                    "certified_lissa", "certified_online")  # the paper's row order; other methods after them


def method_label(results: dict, stage: str | None = None) -> str:
    """How the run's method (or `stage`, when it is the method) is named: the `label` of its YAML as
    results.json's config records it, else its name."""
    method = results["method"]
    if stage is not None and stage != method:
        return stage
    return ((results.get("config") or {}).get("method") or {}).get("label") or method


def load_results(paths: list[Path]) -> list[dict]:
    """Every results.json under the given files/folders, in path order."""
    files = []
    for path in paths:
        if path.is_dir():
            files += sorted(f for f in path.rglob("results.json") if SUPERSEDED not in f.relative_to(path).parts)
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"{path} is neither a results.json nor a folder")
    if not files:
        raise FileNotFoundError(f"no results.json under {', '.join(map(str, paths))}")
    documents = [json.loads(f.read_text()) for f in files]
    earlier = [f for f, document in zip(files, documents) if document.get("format") != RESULTS_FORMAT]
    if earlier:  # said once, on stderr: the tables go to stdout or a file
        print(f"read {len(earlier)} results.json of the earlier format ttp_lightning.results/1 (its bound-based "
              f"words were certified; read as proven), e.g. {earlier[0]}", file=sys.stderr)
    try:
        return [document if document.get("format") == RESULTS_FORMAT else in_current_words(document)
                for document in documents]
    except BothWords as exc:
        where = next(f for f, d in zip(files, documents) if d.get("format") != RESULTS_FORMAT and _both(d))
        raise BothWords(f"{where}: {exc}") from None


def _both(document: dict) -> bool:
    try:
        upgraded(document)
    except BothWords:
        return True
    return False


def in_current_words(document: dict) -> dict:
    """A ttp_lightning.results/1 document in /2's words (core.words), its format said."""
    return {"format": "ttp_lightning.results/1", **upgraded({k: v for k, v in document.items() if k != "format"})}


def model_name(results: dict) -> str:
    model = results["config"]["model"]
    if model.get("name") or model.get("variant"):  # timm models: the architecture's own name
        return str(model.get("name") or model.get("variant"))
    return model["_target_"].rsplit(".", 1)[-1].replace("vision_transformer", "ViT")


def percent(value: float) -> str:
    return f"{100 * value:.1f}%"


@dataclass
class Table:
    """One table of a layout: a title, column names and rows of formatted cells (Markdown or wandb)."""

    title: str
    header: list[str]
    rows: list[list[str]]

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.header) + " |", "|" + "---|" * len(self.header)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in self.rows])


def to_markdown(tables: list[Table]) -> str:
    return "\n\n".join(table.markdown() for table in tables) + "\n"


def scores(metrics: dict) -> list[str]:
    """Retain accuracy, test accuracy, forget confidence distance: the paper's three columns."""
    return [percent(metrics["retain_acc"]), percent(metrics.get("test_acc", float("nan"))),
            f"{metrics['forget_conf_dist']:.3f}"]


SCORE_COLUMNS = ["Retain Acc.", "Test Acc.", "Conf. Dist. (lower better)"]


def config_value(results: dict, dotted_key: str):
    """The resolved config value at `dotted_key` (e.g. method.theta), or None where the run has none."""
    value = results["config"]
    for part in dotted_key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def theta_of(results: dict):
    """The theta the method ran at: the one its rule chose (`method.theta=auto`), else the configured one."""
    chosen = results["metrics"].get(results["method"], {}).get("theta")
    return chosen if chosen is not None else config_value(results, "method.theta")


def frontier_tables(all_results: list[dict], by: str = "method.theta") -> list[Table]:
    """One table per (data set, model, method), rows sorted by the swept config value `by` (theta for
    the Pareto frontier; e.g. method.k for the synthetic baseline's ablation), the pretrained model first."""
    groups = defaultdict(list)
    for results in all_results:
        key = (results["config"]["data"]["name"], model_name(results), results["method"])
        groups[key].append(results)
    tables = []
    value_of = theta_of if by == "method.theta" else lambda r: config_value(r, by)
    for (data, model, method), runs in sorted(groups.items()):
        runs.sort(key=lambda r: (value_of(r) is None, value_of(r) or 0))
        label = f"{method_label(runs[0])} {model}"
        rows = [[f"pretrained {model}", "-", *scores(runs[0]["metrics"]["pretrain"])]]
        for run in runs:
            value = value_of(run)
            shown = "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
            rows.append([label, shown, *scores(run["metrics"][method])])
        tables.append(Table(f"{data}: {label}", ["Model", by.rsplit(".", 1)[-1], *SCORE_COLUMNS], rows))
    return tables


def main_tables(all_results: list[dict]) -> list[Table]:
    """One table per (data set, model): Pretrain, then one row per method in the paper's order, with
    retain and test confidence distances beside the forget one."""
    groups = defaultdict(dict)
    for results in all_results:
        groups[(results["config"]["data"]["name"], model_name(results))][results["method"]] = results
    order = list(MAIN_TABLE_ORDER)
    tables = []
    for (data, model), by_method in sorted(groups.items()):
        methods = sorted(by_method, key=lambda m: order.index(m) if m in order else len(order))
        labelled = [("Pretrain", by_method[methods[0]]["metrics"]["pretrain"])]
        labelled += [(method_label(by_method[m]), by_method[m]["metrics"][m]) for m in methods]
        rows = [[label, *scores(m)[:2], f"{m['forget_conf_dist']:.3f}", _robust(m), f"{m['retain_conf_dist']:.3f}",
                 f"{m.get('test_conf_dist', float('nan')):.3f}"] for label, m in labelled]
        header = ["Method", "Retain Acc.", "Test Acc.", "Conf. Dist. (forget)", "Robust CD (worst attack)",
                  "Retain CD", "Test CD"]
        tables.append(Table(f"{data}, {model}", header, rows))
    return tables


def _robust(metrics: dict) -> str:
    """The forget CD under the worst attack at attacks.robust_gamma, or "-" for runs without attacks."""
    value = metrics.get("forget_robust_conf_dist")
    return "-" if value is None else f"{value:.3f}"


def forget_set(results: dict) -> tuple[int, int]:
    """(|D_f|, how many of them came from the test set)."""
    data = results.get("data", {})
    return data.get("forget_size", 0), data.get("forget_from_test", 0)


def forget_set_tables(all_results: list[dict]) -> list[Table]:
    """One table per (data set, model, method), rows grouped by forget set (share from test, size): the
    pretrained model (before and after learning outside forget instances, when there are any), the method."""
    groups = defaultdict(list)
    for results in all_results:
        groups[(results["config"]["data"]["name"], model_name(results), results["method"])].append(results)
    stage_labels = {"pretrain_original": "Pretrain (D_f unseen)", "pretrain": "Pretrain"}
    tables = []
    for (data, model, method), runs in sorted(groups.items()):
        label = method_label(runs[0])
        rows = []
        for run in sorted(runs, key=lambda r: (forget_set(r)[1] / max(forget_set(r)[0], 1), forget_set(r)[0])):
            size, from_test = forget_set(run)
            rows += [[str(size), str(from_test), stage_labels.get(stage, label), *scores(m)]
                     for stage, m in run["metrics"].items()]
        header = ["Forget Size", "From Test", "Stage", *SCORE_COLUMNS]
        tables.append(Table(f"{data}: {label} {model}, by forget set", header, rows))
    return tables


def reduction_of(results: dict) -> str:
    """The run's forget reduction with its temperature and fraction where it has them (as its certificate states
    them, `auto` resolved; else as configured); mean when unset."""
    stated = (results.get("certificate") or {}).get("forget_reduction")
    if stated:
        name, temperature, fraction = stated["name"], stated["temperature"], stated["fraction"]
    else:
        name = config_value(results, "method.forget_reduction") or "mean"
        temperature = config_value(results, "method.forget_reduction_temperature")
        fraction = config_value(results, "method.forget_cvar_fraction") if name == "cvar" else None
    if name == "mean":
        return "mean"
    shown = lambda v: f"{v:.2g}" if isinstance(v, float) else str(v)
    return name + "".join(f" {k}={shown(v)}" for k, v in (("T", temperature), ("alpha", fraction)) if v is not None)


def certified_row(results: dict) -> list[str]:
    metrics = results["metrics"][results["method"]]
    gate = results.get("release_gate") or {}
    above = len(gate.get("failing_images") or [])
    verdict = "released" if gate.get("passed") else f"refused ({above} images)" if above else "refused"
    theta = theta_of(results)
    return [reduction_of(results), "-" if theta is None else f"{theta:g}", percent(metrics["test_acc"]),
            f"{metrics.get('test_conf_dist', float('nan')):.3f}", f"{metrics['forget_conf_dist']:.3f}",
            f"{metrics['forget_worst_conf_dist']:.3f}", str(metrics.get("forget_exposed", "-")), verdict,
            f"{metrics.get('sensitivity', float('nan')):.2g}", f"{metrics.get('sigma', float('nan')):.2g}",
            f"{metrics.get('epsilon', float('nan')):.3g}"]


def certified_tables(all_results: list[dict]) -> list[Table]:
    """One table per (data set, model, method) of the certified runs, rows by reduction then theta."""
    groups = defaultdict(list)
    for results in all_results:
        if "sensitivity" in results["metrics"][results["method"]]:
            groups[(results["config"]["data"]["name"], model_name(results), results["method"])].append(results)
    tables = []
    for (data, model, method), runs in sorted(groups.items()):
        runs.sort(key=lambda r: (reduction_of(r) != "mean", reduction_of(r), theta_of(r) or 0))
        pretrained = runs[0]["metrics"]["pretrain"]
        rows = [["pretrained", "-", percent(pretrained["test_acc"]), f"{pretrained['test_conf_dist']:.3f}",
                 f"{pretrained['forget_conf_dist']:.3f}", f"{pretrained['forget_worst_conf_dist']:.3f}",
                 str(pretrained.get("forget_exposed", "-")), "-", "-", "-", "-"]]
        header = ["Forget reduction", "theta", "Test Acc.", "Test CD", "Forget CD (mean)", "Forget CD (worst)",
                  "Images > threshold", "Gate", "Delta", "sigma", "epsilon"]
        tables.append(Table(f"{data}: {method_label(runs[0])} {model}", header,
                            rows + [certified_row(r) for r in runs]))
    return tables


LAYOUTS = {"frontier": frontier_tables, "main": main_tables, "forget": forget_set_tables,
           "certified": certified_tables}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ttp_lightning.tables", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="results.json files or folders holding them")
    parser.add_argument("--layout", choices=list(LAYOUTS), default="frontier")
    parser.add_argument("--by", default="method.theta",
                        help="frontier layout: the swept config key that orders the rows (default method.theta)")
    parser.add_argument("--out", type=Path, help="also write the Markdown to this file")
    parser.add_argument("--wandb", action="store_true",
                        help="also log the tables to a wandb run (offline unless WANDB_MODE says otherwise)")
    args = parser.parse_args(argv)
    try:
        all_results = load_results(args.paths)
        tables = frontier_tables(all_results, args.by) if args.layout == "frontier" else LAYOUTS[args.layout](all_results)
    except (OSError, json.JSONDecodeError, KeyError, BothWords) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    markdown = to_markdown(tables)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(markdown)
    print(markdown, end="")
    if args.wandb:
        where = args.out.parent if args.out else (args.paths[0] if args.paths[0].is_dir() else args.paths[0].parent)
        run_dir = log_summary(f"{args.layout}-tables", where,
                              tables={t.title: (t.header, t.rows) for t in tables}, group=sweep_group(all_results))
        print(f"wandb: {run_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
