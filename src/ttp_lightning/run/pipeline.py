"""One run: data -> pretrain A(D) (cached) -> method -> evaluation -> assessment (run/assessment.py: attacks,
every forget image, the release gate) -> results.json + table."""

import copy
import hashlib
import json
import logging
import shutil
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only

from ttp_lightning.assess.evaluation import evaluate, forget_softmax
from ttp_lightning.assess.frontier import format_frontier
from ttp_lightning.assess.protection import GateSettings
from ttp_lightning.attacks import build_suite
from ttp_lightning.certified.certificate.document import AUDIT_FILE, PRIVATE_DIR, write_release
from ttp_lightning.config.allowlist import data_spec, model_spec
from ttp_lightning.config.build import Node
from ttp_lightning.config.schema import MainSchema, plain
from ttp_lightning.core.console import wrapped
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.core.files import supersede_outputs
from ttp_lightning.core.words import RESULTS_FORMAT
from ttp_lightning.data import build_datamodule
from ttp_lightning.fit.checkpointing import remove as remove_checkpoints
from ttp_lightning.fit.pretraining import (
    absorb_outside_forget,
    cache_key,
    model_file,
    pretrained_model,
    retrained_model,
)
from ttp_lightning.fit.progress import quiet_lightning
from ttp_lightning.fit.training import RunContext, choose_threads, denormals_flushed, multiply_accumulates
from ttp_lightning.models.components import build_classifier
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
    format_noise_free_line,
    format_per_image_table,
    format_table,
    gate_summary,
    per_image_title,
    write_results,
    write_weights,
)
from ttp_lightning.reporting.run_logger import (
    abort_logger,
    build_logger,
    finish_logger,
    route_lightning_logs_to_hydra,
)
from ttp_lightning.reporting.tables import method_label
from ttp_lightning.run.assessment import Assessment, assess, run_relearn_sources
from ttp_lightning.run.record import Release, RunRecord, StageMetrics, Weights
from ttp_lightning.run.validation import Validated, build_method, validate

log = logging.getLogger(__name__)


def is_global_zero() -> bool:
    """Rank 0 (or the only process): the one that evaluates, writes and prints."""
    return rank_zero_only.rank == 0


def identity(settings: MainSchema, datamodule) -> dict:
    """What a certificate needs to rebuild the data and the model from registered configs (typed settings,
    never a _target_), and the forget set's fingerprint."""
    return {
        "data": data_spec(settings.data), "model": model_spec(settings.model),
        "forget_fingerprint": datamodule.forget_fingerprint(), "forget_size": len(datamodule.forget_indices),
    }


def retrain_floor(settings: MainSchema, ctx: RunContext, datamodule, method, make_net, sources: dict
                  ) -> tuple | None:
    """(A(D_r), its cache record): a model retrained without the forget images (cached like A(D); every DDP rank
    trains it together), the relearning attack's floor; None when the floor is off, the method is retrain (A(D_r)
    itself), or there is nothing to finetune it on (no relearning `sources`: the attack is off, or none exists)."""
    if not settings.attacks.relearn.floor or method.name == "retrain" or not sources:
        return None
    net = make_net()
    return net, retrained_model(ctx, net, datamodule, is_global_zero)


def weights_changed(before, after) -> bool:
    """Whether the method's network differs from the pretrained one in any weight or buffer."""
    first, second = before.state_dict(), after.state_dict()
    return first.keys() != second.keys() or any(not torch.equal(first[k].cpu(), second[k].cpu()) for k in first)


def method_key(ctx: RunContext, method, datamodule) -> str:
    """What determines the method's fits: A(D) (data, model, pretraining incl. absorb_epochs, seed, every trainer
    setting), the forget set, the method's settings and every fit setting (FitSettings.identity); names their
    checkpoint folders."""
    identity = {"pretrained": cache_key(ctx, datamodule), "forget": datamodule.forget_fingerprint(),
                "method": {key: value for key, value in plain(method.settings).items() if key != "_target_"},
                "fit": ctx.fit_settings.identity()}  # every fit setting the method's fits read (the gate's threshold too)
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:24]


