"""The charts and tables of a run, or of a sweep, sent to wandb (offline unless WANDB_MODE says otherwise).

A run with `logger=wandb` gets its metric and attack tables and its figures (dynamics, softmax bars,
attack curves, also written to <run dir>/figures/) in its own wandb run. Sweep-level charts and tables
(frontier, forget-set size, the paper's table layouts) go to a summary run: `plots --wandb`, `tables --wandb`.
"""

import os
from pathlib import Path

from ttp_lightning.reporting.results import (
    attack_rows,
    forget_image_rows,
    metric_rows,
    per_image_summary_rows,
)


def _payload(images: list[Path], tables: dict[str, tuple[list[str], list[list[str]]]]) -> dict:
    import wandb

    payload = {f"figures/{path.stem}": wandb.Image(str(path)) for path in images}
    payload.update({f"tables/{name}": wandb.Table(columns=header, data=rows) for name, (header, rows) in tables.items()})
    return payload


def log_run_charts(run, results: dict, images: list[Path]) -> None:
    """Log one run's tables and its figures (`images`, drawn by the caller) to its wandb `run` (a
    WandbLogger's experiment)."""
    tables = {"metrics": metric_rows(results["metrics"])}
    if "release_gate" in results:  # every forget image: the stages' worst and counts, then one row per image
        tables["per_image"] = per_image_summary_rows(results["metrics"], results["release_gate"])
        tables["forget_images"] = forget_image_rows(results["forget_per_image"])
    if "attacks" in results:
        tables["attacks"] = attack_rows(results["attacks"])
    run.log(_payload(images, {name: (rows[0], rows[1:]) for name, rows in tables.items()}))


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
