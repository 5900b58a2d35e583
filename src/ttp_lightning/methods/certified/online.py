"""Alg 4 (`certified_online`): forget requests D_{f_1}, ..., D_{f_k} arrive one after another; each moves
the weights by one estimated Newton step w~_i = w~_{i-1} - P_n / J computed at w~_{i-1} on (D_{f_i}, D_{r_i}),
then one Gaussian noise draw is added at the end, sigma = Delta / (k epsilon) sqrt(2 ln(1.25 / delta)) as
the paper states.

D_{f_i} here is every instance requested so far (the union of requests 1..i) and D_{r_i} the rest, so a
later step keeps earlier requests uniform (App. "Online Algorithm" defines D_{r_i} = D minus that union)."""

import time

import torch
from torch import nn

from ttp_lightning.certify.certificate import ONLINE
from ttp_lightning.certify.hvp import flatten
from ttp_lightning.data.datamodule import TTPDataModule
from ttp_lightning.methods.certified.common import (
    calibrate_noise,
    curvature,
    noise_metrics,
    release_noisy,
    stated_constants,
    warm_start,
)
from ttp_lightning.methods.certified.lissa import estimated_newton_direction, estimator_constants
from ttp_lightning.methods.output import MethodOutput
from ttp_lightning.training import RunContext


def run_certified_online(ctx: RunContext, pretrained: nn.Module, datamodule: TTPDataModule, make_net) -> MethodOutput:
    cfg = ctx.cfg.method
    prepared = warm_start(ctx, pretrained, datamodule)  # no Alg 1 warm-up (validation): w~_0 = A(D)
    generator = torch.Generator().manual_seed(int(cfg.estimator_seed))
    steps, history, start = [], [], time.perf_counter()
    for request in range(1, len(datamodule.forget_requests) + 1):
        retain, forget = datamodule.request_parts(request)
        curv = curvature(prepared.net, cfg, retain, forget)
        step = estimated_newton_direction(curv, cfg, generator)
        curv.assign(flatten(p.detach() for p in curv.params) - step["direction"])
        steps.append(step)
        history.append({"request": request, "forget_size": len(forget), "retain_size": len(retain),
                        "newton_residual": step["residual"], "scale_J": step["scale"], "depth_n": step["depth"],
                        "gradient_norm": step["gradient"].norm().item(),
                        "newton_step_norm": step["direction"].norm().item(),
                        "elapsed_s": round(time.perf_counter() - start, 3)})
    certificate = {**stated_constants(ctx, ONLINE), **estimator_constants(cfg, curv, steps),
                   "forget_sizes": [row["forget_size"] for row in history],
                   "retain_sizes": [row["retain_size"] for row in history]}
    certificate = calibrate_noise(cfg, certificate)
    net = release_noisy(curv, flatten(p.detach() for p in curv.params), certificate["sigma"],
                        certificate["noise_seed"])
    metrics = {
        "wall_s": round(time.perf_counter() - start, 3),
        "requests": len(steps),
        "newton_residual": max(s["residual"] for s in steps),
        "batchnorm_refreshed": prepared.batchnorm_refreshed,
        **noise_metrics(certificate),
    }
    return MethodOutput(net, metrics, history, certificate)