def publish(record: RunRecord, results: dict, net, settings: MainSchema, datamodule, attack_table, certificate_line,
            output_dir) -> Release:
    """The release folder the gate chose (release/ or release_not_protected/): model.safetensors, config.json,
    README.md (what a model hub takes). The card and config.json state what `results` (the record's JSON)
    states."""
    label = method_label(results)
    architecture = architecture_of(settings.model)
    certificate = record.weights.certificate
    folder = write_hub_release(net, output_dir, architecture, datamodule.info,
                               release_protection(results, label, settings),
                               model_card(results, label, attack_table, certificate_line, settings),
                               certified_file=None if certificate is None else certificate.last_weights,
                               folder_name=record.gate.folder)
    return Release(folder=folder.name, files=(WEIGHTS, CONFIG, CARD), loadable=architecture is not None,
                   protected=record.gate.passed)


def run(cfg: Node, output_dir: str) -> RunRecord | None:
    """Execute one job; returns its record on rank 0 (results.json is its `to_json()`; None on other DDP ranks).
    The composed `cfg` is checked once (run.validation.validate): the typed settings the stages read, the record of
    the run (results.json's `config`, the logger's hyperparameters, the run's name) and the logger's config; the
    raw config goes no further."""
    route_lightning_logs_to_hydra()
    quiet_lightning()
    validated = validate(cfg)  # every value checked once, as typed objects (config.schema.MainSchema)
    # before the data is loaded: torch's worker threads take the mode when they start and keep it after
    with denormals_flushed(validated.settings.performance.flush_denormals):
        return _job(validated, output_dir)


def _job(validated: Validated, output_dir: str) -> RunRecord | None:
    """run()'s job from its checked settings: the data, the method, the logger, then the stages."""
    settings, record, identity = validated.settings, validated.record, validated.identity
    method = build_method(settings)  # from method._target_, given its typed settings; checks its own
    attacks = build_suite(settings.attacks.suite) if settings.attacks.enabled else {}  # conf/attack, by _target_
    datamodule = build_datamodule(settings.data)
    gate = validated.gate
    gate.check(datamodule.info.num_classes, settings.attacks.enabled,
               tuple(name for name, attack in attacks.items() if not attack.random))
    method.check_data(datamodule)

    def make_net():
        L.seed_everything(settings.seed, workers=True, verbose=False)
        return build_classifier(settings.model, datamodule.info)

    ctx = RunContext.of(settings, logger=build_logger(validated.logger, record, identity), output_dir=output_dir,
                        identity=identity)
    try:
        return _stages(settings, record, ctx, method, attacks, datamodule, make_net, gate)
    except BaseException:
        abort_logger(ctx.logger)
        raise


def _stages(settings: MainSchema, record: dict, ctx: RunContext, method, attacks: dict, datamodule, make_net,
            gate: GateSettings) -> RunRecord | None:
    """pretrain (cached) -> method -> evaluation, attacks -> results.json (`record`: the resolved config),
    release, table, logger."""
    output_dir = ctx.output_dir
    pretrained, original, pretrain_info = _starting_models(settings, ctx, datamodule, make_net, gate, method)
    ctx = ctx.keyed(method_key(ctx, method, datamodule))
    # the method draws from the global generators (robust Alg 1's inner attack): seeded here, so its steps do not
    # depend on whether A(D) was trained in this process or read from the cache
    L.seed_everything(settings.seed, workers=True, verbose=False)
    output = method.run(ctx, pretrained, datamodule, make_net)
    # every rank evaluates its share (trainer.validate); rank 0 then attacks, writes and prints
    exposed_above = ctx.fit_settings.exposed_above
    metrics = {"pretrain_original": StageMetrics(evaluate(original, datamodule, settings.trainer, exposed_above))} \
        if original is not None else {}
    metrics["pretrain"] = StageMetrics(evaluate(pretrained, datamodule, settings.trainer, exposed_above), pretrain_info)
    metrics[method.name] = StageMetrics(evaluate(output.net, datamodule, settings.trainer, exposed_above),
                                        {**output.metrics, "weights_changed": weights_changed(pretrained, output.net)})
    sources = run_relearn_sources(settings.attacks, datamodule)
    floor = retrain_floor(settings, ctx, datamodule, method, make_net, sources)
    if not is_global_zero():
        return None
    softmax = {"pretrain": forget_softmax(pretrained, datamodule), method.name: forget_softmax(output.net, datamodule)}
    models = {"pretrain": pretrained, method.name: output.net}
    assessment = assess(models, method.name, metrics["pretrain"].evaluation["forget_conf_dist"],
                        metrics[method.name].reported, datamodule, settings.attacks, attacks, sources, floor,
                        settings.bounds, gate, output.history, test_cost(metrics["pretrain"], metrics[method.name]))
    partial = _run_record(settings.experiment_name, method.name, record, datamodule, metrics, output.history, ctx,
                          softmax, assessment)
    try:  # a full disk or a lost mount while writing: one line, and no output of this run left half-made
        run_record, results, path, attack_table, certificate_line = _write_outputs(partial, output, settings,
                                                                                   datamodule, output_dir)
    except OSError as exc:
        _remove_outputs(Path(output_dir))
        where = f": {exc.filename}" if exc.filename else ""
        raise TTPUserError(f"writing the run's outputs into {output_dir} failed ({exc.strerror or exc}{where}); "
                           "nothing of this run was kept there (its caches were: rerun when there is room)") from None
    print(_console_summary(settings.experiment_name, results, attack_table, certificate_line, path), flush=True)
    finish_logger(ctx.logger, results, output_dir)
    remove_checkpoints(ctx.journal.checkpoint_dirs)  # the results are written: a rerun starts afresh
    return run_record


