"""Reproducing a certified release from the provider's private audit record (`verify --audit`).

From the record's start weights w*, the data (rebuilt from the certificate's registered names and typed
settings) and the certificate's constants, rerun the deterministic Newton step(s); compare what they
measure and produce with the certificate and the recorded noise-free weights; redraw the noise from the
secret seed and compare the result, after BatchNorm statistics from D_r, with the released files.
"""

import math
from pathlib import Path
from types import SimpleNamespace

import torch

from ttp_lightning.certified.certificate.document import (
    load_weights,
    noise_free_key,
    sha256_of_vector,
)
from ttp_lightning.certified.certificate.format import rebuild_configs
from ttp_lightning.certified.common import KINDS, request_parts
from ttp_lightning.certified.maths.newton import newton_path, noised_states
from ttp_lightning.certified.maths.residual_step import (
    final_linear,
    head_objective,
    mu_of,
    select_certified_layers,
    stationarity_record,
)
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.core.files import sha256_of
from ttp_lightning.core.inference import eval_device
from ttp_lightning.data import build_datamodule
from ttp_lightning.models.components import build_classifier

STEP_KEYS = ("gradient_norm", "lam_min_measured", "hessian_norm_measured", "residual", "step_norm", "scale")


def method_config(cert: dict) -> SimpleNamespace:
    """The method settings of the original run that the Newton step reads, from the certificate's typed fields
    (check_certificate_format checked them); the certificate is never turned into anything that is built."""
    settings = {key: cert[key] for key in (
        "bound", "layers", "theta", "lam", "uniformity", "forget_temperature", "grad_lipschitz_forget", "grad_lipschitz_retain",
        "hessian_lipschitz_forget", "hessian_lipschitz_retain", "chunk_size", "max_exact_params",
        "lanczos_iterations", "spectrum_margin")}
    reduction = cert["forget_reduction"]
    settings.update(lam_min=cert["lam_min_stated"], compare_exact=False, forget_reduction=reduction["name"],
                    forget_reduction_temperature=reduction["temperature"], forget_cvar_fraction=reduction["fraction"])
    estimator = cert["estimator"]
    if estimator is not None:
        settings.update(scale=estimator["scale_config"], scale_margin=estimator["scale_margin"],
                        depth="auto" if estimator["depth_config"] is None else estimator["depth_config"],
                        repeats=estimator["repeats"], sample_size=estimator["sample_size"],
                        estimator_seed=estimator["estimator_seed"], max_residual=estimator["max_residual"])
    return SimpleNamespace(**settings)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30)).item()


def _start_failures(net, cert: dict) -> list[str]:
    """||w*|| <= C: the bounds' hypothesis on the start weights, which only the audit can see."""
    params = dict(net.named_parameters())
    norms = [params[name].detach().double().norm().item() for name in cert["parameter_names"]]
    bound = cert["norm_bound_config"] * (1 + 1e-6)
    if cert["projection"] == "global":
        total = math.sqrt(sum(n * n for n in norms))
        return [] if total <= bound else [f"start weights: ||w*|| = {total:.6g} > C = {cert['norm_bound_config']:.6g}"]
    return [f"start weights: a tensor has norm {max(norms):.6g} > C"] if max(norms) > bound else []


class Mismatch(Exception):
    """The files do not describe the certified data and model (a check fails; not unusable input)."""


def rebuild_model(cert: dict, weights: Path, overrides: list[str]):
    """The certified data, rebuilt from registered configs and the verifier's data.* overrides, and the
    certified model with `weights` loaded. Raises Mismatch when the forget set's fingerprint differs or
    the weights do not fit the model."""
    data_cfg, model_cfg = rebuild_configs(cert["data"], cert["model"], overrides)
    datamodule = build_datamodule(data_cfg)
    if datamodule.forget_fingerprint() != cert["forget_fingerprint"]:
        raise Mismatch("the rebuilt forget set differs from the certified one (fingerprint mismatch)")
    net = build_classifier(model_cfg, datamodule.info)
    try:
        net.load_state_dict(load_weights(weights))
    except RuntimeError as exc:
        raise Mismatch(f"{weights.name} does not fit the certified model: {str(exc).splitlines()[0]}") from None
    return datamodule, net


def _matching_record(recorded: dict, audit: dict, index: int) -> torch.Tensor | None:
    """Release `index`'s recorded noise-free weights, or None when missing or not the ones the audit hashed."""
    stored = recorded.get(noise_free_key(index))
    if stored is None or sha256_of_vector(stored) != audit["noise_free_sha256"][index]:
        return None
    return stored


