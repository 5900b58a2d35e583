"""What a method hands back to the pipeline."""

from dataclasses import dataclass, field

from torch import nn


@dataclass
class CertifiedRelease:
    """A certified method's release before it is written (certified/certificate/document.write_release)."""

    certificate: dict   # the public statement: constants, measured values, noise; the pipeline adds identity
    states: list[dict]  # the released state_dicts, in request order (the last is the final model)
    audit: dict         # private: the secret noise seed, the start weights, the noise-free weights
    noise_free: dict = field(default_factory=dict)  # private: the last noise-free model's scores (results.json)


@dataclass
class MethodOutput:
    """What `Method.run` returns: the method's model, its metrics (results.json's row for the method, beside the
    evaluation's), its per-epoch history, and for certified methods the release (certificate, noised weights,
    private audit record)."""

    net: nn.Module
    metrics: dict
    history: list = field(default_factory=list)
    release: CertifiedRelease | None = None  # certified methods only
