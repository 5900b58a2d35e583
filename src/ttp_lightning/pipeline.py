"""One run: data -> pretrain A(D) (cached) -> method -> evaluation -> results.json + table."""

import copy
import hashlib
import json
import logging

import hydra
import lightning as L
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from ttp_lightning.attacks import WORST, evaluate_attacks
from ttp_lightning.certify.certificate import AUDIT_FILE, PRIVATE_DIR, RELEASE_DIR, write_release
from ttp_lightning.certify.schema import data_spec, model_spec
from ttp_lightning.checkpointing import remove as remove_checkpoints
from ttp_lightning.data import build_datamodule
from ttp_lightning.evaluation import forget_softmax, predictions
from ttp_lightning.models.components import build_classifier
from ttp_lightning.models.evaluation import evaluate
from ttp_lightning.pretraining import absorb_outside_forget, cache_key, pretrained_model
from ttp_lightning.progress import quiet_lightning
from ttp_lightning.release import (
    CARD,
    CONFIG,
    WEIGHTS,
    architecture_of,
    model_card,
    release_protection,
    write_hub_release,
)
from ttp_lightning.reporting.results import (
    format_attack_table,
    format_certificate_line,
    format_table,
    write_results,
    write_weights,
)
from ttp_lightning.reporting.run_identity import flat_config, run_identity
from ttp_lightning.reporting.tables import METHOD_LABELS
from ttp_lightning.reporting.wandb_charts import log_run_charts
from ttp_lightning.training import RunContext, choose_threads, multiply_accumulates
from ttp_lightning.validation import validate_config

log = logging.getLogger(__name__)


def is_global_zero() -> bool:
    """Rank 0 (or the only process): the one that evaluates, writes and prints."""
    return rank_zero_only.rank == 0


def route_lightning_logs_to_hydra() -> None:
    """Lightning's own console handler would print every message twice next to Hydra's root handlers."""
    lightning_logger = logging.getLogger("lightning")
    for handler in list(lightning_logger.handlers):
        lightning_logger.removeHandler(handler)


def is_wandb(logger_cfg) -> bool:
    return str(logger_cfg.get("_target_", "")).endswith("WandbLogger")


def build_logger(cfg: DictConfig, identity: dict):
    """The configured Lightning logger (False for `logger=none`), holding the resolved config as flat
    hyperparameters (wandb.config; the CSV logger's hparams.yaml). A wandb run is named after the swept
    values, grouped by sweep, with the method as job type."""
    if not cfg.get("logger"):
        return False
    extra = {k: identity[k] for k in ("name", "group", "job_type")} if is_wandb(cfg.logger) else {}
    logger = hydra.utils.instantiate(cfg.logger, **extra)
    logger.log_hyperparams(flat_config(cfg))
    return logger


def run_figures(results: dict, output_dir: str) -> list:
    """The run's figures (dynamics, softmax bars, attack curves) in <output_dir>/figures; none without
    matplotlib (the `plots` extra)."""
    from pathlib import Path

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
    if type(logger).__name__ == "WandbLogger":  # final values are the run's summary, not one-point charts
        logger.experiment.summary.update(flat)
        log_run_charts(logger.experiment, results, run_figures(results, output_dir))
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


def identity(cfg: DictConfig, datamodule) -> dict:
    """What a certificate needs to rebuild the data and the model from registered configs (typed settings,
    never a _target_), and the forget set's fingerprint."""
    return {
        "data": data_spec(cfg.data), "model": model_spec(cfg.model),
        "forget_fingerprint": datamodule.forget_fingerprint(), "forget_size": len(datamodule.forget_indices),
    }


def attack_models(results: dict, models: dict, datamodule, cfg: DictConfig) -> None:
    """The attack evaluation of each stage's model on the forget set: results["attacks"] (scores),
    results["attack_checks"] and, in each stage's metrics, forget_robust_conf_dist (the worst attack at
    `robust_gamma`). Attackers aim for the pretrained model's predictions and must restore its forget CD."""
    forget = datamodule.dataset("forget")
    targets = predictions(models["pretrain"], forget)
    reference = results["metrics"]["pretrain"]["forget_conf_dist"]
    results["attacks"], results["attack_checks"] = {}, {}
    for stage, net in models.items():
        evaluation = evaluate_attacks(net, forget, cfg, targets=targets, reference_conf_dist=reference)
        results["attacks"][stage], results["attack_checks"][stage] = evaluation["scores"], evaluation["checks"]
        robust = evaluation["scores"][WORST][f"{float(cfg.robust_gamma):g}"]  # validated: one of the gammas
        results["metrics"][stage]["forget_robust_conf_dist"] = robust["forget_conf_dist"]


def method_key(ctx: RunContext, datamodule) -> str:
    """What determines the method's fits: A(D) (data, model, pretraining incl. absorb_epochs, seed, process
    layout), the forget set, and the method's settings; names their checkpoint folders."""
    identity = {"pretrained": cache_key(ctx, datamodule), "forget": datamodule.forget_fingerprint(),
                "method": OmegaConf.to_container(ctx.method, resolve=True)}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def publish(results: dict, net, cfg: DictConfig, datamodule, attack_table, certificate_line, output_dir) -> dict:
    """release/: model.safetensors, config.json, MODEL_CARD.md (what a model hub takes); returns the
    results' record of it."""
    label = METHOD_LABELS.get(cfg.method.name, cfg.method.name)
    architecture = architecture_of(cfg.model)
    folder = write_hub_release(net, output_dir, architecture, datamodule.info, release_protection(results, label),
                               model_card(results, label, attack_table, certificate_line),
                               certified_file=results["certificate"]["weights"][-1]["file"]
                               if "certificate" in results else None)
    return {"folder": folder.name, "files": [WEIGHTS, CONFIG, CARD], "loadable": architecture is not None}