def test_cost(before: StageMetrics, after: StageMetrics) -> float | None:
    """The test-accuracy points the method cost (None without a test split)."""
    start, end = before.evaluation.get("test_acc"), after.evaluation.get("test_acc")
    return None if start is None or end is None else round(100.0 * (start - end), 2)


def _run_record(experiment: str, method: str, record: dict, datamodule, metrics: dict, history: list,
                ctx: RunContext, softmax: dict, assessment: Assessment) -> RunRecord:
    """The run's record before its weights are written: what ran, on which data and forget set, each stage's
    metrics and the assessment."""
    data = {"train_size": len(datamodule.train_labels), "test_size": len(datamodule.test_labels),
            "forget_size": len(datamodule.forget_indices), "forget_from_test": datamodule.outside_forget_count,
            "forget_fingerprint": datamodule.forget_fingerprint(), "forget_set_digest": datamodule.forget_set_digest(),
            **datamodule.forget_record()}
    if len(datamodule.val_labels):  # the user's own validation images (an image folder's val/) or those withheld
        data["val_size"] = len(datamodule.val_labels)
        data["val_source"] = datamodule.val_source
    # resumed: stage -> the epoch a rerun resumed after (wall times cover this process); run: name, wandb group
    # (the sweep), job type, this job's swept values
    return RunRecord(format=RESULTS_FORMAT, experiment=experiment, method=method, config=record, data=data,
                     metrics=metrics, history={method: history}, resumed=dict(ctx.journal.resumed), run=ctx.identity,
                     forget_softmax=softmax, assessment=assessment)


def _starting_models(settings: MainSchema, ctx: RunContext, datamodule, make_net, gate: GateSettings, method):
    """(A(D), A(D) before it absorbed outside forget instances or None, pretraining's record); the output folder's
    earlier outputs moved aside once every setting holds; the images the method's rules read accuracy on taken
    out of D first where this run trains A(D) (Method.hold_out)."""
    pretrained = make_net()
    gate.check_network(pretrained, datamodule.info.channels, datamodule.info.image_size,
                       float(settings.bounds.max_radius))
    if is_global_zero():  # every setting holds: from here on the folder's outputs are this run's
        moved = supersede_outputs(ctx.output_dir, OUTPUTS)
        if moved is not None:
            log.warning("%s held an earlier run's outputs; moved them to %s, so that what the folder holds is this "
                        "run's", ctx.output_dir, moved)
    choose_threads(settings, multiply_accumulates(pretrained, datamodule.info.channels, datamodule.info.image_size))
    method.hold_out(datamodule, pretrains=model_file(ctx, "checkpoint") is None)
    pretrain_info = pretrained_model(ctx, pretrained, datamodule, is_global_zero)
    original = None
    if datamodule.outside_forget_count:  # D_f from outside D: A(D) learns those instances first
        original = copy.deepcopy(pretrained)
        pretrain_info.update(absorb_outside_forget(ctx, pretrained, datamodule, is_global_zero))
    return pretrained, original, pretrain_info


