"""Algs 2-4 as one procedure: warm-up (optional Alg 1) -> start weights w* -> noise-free Newton step(s)
(newton.py) -> Delta from the stated and measured constants -> sigma for the budget -> secret noise ->
BatchNorm statistics from D_r -> a release (public weights + certificate, private audit record)."""

import copy
import dataclasses
import logging
import time
from dataclasses import dataclass, field

from torch import nn

from ttp_lightning.alg1.method import finetune
from ttp_lightning.assess.evaluation import evaluate
from ttp_lightning.certified import theta
from ttp_lightning.certified.certificate.arithmetic import (
    ESTIMATOR,
    EXACT,
    ONLINE,
    implied_global_norm_bound,
    is_vacuous,
    recomputed_sensitivity,
)
from ttp_lightning.certified.maths import newton
from ttp_lightning.certified.maths.hvp import refresh_batchnorm
from ttp_lightning.certified.maths.newton import ESTIMATED, NewtonPath, noised_states, resolve_lam
from ttp_lightning.certified.maths.reductions import temperature_rule
from ttp_lightning.certified.maths.residual_step import forget_reduction, mu_of, select_certified_layers
from ttp_lightning.certified.module import CertifiedStepModule, quiet_no_optimizer
from ttp_lightning.certified.schema import CertifiedSchema
from ttp_lightning.core.inference import eval_device
from ttp_lightning.core.nn_modes import trainable
from ttp_lightning.data.datamodule import TTPDataModule
from ttp_lightning.dp.mechanism import implied_epsilon, noise_sigma
from ttp_lightning.fit.training import RunContext, fit
from ttp_lightning.methods.output import CertifiedRelease, MethodOutput
from ttp_lightning.models.optim import project_to_norm_ball

log = logging.getLogger(__name__)

KINDS = {EXACT: newton.EXACT, ESTIMATOR: ESTIMATED, ONLINE: ESTIMATED}  # algorithm -> how the step is solved


@dataclass
class Prepared:
    """The model at the start of the Newton step(s) and what the warm-up produced."""

    net: nn.Module
    history: list = field(default_factory=list)
    warmup_wall_s: float = 0.0
    has_batchnorm: bool = False


def warm_start(ctx: RunContext, cfg: CertifiedSchema, pretrained: nn.Module, datamodule: TTPDataModule) -> Prepared:
    """A copy of A(D) after `method.warmup_epochs` of Alg 1, projected onto the C-ball (the bounds assume
    ||w*|| <= C), on the device the Newton step runs on, with BatchNorm statistics from the retain set so the
    curvature is that of one fixed function (the released statistics are recomputed after the noise)."""
    prepared = Prepared(copy.deepcopy(pretrained))
    if cfg.warmup_epochs:
        warm = finetune(ctx, prepared.net, datamodule, cfg, cfg.warmup_epochs, stopping=None, label="warmup")
        prepared = Prepared(warm.net, warm.history, warm.metrics["wall_s"])
    project_to_norm_ball(prepared.net, ctx.fit_settings.pretrain.norm_bound, ctx.fit_settings.pretrain.projection)
    select_certified_layers(prepared.net, cfg.layers, cfg.bound)
    prepared.net.to(eval_device())
    prepared.has_batchnorm = refresh_batchnorm(prepared.net, datamodule.dataset("retain"), cfg.chunk_size)
    return prepared


def release_model(cfg: CertifiedSchema, algorithm: str) -> str:
    return cfg.release if algorithm == ONLINE else "single"


def stated_constants(ctx: RunContext, cfg: CertifiedSchema, algorithm: str, net: nn.Module) -> dict:
    """The hyperparameters a certificate states (before the measured constants and the noise)."""
    pretrain = ctx.fit_settings.pretrain
    names = [name for name, p in net.named_parameters() if p.requires_grad]
    residual = cfg.bound == "residual"
    mu, mu_rule = mu_of(cfg, resolve_lam(cfg)) if residual else (None, None)
    constants = {
        "algorithm": algorithm, "bound": cfg.bound, "layers": cfg.layers, "mu": mu, "mu_rule": mu_rule,
        "theta": float(cfg.theta), "lam": resolve_lam(cfg), "lam_min_stated": float(cfg.lam_min),
        "uniformity": cfg.uniformity, "forget_temperature": float(cfg.forget_temperature),
        "forget_reduction": dataclasses.asdict(forget_reduction(cfg)),
        "hessian_lipschitz_forget": float(cfg.hessian_lipschitz_forget),
        "hessian_lipschitz_retain": float(cfg.hessian_lipschitz_retain),
        "grad_lipschitz_forget": float(cfg.grad_lipschitz_forget),
        "grad_lipschitz_retain": float(cfg.grad_lipschitz_retain),
        "norm_bound": implied_global_norm_bound(float(pretrain.norm_bound), pretrain.projection, len(names)),
        "norm_bound_config": float(pretrain.norm_bound), "projection": pretrain.projection,
        "delta": float(cfg.delta), "warmup_epochs": int(cfg.warmup_epochs),
        "release_model": release_model(cfg, algorithm),
        "num_params": sum(p.numel() for p in trainable(net)), "parameter_names": names,
        "chunk_size": int(cfg.chunk_size), "max_exact_params": int(cfg.max_exact_params),
        "lanczos_iterations": int(cfg.lanczos_iterations), "spectrum_margin": float(cfg.spectrum_margin),
        "estimator": None,
    }
    if KINDS[algorithm] == ESTIMATED and not residual:
        constants["estimator"] = {
            "scale_config": None if cfg.scale is None else float(cfg.scale), "scale_margin": float(cfg.scale_margin),
            "depth_config": None if cfg.depth == "auto" else int(cfg.depth), "repeats": int(cfg.repeats),
            "sample_size": int(cfg.sample_size), "estimator_seed": int(cfg.estimator_seed), "max_residual": float(cfg.max_residual)}
    return constants


