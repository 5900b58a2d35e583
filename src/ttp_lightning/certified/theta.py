"""`method.theta=auto` on a model: the head's features once, then M_theta(D) solved at each theta the rule
(certified/maths/theta_rule.py) probes, each warm-started from the last (the objective is strictly convex, so the start
changes the time, not the optimum) and to a probe's tolerance; the release is then solved again at the chosen
theta from the usual start, as any fixed theta is."""

import dataclasses
import logging

import torch
from torch import nn

from ttp_lightning.certified.maths.linear_head import SolverSettings, solve_on_ball
from ttp_lightning.certified.maths.newton import resolve_lam
from ttp_lightning.certified.maths.residual_step import (
    final_linear,
    head_features,
    head_vector,
    objective_at,
)
from ttp_lightning.certified.maths.theta_rule import Probe, ThetaChoice, choose_theta
from ttp_lightning.certified.schema import CertifiedSchema
from ttp_lightning.core.metrics import conf_dist_of_probs
from ttp_lightning.data.datamodule import TTPDataModule

log = logging.getLogger(__name__)

PROBE_TOLERANCE = 1e-7  # a probe needs CDs to about 1e-6, not the certificate's stationarity


def choose(cfg: CertifiedSchema, net: nn.Module, datamodule: TTPDataModule, norm_bound: float,
           threshold: float) -> ThetaChoice:
    """The rule's choice for the model `net` (its head selected, on the solver's device); `threshold` is the
    release gate's CD threshold, tau_r the starting head's retain accuracy minus theta_retain_drop_at_most."""
    head = final_linear(net)
    forget, retain = datamodule.dataset("forget"), datamodule.dataset("retain")
    features = head_features(net, head, [forget, retain], cfg.chunk_size)
    labels = [forget.labels.cpu(), retain.labels.cpu()]
    lam, classes = resolve_lam(cfg), head.out_features
    start = head_vector(head)
    start_retain, _ = head_scores(torch.cat([head.weight, head.bias[:, None]], dim=1).detach().double().cpu(),
                                  features, labels)
    retain_floor = start_retain - float(cfg.theta_retain_drop_at_most)
    settings = SolverSettings(tolerance=max(float(cfg.solver_tolerance), PROBE_TOLERANCE),
                              max_newton=int(cfg.max_newton), max_cg=int(cfg.max_cg))
    warm = [start]

    def probe(theta: float) -> Probe:
        objective = objective_at(features, labels, cfg, theta, lam, classes)
        warm[0] = solve_on_ball(objective, warm[0], norm_bound, settings).weights
        retain_acc, conf_dists = head_scores(objective.matrix(warm[0]), features, labels)
        found = Probe(theta, retain_acc, conf_dists)
        log.info(f"theta rule: theta {theta:.4g}: retain acc {retain_acc:.2%} (at least {retain_floor:.2%}), worst "
                 f"forget CD {found.worst:.4f}, {len(found.exposed(threshold))} of {len(conf_dists)} above {threshold:g}")
        return found

    return choose_theta(probe, list(cfg.theta_ladder), int(cfg.theta_refine_steps), threshold, retain_floor)


def head_scores(matrix: torch.Tensor, features: list[torch.Tensor],
                labels: list[torch.Tensor]) -> tuple[float, tuple[float, ...]]:
    """(retain accuracy, each forget image's CD) of the model whose head is `matrix` ([W, b], K x (f + 1)) on the
    head's (forget, retain) features."""
    conf_dists = conf_dist_of_probs(torch.softmax(features[0] @ matrix.T, dim=1))
    correct = (features[1] @ matrix.T).argmax(dim=1) == labels[1]
    return correct.double().mean().item(), tuple(conf_dists.tolist())


def chosen_settings(cfg: CertifiedSchema, choice: ThetaChoice) -> CertifiedSchema:
    return dataclasses.replace(cfg, theta=choice.theta)


def verdict_line(choice: ThetaChoice, image_ids: list[str]) -> str:
    """One line for the console and the log: the chosen theta, or the images the rule could not protect."""
    if choice.met:
        return (f"theta rule: theta {choice.theta:.4g}, the smallest probed whose optimum puts every forget image at "
                f"CD <= {choice.threshold:g} with retain accuracy >= {choice.retain_floor:.2%} "
                f"({len(choice.probes)} probes)")
    named = ", ".join(image_ids[i] for i in choice.exposed[:10]) + (" ..." if len(choice.exposed) > 10 else "")
    return (f"theta rule: no probed theta puts every forget image at CD <= {choice.threshold:g} with retain accuracy "
            f">= {choice.retain_floor:.2%}; at theta {choice.theta:.4g} {len(choice.exposed)} images stay above it "
            f"({named})")
