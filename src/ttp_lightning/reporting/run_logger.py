"""The run's Lightning logger, from its start to its end: built from the `logger` group with the resolved config as
flat hyperparameters (a wandb run named after the swept values, grouped by sweep), given the final metrics, tables
and figures, and ended as success or failed so the next run in the process starts a run of its own."""

import logging
from pathlib import Path

from ttp_lightning.config.build import Node, instantiate
from ttp_lightning.reporting.run_identity import flat_config
from ttp_lightning.reporting.wandb_charts import log_release, log_run_charts, released_summary

log = logging.getLogger(__name__)


def route_lightning_logs_to_hydra() -> None:
    """Lightning's own console handler would print every message twice next to Hydra's root handlers."""
    lightning_logger = logging.getLogger("lightning")
    for handler in list(lightning_logger.handlers):
        lightning_logger.removeHandler(handler)


def is_wandb(logger: Node) -> bool:
    return str(logger.get("_target_", "")).endswith("WandbLogger")


def build_logger(logger: Node | None, record: dict, identity: dict):
    """The configured Lightning logger (False for `logger=none`), holding the resolved config (`record`) as flat
    hyperparameters (wandb.config; the CSV logger's hparams.yaml). A wandb run is named after the swept
    values, grouped by sweep, with the method as job type."""
    if not logger:
        return False
    extra = {k: identity[k] for k in ("name", "group", "job_type")} if is_wandb(logger) else {}
    built = instantiate(logger, **extra)
    built.log_hyperparams(flat_config(record))
    return built


def run_figures(results: dict, output_dir: str) -> list:
    """The run's figures (dynamics, softmax bars, attack curves) in <output_dir>/figures; none without
    matplotlib (the `plots` extra)."""
    try:
        from ttp_lightning.reporting.plots import draw_figures
    except ImportError as exc:
        log.warning("figures not drawn for wandb (%s); install the plots extra", exc)
        return []
    return draw_figures([results], Path(output_dir) / "figures")


def finish_logger(logger, results: dict, output_dir: str) -> None:
    """Send the final metrics (and to wandb the run's tables and figures) and end the run, so every
    multirun job gets its own wandb run. Rank 0 only."""
    if not logger:
        return
    flat = {f"final/{stage}/{k}": v for stage, values in results["metrics"].items() for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}
    flat["final/protected"] = int(results["release_gate"]["passed"])  # the release gate's verdict, 1 or 0
    if type(logger).__name__ == "WandbLogger":  # final values are the run's summary, not one-point charts
        logger.experiment.summary.update({**flat, **released_summary(results)})
        log_run_charts(logger.experiment, results, run_figures(results, output_dir))
        log_release(logger.experiment, results, output_dir)
    else:
        logger.log_metrics(flat)
    end_logger(logger, "success")


def end_logger(logger, status: str) -> None:
    """Finalize the logger with `status` ("success" or "failed") and close its wandb run, so the next
    wandb.init (the next multirun job, or the next run in the same process) starts a new one."""
    logger.finalize(status)
    if type(logger).__name__ == "WandbLogger":
        import wandb

        wandb.finish(exit_code=0 if status == "success" else 1)


def abort_logger(logger) -> None:
    """A run that stops with an error ends its logger's run as failed (a wandb run left open would be
    reused by the next wandb.init in the same process)."""
    if logger:
        end_logger(logger, "failed")