def measured_constants(certificate: dict, path: NewtonPath) -> dict:
    """G the largest gradient norm over the steps; for bound=paper also lambda_min = min(stated, measured)
    and ||H|| the worst over the steps (bound=residual measures no spectrum)."""
    steps = path.steps
    measured = {"lam_min": None, "hessian_norm": None, "gradient_bound": max(s["gradient_norm"] for s in steps),
                "steps": steps}
    if certificate["bound"] == "paper":
        measured["lam_min"] = min(certificate["lam_min_stated"], min(s["lam_min_measured"] for s in steps))
        measured["hessian_norm"] = max(s["hessian_norm_measured"] for s in steps)
    return {**certificate, **measured}


def calibrate_noise(cfg: CertifiedSchema, certificate: dict) -> dict:
    """Delta from the certificate's constants, then sigma for the (epsilon, delta) budget over the releases
    that compose, or the epsilon that a configured sigma implies."""
    sensitivity, formula = recomputed_sensitivity(certificate)
    certificate = {**certificate, "sensitivity_formula": formula}
    releases = len(certificate["steps"]) if certificate["release_model"] == "each" else 1
    if cfg.sigma is None:
        sigma, mechanism = noise_sigma(sensitivity, cfg.epsilon, cfg.delta, releases)
        noise = {"sigma": sigma, "epsilon": float(cfg.epsilon), "mechanism": mechanism, "sigma_source": "budget"}
    else:
        epsilon, mechanism = implied_epsilon(sensitivity, cfg.sigma, cfg.delta, releases)
        noise = {"sigma": float(cfg.sigma), "epsilon": epsilon, "mechanism": mechanism, "sigma_source": "config"}
    return {**certificate, "sensitivity": sensitivity, "releases": releases, **noise}


NOISE_FREE_KEYS = ("test_acc", "test_conf_dist", "forget_acc", "forget_conf_dist", "forget_worst_conf_dist")


def noise_free_evaluation(net: nn.Module, datamodule: TTPDataModule) -> dict:
    """The last noise-free model's scores, beside the release's (private: they are not covered by the noise)."""
    scores = evaluate(copy.deepcopy(net).float(), datamodule)
    return {key: scores[key] for key in NOISE_FREE_KEYS if key in scores}


def bound_metrics(certificate: dict, path: NewtonPath, algorithm: str, cfg: CertifiedSchema) -> dict:
    """results.json's view of what the bound rests on: the stationarity measurements (residual) or the
    spectrum and the Newton residual (paper)."""
    steps, last = path.steps, path.steps[-1]
    if certificate["bound"] == "residual":
        return {"mu": certificate["mu"], "stationarity": max(s["stationarity"] for s in steps),
                "ball_multiplier": last["multiplier"], "rounding_floor": max(s["rounding_floor"] for s in steps),
                "solver_newton_iterations": sum(s["newton_iterations"] for s in steps),
                "solver_hessian_products": sum(s["hessian_products"] for s in steps),
                "certified_weights_norm": last["weights_norm"]}
    return {"newton_residual": max(s["residual"] for s in steps),
            "lam_min_measured": min(s["lam_min_measured"] for s in steps),
            "lam_min": certificate["lam_min"], "hessian_norm": certificate["hessian_norm"],
            "norm_before_projection": last["norm_before_projection"],
            "sensitivity_formula": certificate["sensitivity_formula"],
            **({"scale_J": last["scale"], "depth_n": last["depth"], "repeats_b": int(cfg.repeats)}
               if KINDS[algorithm] == ESTIMATED else {})}


def request_parts(datamodule: TTPDataModule, algorithm: str) -> list:
    """(retain, forget) per Newton step: one for Algs 2-3, one per forget request for Alg 4."""
    if algorithm == ONLINE:
        return [datamodule.request_parts(i) for i in range(1, len(datamodule.forget_requests) + 1)]
    return [(datamodule.dataset("retain"), datamodule.dataset("forget"))]