def remeasured_failures(cert: dict, net, parts: list, noise_free: list[torch.Tensor], tolerance: float) -> list[str]:
    """bound=residual: remeasure, with this code's own rules (mu, the rounding floor), the distance bound at
    each recorded noise-free point on the rebuilt data; fail where the certificate's bound is smaller."""
    settings = method_config(cert)
    try:
        mu, _ = mu_of(settings, cert["lam"])
    except TTPUserError as exc:  # a stated reduction or constant with no convexity rule: nothing to remeasure
        return [f"the audit cannot remeasure the bound: {exc}"]
    head = final_linear(net)
    failures = []
    steps = cert["steps"] if len(noise_free) == len(cert["steps"]) else cert["steps"][-1:]
    for i, (weights, (retain, forget), stated) in enumerate(zip(noise_free, parts, steps, strict=True), 1):
        objective = head_objective(net, head, settings, cert["lam"], retain, forget)
        measured = stationarity_record(objective, weights.double().cpu(), mu, cert["norm_bound"])
        if stated["distance_bound"] < measured["distance_bound"] * (1 - tolerance):
            failures.append(f"step {i}: the certificate's distance bound {stated['distance_bound']:.6g} is below the "
                            f"{measured['distance_bound']:.6g} remeasured at the noise-free weights (||r|| = "
                            f"{measured['stationarity']:.3g}, mu = {mu:.6g})")
        if cert["sensitivity"] < measured["distance_bound"] * (1 - tolerance):
            failures.append(f"Delta={cert['sensitivity']:.6g} is below the {measured['distance_bound']:.6g} that the "
                            f"audit remeasures")
    return failures


def rerun_failures(cert: dict, net, parts: list, recorded: dict, audit: dict, tolerance: float,
                   recorded_free: list) -> list[str]:
    """bound=paper: rerun the deterministic Newton step(s) and compare with the certificate and the recorded
    noise-free weights (appended to `recorded_free`, or the rerun where none matches the audit hash)."""
    failures = []
    path = newton_path(net, parts, method_config(cert), KINDS[cert["algorithm"]], cert["norm_bound_config"],
                       cert["projection"])
    for i, (rerun, stated) in enumerate(zip(path.steps, cert["steps"], strict=True), 1):
        for key in STEP_KEYS:
            if (rerun[key] is None) != (stated[key] is None) or (
                    rerun[key] is not None and abs(rerun[key] - stated[key]) > tolerance * max(abs(stated[key]), 1e-12)):
                failures.append(f"step {i}: {key} reruns to {rerun[key]}, the certificate says {stated[key]}")
        if rerun["depth"] != stated["depth"]:
            failures.append(f"step {i}: depth reruns to {rerun['depth']}, the certificate says {stated['depth']}")
    rerun_free = path.noise_free if cert["release_model"] == "each" else path.noise_free[-1:]
    for i, vector in enumerate(rerun_free):
        stored = _matching_record(recorded, audit, i)
        if stored is None:
            failures.append(f"release {i + 1}: no recorded noise-free weights matching the audit hash; comparing "
                            f"the rerun instead")
            stored = vector
        elif _relative(vector, stored) > tolerance:
            failures.append(f"release {i + 1}: the rerun Newton step differs from the recorded noise-free weights "
                            f"by {_relative(vector, stored):.3g} (relative l2) > {tolerance:g}")
        recorded_free.append(stored)
    return failures


def audit_failures(cert: dict, cert_path: Path, audit: dict, audit_dir: Path, weight_paths: list[Path],
                   overrides: list[str], tolerance: float) -> list[str]:
    if sha256_of(cert_path) != audit["certificate_sha256"]:
        return ["the audit record belongs to another certificate (certificate SHA-256 differs)"]
    if audit["weights_sha256"] != [entry["sha256"] for entry in cert["weights"]]:
        return ["the audit record names other weights than the certificate"]
    start_path, noise_free_path = audit_dir / audit["start_file"], audit_dir / audit["noise_free_file"]
    if sha256_of(start_path) != audit["start_sha256"]:
        return [f"{start_path.name}: SHA-256 differs from the audit record"]
    try:
        datamodule, net = rebuild_model(cert, start_path, overrides)
    except Mismatch as exc:
        return [str(exc)]
    failures = _start_failures(net, cert)
    net.to(eval_device())
    parts = request_parts(datamodule, cert["algorithm"])
    each = cert["release_model"] == "each"
    recorded = load_weights(noise_free_path) if noise_free_path.is_file() else {}
    select_certified_layers(net, cert["layers"], cert["bound"])
    recorded_free = []
    if cert["bound"] == "residual":
        for i in range(len(parts) if each else 1):
            stored = _matching_record(recorded, audit, i)
            if stored is None:
                return failures + [f"release {i + 1}: no recorded noise-free weights matching the audit hash"]
            recorded_free.append(stored)
        failures += remeasured_failures(cert, net, parts if each else parts[-1:], recorded_free, tolerance)
    else:
        failures += rerun_failures(cert, net, parts, recorded, audit, tolerance, recorded_free)
    retain_sets = [retain for retain, _ in parts] if each else [parts[-1][0]]
    expected = noised_states(net, recorded_free, cert["sigma"], audit["noise_seed"], retain_sets, cert["chunk_size"])
    for i, (state, path_i) in enumerate(zip(expected, weight_paths, strict=True), 1):
        released = load_weights(path_i)
        for name, value in state.items():
            if name not in released:
                failures.append(f"release {i}: {name} is missing from {path_i.name}")
            elif name in cert["parameter_names"] and not torch.equal(released[name], value):
                failures.append(f"release {i}: {name} is not the recorded noise-free weights plus the seed's noise")
            elif released[name].is_floating_point() and _relative(released[name], value) > tolerance:
                failures.append(f"release {i}: buffer {name} differs from BatchNorm statistics recomputed on D_r")
    return failures
