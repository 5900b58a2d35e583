"""The charts and tables of a run, or of a sweep, sent to wandb (offline unless WANDB_MODE says otherwise).

A run with `logger=wandb` gets its metric and attack tables and its figures (dynamics, softmax bars,
attack curves, also written to <run dir>/figures/) in its own wandb run. Sweep-level charts and tables
(frontier, forget-set size, the paper's table layouts) go to a summary run: `plots --wandb`, `tables --wandb`.
"""

import os
import re
from pathlib import Path

from ttp_lightning.reporting.results import COLUMNS, PER_IMAGE_COLUMNS, attack_scores, forget_image_rows

Table = tuple[list[str], list[list]]  # columns, rows


def _number(value):
    """A cell a dashboard can sort and plot: a number as it is (a bool as 0 / 1), anything else None."""
    if isinstance(value, bool):
        return int(value)
    return value if isinstance(value, (int, float)) else None


def stage_table(metrics: dict[str, dict], keys: list[str]) -> Table:
    """One row per stage: `keys` of its metrics, as numbers (results.json's names as columns)."""
    return ["stage", *keys], [[stage, *(_number(values.get(key)) for key in keys)] for stage, values in metrics.items()]


def attack_table(attacks: dict[str, dict], proven: dict | None) -> Table:
    """One row per (attack, radius in 1/255; None for the clean images) with each stage's forget CD and accuracy,
    and a `proven` row per radius with each stage's mean proven CD (its accuracy: None)."""
    stages = list(attacks)
    columns = ["attack", "gamma"] + [f"{stage}_{what}" for stage in stages for what in ("conf_dist", "acc")]
    return columns, [[attack, None if gamma is None else float(gamma), *map(_number, values)]
                     for attack, gamma, values in attack_scores(attacks, proven)]


def relearn_table(relearn: dict[str, dict]) -> Table:
    """The relearning attack, one row per (stage, finetuning steps): the worst run's forget CD and accuracy."""
    return (["stage", "steps", "forget_conf_dist", "forget_acc", "forget_worst_conf_dist", "run"],
            [[stage, int(steps), _number(s["forget_conf_dist"]), _number(s["forget_acc"]),
              _number(s.get("forget_worst_conf_dist")), str(s.get("run", ""))]
             for stage, by_steps in relearn.items() for steps, s in by_steps.items()])


def frontier_tables(frontier: dict) -> dict[str, Table]:
    """A refused robust release's price: per training radius, and the kept weights per judged radius."""
    trained = ["train_gamma", "epochs", "epoch", "retain_cost", "confirmed_cost", "exposed", "proven"]
    judged = ["gamma", "exposed", "proven", "passes"]
    return {"frontier_trained": (trained, [[_number(row.get(k)) for k in trained] for row in frontier["trained"]]),
            "frontier_judged": (judged + ["by"], [[_number(row[k]) for k in judged] + [row.get("by", "attack")]
                                                  for row in frontier["judged"]])}


def run_tables(results: dict) -> dict[str, Table]:
    """Every table of one run, numeric (a dashboard sorts and plots them; the console's text tables format)."""
    tables = {"metrics": stage_table(results["metrics"], [key for key, _, _ in COLUMNS])}
    if "release_gate" in results:  # every forget image: the stages' worst and counts, then one row per image
        tables["per_image"] = stage_table(results["metrics"], [key for key, _, _ in PER_IMAGE_COLUMNS])
        header, *rows = forget_image_rows(results["forget_per_image"])
        tables["forget_images"] = ([c.replace(" ", "_") for c in header], rows)
    if "attacks" in results:
        tables["attacks"] = attack_table(results["attacks"], results.get("proven"))
    if results.get("relearn"):
        tables["relearn"] = relearn_table(results["relearn"])
    if results.get("relearn_floor"):
        tables["relearn_floor"] = relearn_table({"floor": results["relearn_floor"]["worst"]})
    if results.get("frontier"):
        tables.update(frontier_tables(results["frontier"]))
    return tables


def _payload(images: list[Path], tables: dict[str, tuple[list[str], list[list[str]]]]) -> dict:
    import wandb

    payload = {f"figures/{path.stem}": wandb.Image(str(path)) for path in images}
    payload.update({f"tables/{name}": wandb.Table(columns=header, data=rows) for name, (header, rows) in tables.items()})
    return payload


def log_run_charts(run, results: dict, images: list[Path]) -> None:
    """Log one run's numeric tables and its figures (`images`, drawn by the caller) to its wandb `run` (a
    WandbLogger's experiment)."""
    run.log(_payload(images, run_tables(results)))


def released_summary(results: dict) -> dict:
    """What a runs table shows of the run: the released epoch (`epoch`, and its `val/*` values: not the last
    epoch's, which early stopping did not keep) and the release gate's verdict, reasons and failing images."""
    method = results["method"]
    summary = {}
    best, history = results["metrics"].get(method, {}).get("best_epoch"), results["history"].get(method) or []
    if isinstance(best, int) and 0 < best <= len(history):
        row = history[best - 1]
        summary["epoch"] = best
        summary.update({f"val/{key}": value for key, value in row.items()
                        if key not in ("epoch", "elapsed_s") and _number(value) is not None})
    gate = results.get("release_gate")
    if gate:
        summary.update({"gate/passed": bool(gate["passed"]), "gate/folder": gate["folder"],
                        "gate/reasons": "; ".join(gate["reasons"]),
                        "gate/failing_images": [str(image) for image in gate.get("failing_images", [])]})
    return summary


def log_release(run, results: dict, output_dir: str) -> None:
    """The folder the gate wrote (release/, or release_not_protected/) as a model artifact of the run, named after
    the run and saying whether it is protected."""
    import wandb

    folder = Path(output_dir) / results["release_gate"]["folder"] if results.get("release_gate") else None
    if folder is None or not folder.is_dir():
        return
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{results['run']['name']}-{folder.name}")
    artifact = wandb.Artifact(name, type="model", metadata={"protected": bool(results["release_gate"]["passed"]),
                                                            "folder": folder.name, "experiment": results["experiment"]})
    artifact.add_dir(str(folder))
    run.log_artifact(artifact)


def sweep_group(all_results: list[dict]) -> str | None:
    """The wandb group the results' runs share (their sweep), or None when they are not one sweep."""
    groups = {(results.get("run") or {}).get("group") for results in all_results}
    return groups.pop() if len(groups) == 1 else None


def log_summary(name: str, directory: Path, images: list[Path] = (),
                tables: dict[str, tuple[list[str], list[list[str]]]] | None = None, group: str | None = None) -> str:
    """One wandb run (job type `summary`, written under `directory`, in the sweep's `group` when the results
    are one sweep) holding sweep-level figures and tables; returns the run's folder."""
    import wandb

    directory.mkdir(parents=True, exist_ok=True)
    run = wandb.init(project="ttp_lightning", name=name if group is None else f"{group}:{name}", job_type="summary",
                     group=group, dir=str(directory), mode=os.environ.get("WANDB_MODE", "offline"))
    run.log(_payload(list(images), tables or {}))
    run.finish()
    return str(Path(run.dir).parent) if run.dir else "(wandb disabled)"