def newton_steps(ctx: RunContext, cfg: CertifiedSchema, net: nn.Module, parts: list, algorithm: str) -> CertifiedStepModule:
    """The Newton step(s) through Lightning (one training step each, sharded under DDP) and the noise seed."""
    module = CertifiedStepModule(net, parts, cfg, KINDS[algorithm], float(ctx.fit_settings.pretrain.norm_bound),
                                 ctx.fit_settings.pretrain.projection)
    with quiet_no_optimizer():
        fit(ctx, module, max_epochs=1, stage="certified step", guard=False)
    return module


def resolved(ctx: RunContext, cfg: CertifiedSchema, datamodule: TTPDataModule) -> CertifiedSchema:
    """The settings with `forget_reduction_temperature=auto` replaced by its rule's value (from the number of
    classes, the release gate's threshold and the forget set's size: certified.maths.reductions.temperature_rule)."""
    if cfg.forget_reduction_temperature != "auto":
        return cfg
    temperature = temperature_rule(datamodule.info.num_classes, gate_threshold(ctx), len(datamodule.dataset("forget")))
    return dataclasses.replace(cfg, forget_reduction_temperature=temperature)


def gate_threshold(ctx: RunContext) -> float:
    """The release gate's CD threshold (release_gate.conf_dist_at_most), which the temperature and theta rules aim
    at; a run always states it (training.FitSettings.of)."""
    if ctx.fit_settings.exposed_above is None:
        raise ValueError("the certified learners need the release gate's threshold (FitSettings.exposed_above)")
    return float(ctx.fit_settings.exposed_above)


def chosen_theta(ctx: RunContext, cfg: CertifiedSchema, prepared: Prepared, datamodule: TTPDataModule):
    """`method.theta=auto`: the settings at the rule's theta and the rule's record (None for a fixed theta)."""
    if cfg.theta != "auto":
        return cfg, None
    choice = theta.choose(cfg, prepared.net, datamodule, float(ctx.fit_settings.pretrain.norm_bound),
                          gate_threshold(ctx))
    line = theta.verdict_line(choice, datamodule.forget_ids())
    log.info(line)
    return theta.chosen_settings(cfg, choice), {**choice.record(), "verdict": line}


def run_certified(ctx: RunContext, cfg: CertifiedSchema, pretrained: nn.Module, datamodule: TTPDataModule,
                  algorithm: str) -> MethodOutput:
    """Algs 2-4 with the method's settings `cfg` (`algorithm` chooses the step)."""
    cfg = resolved(ctx, cfg, datamodule)
    prepared = warm_start(ctx, cfg, pretrained, datamodule)
    cfg, theta_rule = chosen_theta(ctx, cfg, prepared, datamodule)
    start_state = {k: v.detach().cpu().clone() for k, v in prepared.net.state_dict().items()}
    certificate = stated_constants(ctx, cfg, algorithm, prepared.net)
    parts = request_parts(datamodule, algorithm)
    start = time.perf_counter()
    step = newton_steps(ctx, cfg, prepared.net, parts, algorithm)
    path = step.path
    newton_wall = time.perf_counter() - start
    certificate = calibrate_noise(cfg, measured_constants(certificate, path))
    each = certificate["release_model"] == "each"
    noise_free = path.noise_free if each else path.noise_free[-1:]
    retain_sets = [retain for retain, _ in parts] if each else [parts[-1][0]]
    seed = step.noise_seed
    noise_free_scores = noise_free_evaluation(prepared.net, datamodule)
    states = noised_states(prepared.net, noise_free, certificate["sigma"], seed, retain_sets, cfg.chunk_size)
    certificate["batchnorm"] = "recomputed_on_retain_after_noise" if prepared.has_batchnorm else "none"
    last = path.steps[-1]
    metrics = {
        "wall_s": round(prepared.warmup_wall_s + time.perf_counter() - start, 3),
        "warmup_wall_s": prepared.warmup_wall_s, "newton_wall_s": round(newton_wall, 3),
        "newton_step_norm": last["step_norm"], "gradient_norm": certificate["gradient_bound"],
        "bound": cfg.bound, "layers": cfg.layers,
        **(bound_metrics(certificate, path, algorithm, cfg)),
        **{k: v for extras in path.extras for k, v in extras.items()},
        "batchnorm_refreshed": prepared.has_batchnorm, "releases": certificate["releases"],
        "curvature_images_per_rank": step.instances, "ranks": step.world_size,
        **{key: certificate[key] for key in ("sensitivity", "sigma", "epsilon", "mechanism")},
        "vacuous": is_vacuous(certificate["epsilon"], cfg.vacuous_above),
        **({"theta": cfg.theta, "theta_rule": theta_rule} if theta_rule is not None else {}),
    }
    history = prepared.history
    if algorithm == ONLINE:
        history = [{"request": i, **s} for i, s in enumerate(path.steps, 1)]
    release = CertifiedRelease(certificate, states, {"noise_seed": seed, "start_state": start_state,
                                                     "noise_free": noise_free}, noise_free_scores)
    return MethodOutput(prepared.net, metrics, history, release=release)
