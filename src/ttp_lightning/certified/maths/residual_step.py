"""`method.bound=residual`: the certified weights solved to the exact regularised Pareto optimum, and the
a-posteriori bound on the distance (certified/maths/residual.py, certified/maths/linear_head.py).

The certified weights are those of the model's final nn.Linear, whose output must be the logits: with
`layers=all` they must be every trainable weight (logistic regression), with `layers=last` everything before
the head is frozen at the start weights (A(D), after any warm-up) and the head is certified on those features
(Guo et al. 2020's recipe). The bound then covers the head only: the frozen layers are released as they are,
trained on D including D_f, and nothing is claimed about them.
"""

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ttp_lightning.certified.maths.linear_head import (
    HeadPart,
    LinearHeadObjective,
    SolverSettings,
    solve_on_ball,
)
from ttp_lightning.certified.maths.reductions import Reduction
from ttp_lightning.certified.maths.residual import (
    NotConvex,
    ball_multiplier,
    distance_bound,
    rounding_floor,
    strong_convexity,
)
from ttp_lightning.core.batching import ImageBatchDataset, iterate_shard
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.core.nn_modes import trainable
from ttp_lightning.core.objectives import PER_INSTANCE_LOSSES


def final_linear(net: nn.Module) -> nn.Linear:
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    if not linears or linears[-1].bias is None:
        raise TTPUserError("method.bound=residual certifies a model's final nn.Linear (with a bias); this model has "
                           "none; use method.bound=paper")
    return linears[-1]


def select_certified_layers(net: nn.Module, layers: str, bound: str = "residual") -> nn.Linear | None:
    """The head whose weights are certified. `last` freezes every other parameter (requires_grad False);
    `all` with bound=residual requires that the head already holds every trainable parameter (a linear
    model); `all` with bound=paper certifies every trainable weight as it is (returns None, changes nothing)."""
    if layers == "all" and bound == "paper":
        return None
    head = final_linear(net)
    if layers == "last":
        for param in net.parameters():
            param.requires_grad_(False)
        for param in head.parameters():
            param.requires_grad_(True)
    elif [id(p) for p in trainable(net)] != [id(head.weight), id(head.bias)]:
        raise TTPUserError("method.bound=residual needs logits linear in the certified weights, and this model has "
                           "trainable weights before its final nn.Linear (the objective is not convex in them); use "
                           "method.layers=last (certify the last layer on frozen features) or method.bound=paper")
    return head


def head_features(net: nn.Module, head: nn.Linear, datasets: list[ImageBatchDataset],
                  chunk_size: int) -> list[torch.Tensor]:
    """Per dataset, (n, f + 1) float64: the head's inputs (eval mode, one float64 copy of the model), with a
    column of ones. Refuses a model whose output is not the head's output (the logits must be linear in it)."""
    index = next(i for i, m in enumerate(net.modules()) if m is head)
    double = copy.deepcopy(net).double().eval()
    device = next(double.parameters()).device
    captured = {}
    hook = list(double.modules())[index].register_forward_hook(
        lambda m, inputs, output: captured.update(phi=inputs[0], out=output))
    matrices = []
    try:
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            for dataset in datasets:
                rows = []
                for images, _ in iterate_shard(dataset, chunk_size, sharded=False):
                    logits = double(images.to(device, torch.float64))
                    if not torch.equal(logits, captured["out"]):
                        raise TTPUserError("the model's output is not its final nn.Linear's output, so the logits "
                                           "are not linear in the certified weights; use method.bound=paper")
                    rows.append(captured["phi"].flatten(1).cpu())
                features = torch.cat(rows)
                matrices.append(torch.cat([features, torch.ones(len(features), 1, dtype=features.dtype)], dim=1))
    finally:
        hook.remove()
    return matrices


def instance_losses(cfg):
    """(forget, retain) per-instance losses of one logit vector: the uniformity loss at the temperature, and
    cross-entropy against the label."""
    uniformity, temperature = PER_INSTANCE_LOSSES[cfg.uniformity], float(cfg.forget_temperature)
    forget = lambda logits, label: uniformity(logits[None] / temperature)[0]
    retain = lambda logits, label: F.cross_entropy(logits[None], label[None])
    return forget, retain


def forget_reduction(cfg) -> Reduction:
    """How the certified objective combines the forget losses (`method.forget_reduction`, its temperature and,
    for cvar, its fraction); the mean when unset."""
    name = str(getattr(cfg, "forget_reduction", None) or "mean")
    if name == "mean":
        return Reduction()
    temperature, fraction = getattr(cfg, "forget_reduction_temperature", None), getattr(cfg, "forget_cvar_fraction", None)
    return Reduction(name, None if temperature is None else float(temperature),
                     float(fraction) if name == "cvar" and fraction is not None else None)