def run(cfg: DictConfig, output_dir: str) -> dict | None:
    """Execute one job; returns the results dict on rank 0 (None on other DDP ranks)."""
    route_lightning_logs_to_hydra()
    quiet_lightning()
    method = validate_config(cfg)  # builds the method from cfg.method._target_ and checks its settings
    datamodule = build_datamodule(cfg.data)

    def make_net():
        L.seed_everything(cfg.seed, workers=True, verbose=False)
        return build_classifier(cfg.model, datamodule.info)

    identity = run_identity(cfg)
    ctx = RunContext.from_config(cfg, logger=build_logger(cfg, identity), output_dir=output_dir)
    ctx.identity = identity
    try:
        return _stages(cfg, ctx, method, datamodule, make_net)
    except BaseException:
        abort_logger(ctx.logger)
        raise


def abort_logger(logger) -> None:
    """A run that stops with an error ends its logger's run as failed (a wandb run left open would be
    reused by the next wandb.init in the same process)."""
    if logger:
        end_logger(logger, "failed")


def _stages(cfg: DictConfig, ctx: RunContext, method, datamodule, make_net) -> dict | None:
    """pretrain (cached) -> method -> evaluation, attacks -> results.json, release, table, logger."""
    output_dir = ctx.output_dir
    pretrained = make_net()
    choose_threads(cfg, multiply_accumulates(pretrained, datamodule.info.channels, datamodule.info.image_size))
    pretrain_info = pretrained_model(ctx, pretrained, datamodule, is_global_zero)
    original = None
    if datamodule.outside_forget_count:  # D_f from outside D: A(D) learns those instances first
        original = copy.deepcopy(pretrained)
        pretrain_info.update(absorb_outside_forget(ctx, pretrained, datamodule, is_global_zero))

    ctx.run_key = method_key(ctx, datamodule)
    output = method.run(ctx, pretrained, datamodule, make_net)
    # every rank evaluates its share (trainer.validate); rank 0 then attacks, writes and prints
    metrics = {"pretrain_original": evaluate(original, datamodule, cfg.trainer)} if original is not None else {}
    metrics["pretrain"] = {**evaluate(pretrained, datamodule, cfg.trainer), **pretrain_info}
    metrics[cfg.method.name] = {**evaluate(output.net, datamodule, cfg.trainer), **output.metrics}
    if not is_global_zero():
        return None
    results = {
        "experiment": cfg.experiment_name,
        "method": cfg.method.name,
        "config": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "data": {"train_size": len(datamodule.train_labels), "test_size": len(datamodule.test_labels),
                 "forget_size": len(datamodule.forget_indices), "forget_from_test": datamodule.outside_forget_count,
                 "forget_fingerprint": datamodule.forget_fingerprint(), **datamodule.forget_record()},
        "metrics": metrics,
        "history": {cfg.method.name: output.history},
        "resumed": dict(ctx.resumed),
        "run": ctx.identity,  # name, wandb group (the sweep), job type, this job's swept values  # stage -> the epoch a rerun resumed after (wall times cover this process)
    }
    results["forget_softmax"] = {"pretrain": forget_softmax(pretrained, datamodule),
                                 cfg.method.name: forget_softmax(output.net, datamodule)}
    if cfg.attacks.enabled:
        log.info("attacking the forget set: %s at gamma %s/255", ", ".join(map(str, cfg.attacks.names)),
                 ", ".join(f"{float(g):g}" for g in cfg.attacks.gammas))
        attack_models(results, {"pretrain": pretrained, cfg.method.name: output.net}, datamodule, cfg.attacks)
    if output.release is not None:
        certificate = {**output.release.certificate, "experiment": cfg.experiment_name,
                       **identity(cfg, datamodule), "metrics": metrics[cfg.method.name]}
        cert_path = write_release(certificate, output.release.states, output.release.audit, output_dir)
        results["certificate"] = json.loads(cert_path.read_text())
        results["weights_file"] = f"{RELEASE_DIR}/{results['certificate']['weights'][-1]['file']}"
        results["audit_file"] = f"{PRIVATE_DIR}/{AUDIT_FILE}"
    else:
        results["weights_file"] = write_weights(output.net, output_dir).name
    attack_table = format_attack_table(results["attacks"]) if "attacks" in results else None
    certificate_line = format_certificate_line(results["certificate"], cfg.method.vacuous_above) \
        if "certificate" in results else None
    results["release"] = publish(results, output.net, cfg, datamodule, attack_table, certificate_line, output_dir)
    path = write_results(results, output_dir)
    attacks = f"\n\nattacks on the forget set\n{attack_table}" if attack_table else ""
    certified = f"\n{certificate_line}" if certificate_line else ""
    print(f"\n{cfg.experiment_name} / {cfg.method.name}\n{format_table(metrics)}{attacks}{certified}\nresults: {path}",
          flush=True)
    finish_logger(ctx.logger, results, output_dir)
    remove_checkpoints(ctx.checkpoint_dirs)  # the results are written: a rerun starts afresh
    return results