def _console_summary(experiment: str, results: dict, attack_table: str | None, certificate_line: str | None,
                     path) -> str:
    """What a run prints at its end: the stage table, the per-image table, the attacks, the certificate and the
    theta rule's verdict (certified methods), the release gate's verdict and where results.json is."""
    metrics, method = results["metrics"], results["method"]
    checks = (results.get("attack_checks") or {}).get(method)
    attacks = f"\n\nattacks on the forget set\n{attack_table}" if attack_table else ""
    certified = f"\n{certificate_line}\n{format_noise_free_line(results['noise_free'])}" if certificate_line else ""
    rule = metrics[method].get("theta_rule")
    certified += f"\n{rule['verdict']}" if rule else ""
    certified = wrapped(certified) if certified else ""
    per_image = f"\n\n{per_image_title(results)}\n{format_per_image_table(metrics, results['release_gate'])}"
    price = f"\n{format_frontier(results['frontier'])}" if "frontier" in results else ""
    return (f"\n{experiment} / {method}\n{format_table(metrics)}{per_image}{attacks}{certified}\n"
            f"{gate_summary(results['release_gate'], results['data']['forget_size'], checks)}{price}\nresults: {path}")


OUTPUTS = ("model.pt", "release", "release_not_protected", PRIVATE_DIR, "figures", "results.json")


def _remove_outputs(output_dir: Path) -> None:
    for name in OUTPUTS:
        target = output_dir / name
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)


# measured on private, noise-free weights (the theta rule's probes of M_theta(D)): results.json keeps them for the
# provider; a certificate never publishes them
PRIVATE_METRICS = ("theta_rule",)


def public_metrics(values: dict) -> dict:
    return {key: value for key, value in values.items() if key not in PRIVATE_METRICS}


def _write_outputs(partial: RunRecord, output, settings: MainSchema, datamodule, output_dir: str):
    """The certificate (certified methods), the weights, the release folder and results.json, in that order;
    returns (the run's record, results.json's content and path, the attack table, the certificate line). Each step
    adds its part to a new record; none edits what an earlier one built."""
    run_record = partial.with_weights(_weights_record(partial, output, settings, datamodule, output_dir))
    results = run_record.to_json()
    attack_table = format_attack_table(results["attacks"], results["proven"], results.get("relearn"),
                                       results.get("relearn_floor")) \
        if "attacks" in results else None
    certificate_line = format_certificate_line(results["certificate"], settings.method.vacuous_above) \
        if "certificate" in results else None
    run_record = run_record.published(publish(run_record, results, output.net, settings, datamodule, attack_table,
                                              certificate_line, output_dir))
    results = run_record.to_json()
    path = write_results(results, output_dir)
    return run_record, results, path, attack_table, certificate_line


def _weights_record(partial: RunRecord, output, settings: MainSchema, datamodule, output_dir: str) -> Weights:
    """A certified release's certificate (as written, what the verifier reads), its weights and audit files and
    noise-free scores; else where publish() writes the weights (and the raw state_dict if asked)."""
    folder = partial.gate.folder
    if output.release is not None:
        certificate = {**output.release.certificate, "experiment": settings.experiment_name,
                       **identity(settings, datamodule), "metrics": public_metrics(partial.stage_json(partial.method))}
        written = write_release(certificate, output.release.states, output.release.audit, output_dir, folder)
        return Weights(weights_file=f"{folder}/{written.last_weights}", certificate=written,
                       audit_file=f"{PRIVATE_DIR}/{AUDIT_FILE}", noise_free=output.release.noise_free)
    state_dict_file = None
    if settings.state_dict:  # asked for: the raw state_dict too
        weights = write_weights(output.net, Path(output_dir) / ("" if partial.gate.passed else folder))
        state_dict_file = str(weights.relative_to(output_dir))
    return Weights(weights_file=f"{folder}/{WEIGHTS}", state_dict_file=state_dict_file)  # publish() writes it