def objective_at(features: list[torch.Tensor], labels: list[torch.Tensor], cfg, theta: float, lam: float,
                 classes: int) -> LinearHeadObjective:
    """F = theta R(L_K over the forget rows) + (1 - theta) mean CE(retain rows) + lambda / 2 ||w||^2 on the head's
    (forget, retain) features."""
    forget_loss, retain_loss = instance_losses(cfg)
    parts = [HeadPart(features[0], labels[0], theta, forget_loss, forget_reduction(cfg)),
             HeadPart(features[1], labels[1], 1.0 - theta, retain_loss)]
    return LinearHeadObjective(parts, lam, classes)


def head_objective(net: nn.Module, head: nn.Linear, cfg, lam: float, retain: ImageBatchDataset,
                   forget: ImageBatchDataset) -> LinearHeadObjective:
    features = head_features(net, head, [forget, retain], cfg.chunk_size)
    return objective_at(features, [forget.labels.cpu(), retain.labels.cpu()], cfg, float(cfg.theta), lam,
                        head.out_features)



def head_vector(head: nn.Linear) -> torch.Tensor:
    return torch.cat([head.weight.detach().reshape(-1), head.bias.detach()]).double().cpu()


def mu_of(cfg, lam: float) -> tuple[float, str]:
    try:
        mu, rule = strong_convexity(cfg.uniformity, lam, float(cfg.theta), float(cfg.grad_lipschitz_forget),
                                    forget_reduction(cfg))
    except NotConvex as exc:
        raise TTPUserError(f"method.{exc}; the residual bound needs a convex objective (mu > 0)") from None
    if not mu > 0:
        raise TTPUserError(f"mu = lambda - theta P_K = {lam:.4g} - {cfg.theta} x {cfg.grad_lipschitz_forget:.4g} <= 0: "
                           f"with method.uniformity={cfg.uniformity} the objective is strongly convex only for lambda "
                           f"> theta P_K; raise method.lam or use method.uniformity=reverse_kl (convex, mu = lambda)")
    return mu, rule


def stationarity_record(objective: LinearHeadObjective, weights: torch.Tensor, mu: float, norm_bound: float) -> dict:
    """What the certificate states about `weights` (measured here; `verify --audit` remeasures it): the
    distance bound with nu = 0 or with the multiplier estimate, whichever is smaller (any nu >= 0 is valid;
    inside the ball a tiny estimate would only add its slack term)."""
    at = objective.evaluate(weights)
    floor = rounding_floor(objective.absolute_gradient_norm(at), objective.summed_terms())
    norm = weights.norm().item()
    candidates = []
    for multiplier in {0.0, ball_multiplier(at.gradient, weights)}:
        stationarity = (at.gradient + multiplier * weights).norm().item()
        bound = distance_bound(stationarity + floor, mu, multiplier, norm, norm_bound)
        candidates.append((bound, multiplier, stationarity))
    bound, multiplier, stationarity = min(candidates)
    return {"gradient_norm": at.gradient.norm().item(), "multiplier": multiplier, "stationarity": stationarity,
            "rounding_floor": floor, "weights_norm": norm, "distance_bound": bound}


def residual_step(net: nn.Module, cfg, lam: float, retain: ImageBatchDataset, forget: ImageBatchDataset,
                  norm_bound: float) -> tuple[torch.Tensor, dict]:
    """Solve the head to M_theta(D) from its current weights, write the solution into the model, and return
    (the noise-free certified weights, float64, and the step's certificate record)."""
    head = final_linear(net)
    mu, _ = mu_of(cfg, lam)
    objective = head_objective(net, head, cfg, lam, retain, forget)
    start = head_vector(head)
    settings = SolverSettings(tolerance=float(cfg.solver_tolerance), max_newton=int(cfg.max_newton),
                              max_cg=int(cfg.max_cg))
    solution = solve_on_ball(objective, start, norm_bound, settings)
    weights = solution.weights
    record = {"forget_size": len(forget), "retain_size": len(retain),
              **stationarity_record(objective, weights, mu, norm_bound),
              "newton_iterations": solution.newton_iterations, "hessian_products": solution.hessian_products,
              "step_norm": (weights - start).norm().item()}
    with torch.no_grad():
        split = head.weight.numel()
        head.weight.copy_(weights[:split].view_as(head.weight).to(head.weight))
        head.bias.copy_(weights[split:].to(head.bias))
    return weights, record
