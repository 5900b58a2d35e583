"""Interval bounds for certified training (IBP training, Gowal et al. 2018; with Shi et al. 2021's
initialisation, BatchNorm handling and warm-up regularisers): what A(D) is trained on when
`pretrain.certified.gamma` > 0 (models/certified_erm.py).

  batch_statistics   a clean forward pass that records every training-mode BatchNorm's batch mean and
                     (biased) variance; the interval pass then treats each BatchNorm as the affine map those
                     statistics define, so the bound holds for the function the batch trains (Shi et al. 2021:
                     BatchNorm after every layer, its bound through the clean batch's statistics);
  class_margins      [N, K] lower bounds on z_y - z_j over each image's L-inf ball, through the final Linear
                     layer's rows W_y - W_j (exact given the box of that layer's input);
  certified_cross_entropy   cross entropy of the worst-case logits -margins (the IBP loss);
  warmup_regulariser Shi et al.'s two warm-up terms on every ReLU's pre-activation box: tightness (the box
                     may not grow past 1 / tolerance times the input's) and ReLU balance (active and inactive
                     neurons' centres alike in mean and spread);
  smoothed_ramp      the radius schedule: polynomial growth, then linear (auto_LiRPA's SmoothedScheduler idea);
  ibp_initialise     weights ~ N(0, 2 pi / fan_in^2) but the last layer, halved after a residual sum, so that
                     interval widths neither explode nor vanish at initialisation.

Pure torch, no Lightning: tested against sampled points (tests/test_certified_pretraining.py).
"""

import math

import torch
import torch.nn.functional as F
from torch import fx, nn

from ttp_lightning.bounds.propagate import ADDITIONS, Box, UnsupportedLayer, last_linear, run_graph, trace


