"""The certificate's and the audit record's formats (Algs 2-4): their typed fields, checked by the allowlist every
file from outside is read with (config/allowlist.py), and the data and model configs a certificate names,
rebuilt from this package's registered configs with the verifier's own data overrides."""

from ttp_lightning.certified.maths.residual import MU_RULES
from ttp_lightning.config.allowlist import (
    Check,
    FormatError,
    check_data_spec,
    check_model_spec,
    hex64,
    integer,
    list_of,
    metrics_map,
    model_settings,
    name,
    number,
    one_of,
    optional,
    record,
    weights_file,
)
from ttp_lightning.config.build import ConfigError, Node, Part, compose_main, resolve, set_value
from ttp_lightning.config.schema import Algorithm

CERTIFICATE_FORMAT = "ttp_lightning.certificate/4"
AUDIT_FORMAT = "ttp_lightning.audit/1"
ALGORITHMS = tuple(algorithm.value for algorithm in Algorithm)  # method.algorithm's choices (config.schema)


def rebuild_configs(data: dict, model: dict, overrides: list[str]) -> tuple[Node, Part]:
    """Data and model (its Part) configs composed from this package's registered configs, the checked settings of
    the specs (typed values, set as values, never parsed) and the verifier's own data.* overrides."""
    data, model = check_data_spec(data), check_model_spec(model)
    if data["forget"]["from_file"] and not any(o.startswith(("data.forget.indices_file=", "data.forget.requests="))
                                               for o in overrides):
        raise FormatError("the certified forget set was given as index files; pass them as "
                          "data.forget.indices_file=FILE (or data.forget.requests=[...])")
    cfg = compose_main([f"data={data['name']}", f"model={model['name']}"])
    for key, value in data.items():
        if key == "forget":
            for sub, sub_value in value.items():
                if sub != "from_file":
                    cfg.data.forget[sub] = sub_value
        elif key != "name":
            cfg.data[key] = value
    for key, value in model_settings(model).items():
        cfg.model[key] = value
    cfg.data.download = False
    cfg.data.num_workers = 0
    for override in overrides:
        key, _, value = override.partition("=")
        if not key.startswith("data.") or not value:
            raise FormatError(f"override {override!r} is not allowed; use data.KEY=VALUE (e.g. data.root=DIR)")
        try:
            set_value(cfg, key, value)
        except ConfigError as exc:  # unknown keys and bad values
            raise FormatError(f"override {override!r} is not allowed: {exc}".splitlines()[0]) from None
    data_cfg, model_cfg = cfg.data, cfg.model
    resolve(data_cfg)
    return data_cfg, Part.of(model_cfg)


# ----------------------------------------------------------------------------------- the certificate
STEP_FIELDS: dict[str, Check] = {
    "forget_size": integer, "retain_size": integer, "gradient_norm": number, "residual": number,
    "lam_min_measured": number, "hessian_norm_measured": number, "ritz_min": number, "ritz_max": number,
    "spectrum_method": one_of("exact_eigvalsh", "lanczos"), "lanczos_iterations": integer,
    "spectrum_margin": number, "scale": optional(number), "depth": optional(integer),
    "step_norm": number, "norm_before_projection": number,
}
RESIDUAL_STEP_FIELDS: dict[str, Check] = {
    "forget_size": integer, "retain_size": integer, "gradient_norm": number, "multiplier": number,
    "stationarity": number, "rounding_floor": number, "weights_norm": number, "distance_bound": number,
    "newton_iterations": integer, "hessian_products": integer, "step_norm": number,
}


def step_record(value, key):
    """A bound=paper step (Newton step, spectrum) or a bound=residual one (stationarity at the solution)."""
    fields = RESIDUAL_STEP_FIELDS if isinstance(value, dict) and "stationarity" in value else STEP_FIELDS
    return record(fields)(value, key)


CERTIFICATE_FIELDS: dict[str, Check] = {
    "format": one_of(CERTIFICATE_FORMAT), "algorithm": one_of(*ALGORITHMS), "experiment": name,
    "bound": one_of("residual", "paper"), "layers": one_of("all", "last"), "mu": optional(number),
    "mu_rule": optional(one_of(*MU_RULES)),
    "sensitivity_formula": optional(number),
    "theta": number, "lam": number, "lam_min_stated": number, "lam_min": optional(number),
    "hessian_norm": optional(number),
    "gradient_bound": number, "uniformity": one_of("kl", "reverse_kl", "square"), "forget_temperature": number,
    # any name: a reduction that is not convex is a failure of the check (document.py), not of the shape
    "forget_reduction": record({"name": name, "temperature": optional(number), "fraction": optional(number)}),
    "hessian_lipschitz_forget": number, "hessian_lipschitz_retain": number,
    "grad_lipschitz_forget": number, "grad_lipschitz_retain": number,
    "norm_bound": number, "norm_bound_config": number, "projection": one_of("global", "per_tensor"),
    "epsilon": number, "delta": number, "sigma": number, "sensitivity": number,
    "sigma_source": one_of("budget", "config"), "mechanism": one_of("classical", "analytic_gaussian"),
    "release_model": one_of("single", "final", "each"), "releases": integer,
    "warmup_epochs": integer, "batchnorm": one_of("none", "recomputed_on_retain_after_noise"),
    "num_params": integer, "parameter_names": list_of(name),
    "chunk_size": integer, "max_exact_params": integer, "lanczos_iterations": integer, "spectrum_margin": number,
    "estimator": optional(record({
        "scale_config": optional(number), "scale_margin": number, "depth_config": optional(integer),
        "repeats": integer, "sample_size": integer, "estimator_seed": integer, "max_residual": number})),
    "steps": list_of(step_record, 10_000),
    "weights": list_of(record({"file": weights_file, "sha256": hex64}), 10_000),
    "data": check_data_spec, "model": check_model_spec,
    "forget_fingerprint": hex64, "forget_size": integer, "metrics": metrics_map,
}

def check_certificate_format(document) -> dict:
    """The certificate with every field checked, or FormatError naming the first bad one."""
    return record(CERTIFICATE_FIELDS)(document, "")


AUDIT_FIELDS: dict[str, Check] = {
    "format": one_of(AUDIT_FORMAT), "noise_seed": hex64, "certificate_sha256": hex64,
    "start_file": weights_file, "start_sha256": hex64, "noise_free_file": weights_file,
    "noise_free_sha256": list_of(hex64, 10_000), "weights_sha256": list_of(hex64, 10_000),
}


def check_audit_format(document) -> dict:
    return record(AUDIT_FIELDS)(document, "")