def batch_statistics(net: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """(logits, {module name: (mean, var)}) of one clean forward pass: every BatchNorm in training mode records
    its input's per-channel batch mean and biased variance (what it normalises by), differentiably."""
    statistics: dict = {}
    hooks = []
    for name, module in net.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.training:
            hooks.append(module.register_forward_pre_hook(_recorder(name, statistics)))
    try:
        logits = net(images)
    finally:
        for hook in hooks:
            hook.remove()
    return logits, statistics


def _recorder(name: str, statistics: dict):
    def record(module, inputs):
        x = inputs[0]
        dims = [d for d in range(x.dim()) if d != 1]
        statistics[name] = (x.mean(dims), x.var(dims, unbiased=False))
    return record


def class_margins(net: nn.Module, graph: fx.GraphModule, lower: torch.Tensor, upper: torch.Tensor,
                  labels: torch.Tensor, statistics: dict | None = None) -> tuple[torch.Tensor, list[Box]]:
    """([N, K] lower bounds on z_y - z_j for every input of each image's box, 0 at j = y; the box of every ReLU's
    input, in graph order, for the warm-up regulariser). The network must end in a Linear layer."""
    found = last_linear(net, graph)
    if found is None:
        raise UnsupportedLayer("certified training needs a network that ends in a Linear layer")
    layer, features_node = found
    env = run_graph(net, graph, Box(lower, upper), until=features_node, statistics=statistics)
    features = env[features_node]
    if not isinstance(features, Box):
        raise UnsupportedLayer("the network's output does not depend on its input")
    bias = layer.bias if layer.bias is not None else torch.zeros_like(layer.weight[:, 0])
    rows = layer.weight[labels][:, None, :] - layer.weight[None, :, :]  # [N, K, D]: W_y - W_j
    margins = torch.einsum("nd,nkd->nk", features.centre, rows) - torch.einsum("nd,nkd->nk", features.radius,
                                                                              rows.abs())
    margins = margins + bias[labels][:, None] - bias[None, :]
    margins = margins.masked_fill(F.one_hot(labels, margins.shape[1]).bool(), 0.0)
    return margins, _relu_inputs(net, graph, env)


def _relu_inputs(net: nn.Module, graph: fx.GraphModule, env: dict) -> list[Box]:
    boxes = []
    for node in graph.graph.nodes:
        if node not in env or not node.args or not isinstance(node.args[0], fx.Node):
            continue
        is_relu = (node.op == "call_module" and isinstance(net.get_submodule(node.target), nn.ReLU)) or \
            (node.op == "call_function" and node.target in (F.relu, torch.relu)) or \
            (node.op == "call_method" and node.target == "relu")
        value = env.get(node.args[0])
        if is_relu and isinstance(value, Box):
            boxes.append(value)
    return boxes


def certified_cross_entropy(margins: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The IBP loss: cross entropy of the worst-case logits -margins (an upper bound on the cross entropy at
    every point of each image's box, averaged over the batch)."""
    return F.cross_entropy(-margins, labels)


def warmup_regulariser(relu_inputs: list[Box], input_radius: torch.Tensor, tolerance: float) -> torch.Tensor:
    """Shi et al. 2021's warm-up terms, averaged over the ReLU layers: tightness, relu(tau - r_0 / r_l) / tau with
    r_l the mean radius of layer l's pre-activation box and r_0 the input's; and ReLU balance, for the mean and the
    spread of the box centres of the surely active (lower > 0) against the surely inactive (upper < 0) neurons,
    relu(tau - min(ratio, 1 / ratio)) / tau each. A NaN or infinite balance term (no active or no inactive
    neuron) is left out, as Shi et al. do."""
    if not relu_inputs:
        return input_radius.new_zeros(())
    start = input_radius.mean()
    total = input_radius.new_zeros(())
    for box in relu_inputs:
        centre, radius = box.centre, box.radius
        total = total + F.relu(tolerance - start / radius.mean().clamp(min=1e-12)) / tolerance
        active, inactive = (box.lower > 0).to(centre.dtype), (box.upper < 0).to(centre.dtype)
        spread = (centre - centre.mean()) ** 2
        mean_ratio = _balanced((centre * active).mean() / -(centre * inactive).mean())
        var_ratio = _balanced((spread * active).sum() / (spread * inactive).sum())
        balance = (F.relu(tolerance - mean_ratio) + F.relu(tolerance - var_ratio)) / tolerance
        if torch.isfinite(balance):
            total = total + balance
    return total / len(relu_inputs)


def _balanced(ratio: torch.Tensor) -> torch.Tensor:
    return torch.minimum(ratio, 1.0 / ratio.clamp(min=1e-12))


def smoothed_ramp(progress: float, middle: float = 0.25, power: float = 4.0) -> float:
    """The share of the full radius at `progress` in [0, 1] of the ramp: grows as a power up to `middle`, then
    linearly to 1, value and slope continuous at `middle`; 0 before the ramp, 1 after it."""
    if progress <= 0:
        return 0.0
    if progress >= 1:
        return 1.0
    at_middle = middle / (power * (1.0 - middle) + middle)
    if progress <= middle:
        return at_middle * (progress / middle) ** power
    return at_middle + (1.0 - at_middle) * (progress - middle) / (1.0 - middle)


def ibp_initialise(net: nn.Module, generator: torch.Generator | None = None) -> list[str]:
    """Shi et al. 2021's initialisation: every Linear and Conv weight but the network's last layer drawn from
    N(0, sigma^2), sigma = sqrt(2 pi) / fan_in, and halved where the layer reads a residual sum (through at most
    one ReLU). Biases and BatchNorm stay. Returns the names of the layers initialised."""
    graph = trace(net)
    found = last_linear(net, graph)
    last = found[0] if found else None
    after_sum = _layers_after_sum(net, graph)
    names = []
    with torch.no_grad():
        for name, module in net.named_modules():
            if not isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d)) or module is last:
                continue
            fan_in = module.weight[0].numel()
            std = math.sqrt(2 * math.pi) / fan_in * (0.5 if name in after_sum else 1.0)
            module.weight.normal_(0.0, std, generator=generator)
            names.append(name)
    return names


def _layers_after_sum(net: nn.Module, graph: fx.GraphModule) -> set[str]:
    """Names of the Linear / Conv layers whose input is a sum of two values, directly or through one ReLU."""
    def is_sum(node) -> bool:
        return isinstance(node, fx.Node) and (
            (node.op == "call_function" and node.target in ADDITIONS) or
            (node.op == "call_method" and node.target in ("add", "add_", "__add__")))

    def through_relu(node):
        if isinstance(node, fx.Node) and node.op == "call_module" and \
                isinstance(net.get_submodule(node.target), nn.ReLU):
            return node.args[0]
        return node

    names = set()
    for node in graph.graph.nodes:
        if node.op == "call_module" and isinstance(net.get_submodule(node.target), (nn.Linear, nn.Conv1d, nn.Conv2d)) \
                and is_sum(through_relu(node.args[0])):
            names.add(node.target)
    return names
