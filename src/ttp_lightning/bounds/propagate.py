"""Interval bound propagation (IBP; Gowal et al. 2018) through a network's traced graph.

Given elementwise input bounds lower <= x <= upper, every node of the network's torch.fx graph gets bounds
that hold for every input in the box. Three kinds of operation cover the supported layers:

  affine        Linear, Conv1d/2d, BatchNorm in eval mode, multiplication or division by a constant,
                subtraction, negation: in centre / radius form, c' = A(c), r' = |A|(r) (exact per output for
                one affine map);
  sum           addition of two bounded values (residual connections) or of a constant;
  monotone      non-decreasing operations, elementwise or not: ReLU and its relatives, sigmoid, tanh, max and
                average pooling, mean, flatten / view / reshape / indexing / concatenation: f(lower) <= f(x) <=
                f(upper).

Anything else (LayerNorm, softmax, attention, GELU, a product of two bounded values) is not supported and
raises UnsupportedLayer naming it: a bound that silently skipped a layer would not be a bound. BatchNorm must
be in eval mode (running statistics: the function a released model computes), except in certified training
(bounds/training.py), which passes the clean batch's statistics of every BatchNorm in training mode: the bound
then holds for the function that batch trains, BatchNorm affine with those statistics (Shi et al. 2021).

The arithmetic is the network's own dtype; callers that need a bound to survive rounding run it in float64
(uniformity.py does), and with `rounding` (bounds.rounding) the bounds hold for the network evaluated in float32 (or
the precision given), every rounding operation's error bound added to its box.
"""

import operator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import fx, nn


class UnsupportedLayer(ValueError):
    """The network holds an operation interval propagation has no rule for."""


@dataclass
class Box:
    """Elementwise bounds lower <= x <= upper of one value in the graph."""

    lower: torch.Tensor
    upper: torch.Tensor

    @property
    def centre(self) -> torch.Tensor:
        return (self.upper + self.lower) / 2

    @property
    def radius(self) -> torch.Tensor:
        return (self.upper - self.lower) / 2

    @classmethod
    def around(cls, centre: torch.Tensor, radius: torch.Tensor) -> "Box":
        return cls(centre - radius, centre + radius)


AFFINE_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.BatchNorm1d, nn.BatchNorm2d)
MONOTONE_MODULES = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.Hardtanh, nn.Sigmoid, nn.Tanh, nn.Softplus,
    nn.MaxPool1d, nn.MaxPool2d, nn.AdaptiveMaxPool2d, nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d, nn.Flatten, nn.Unflatten, nn.Identity, nn.Dropout,
)
MONOTONE_FUNCTIONS = {
    F.relu, torch.relu, F.relu6, F.leaky_relu, F.elu, F.hardtanh, torch.sigmoid, torch.tanh, F.softplus,
    F.max_pool1d, F.max_pool2d, F.adaptive_max_pool2d, F.avg_pool1d, F.avg_pool2d, F.adaptive_avg_pool1d,
    F.adaptive_avg_pool2d, torch.flatten, torch.reshape, torch.cat, torch.mean, torch.sum, operator.getitem,
    torch.squeeze, torch.unsqueeze, torch.permute, torch.transpose, F.dropout,
}
MONOTONE_METHODS = {"relu", "sigmoid", "tanh", "flatten", "view", "reshape", "mean", "sum", "permute",
                    "transpose", "contiguous", "squeeze", "unsqueeze", "expand", "clone", "float", "to", "view_as"}
SHAPE_METHODS = {"size", "dim"}
ADDITIONS = {operator.add, operator.iadd, torch.add}


def trace(net: nn.Module) -> fx.GraphModule:
    """The network's graph (torch.fx), or UnsupportedLayer when it cannot be traced."""
    try:
        return fx.symbolic_trace(net)
    except Exception as exc:  # noqa: BLE001 -- data-dependent control flow and the like
        raise UnsupportedLayer(f"{type(net).__name__} cannot be traced for interval bounds "
                               f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None


def _is_box(value) -> bool:
    return isinstance(value, Box)


def _has_box(value) -> bool:
    if _is_box(value):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_box(v) for v in value)
    if isinstance(value, dict):
        return any(_has_box(v) for v in value.values())
    return False


def _pick(value, side: str):
    """The lower or upper end of every Box inside `value` (lists, tuples, dicts; anything else as it is)."""
    if _is_box(value):
        return getattr(value, side)
    if isinstance(value, (list, tuple)):
        return type(value)(_pick(v, side) for v in value)
    if isinstance(value, dict):
        return {k: _pick(v, side) for k, v in value.items()}
    return value


def _monotone(function, args, kwargs) -> Box:
    kwargs = {k: v for k, v in kwargs.items() if k != "inplace"}
    return Box(function(*_pick(args, "lower"), **_pick(kwargs, "lower")),
               function(*_pick(args, "upper"), **_pick(kwargs, "upper")))


def _affine_module(module: nn.Module, box: Box, statistics: tuple | None = None) -> Box:
    centre, radius = box.centre, box.radius
    if isinstance(module, nn.Linear):
        return Box.around(F.linear(centre, module.weight, module.bias), F.linear(radius, module.weight.abs()))
    if isinstance(module, (nn.Conv1d, nn.Conv2d)):
        return Box.around(module._conv_forward(centre, module.weight, module.bias),
                          module._conv_forward(radius, module.weight.abs(), None))
    if module.training and statistics is None:
        raise UnsupportedLayer(f"{type(module).__name__} in training mode (batch statistics); bounds are for "
                               "eval mode")
    scale, shift = _batchnorm_affine(module) if statistics is None else _batch_affine(module, *statistics)
    shape = (1, -1) + (1,) * (centre.dim() - 2)
    return Box.around(centre * scale.view(shape) + shift.view(shape), radius * scale.abs().view(shape))


def _batchnorm_affine(module) -> tuple[torch.Tensor, torch.Tensor]:
    """BatchNorm in eval mode as y = scale * x + shift per channel."""
    if module.running_mean is None:
        raise UnsupportedLayer(f"{type(module).__name__} without running statistics")
    scale = torch.rsqrt(module.running_var + module.eps)
    if module.weight is not None:
        scale = scale * module.weight
    shift = -module.running_mean * scale + (module.bias if module.bias is not None else 0.0)
    return scale, shift


def _batch_affine(module, mean: torch.Tensor, var: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """BatchNorm in training mode, with one batch's mean and (biased) variance, as y = scale * x + shift."""
    scale = torch.rsqrt(var + module.eps)
    if module.weight is not None:
        scale = scale * module.weight
    return scale, -mean * scale + (module.bias if module.bias is not None else 0.0)


def _scaled(box: Box, factor) -> Box:
    """box * factor for a constant factor (a number or a tensor of either sign)."""
    factor = torch.as_tensor(factor, dtype=box.lower.dtype, device=box.lower.device)
    return Box.around(box.centre * factor, box.radius * factor.abs())


def _add(a, b) -> Box:
    if _is_box(a) and _is_box(b):
        return Box(a.lower + b.lower, a.upper + b.upper)
    box, constant = (a, b) if _is_box(a) else (b, a)
    return Box(box.lower + constant, box.upper + constant)


def _sub(a, b) -> Box:
    if _is_box(a) and _is_box(b):
        return Box(a.lower - b.upper, a.upper - b.lower)
    if _is_box(a):
        return Box(a.lower - b, a.upper - b)
    return Box(a - b.upper, a - b.lower)


def _function(target, args, kwargs, name: str):
    if target in ADDITIONS and len(args) == 2 and "alpha" not in kwargs:
        return _add(*args)
    if target in (operator.sub, torch.sub) and len(args) == 2 and "alpha" not in kwargs:
        return _sub(*args)
    if target in (operator.neg, torch.neg):
        return _scaled(args[0], -1.0)
    if target in (operator.mul, torch.mul) and len(args) == 2 and not (_has_box(args[0]) and _has_box(args[1])):
        box, factor = (args[0], args[1]) if _is_box(args[0]) else (args[1], args[0])
        return _scaled(box, factor)
    if target in (operator.truediv, torch.div) and _is_box(args[0]) and not _has_box(args[1]) and not kwargs:
        return _scaled(args[0], 1.0 / torch.as_tensor(args[1]))
    if target in MONOTONE_FUNCTIONS:
        return _monotone(target, args, kwargs)
    raise UnsupportedLayer(f"interval bounds have no rule for {getattr(target, '__name__', target)} (node {name})")


def _method(node: fx.Node, args, kwargs):
    self, rest = args[0], args[1:]
    if not _is_box(self):
        return getattr(self, node.target)(*rest, **kwargs)
    if node.target in SHAPE_METHODS:
        return getattr(self.lower, node.target)(*rest, **kwargs)
    if node.target in MONOTONE_METHODS:
        return _monotone(lambda x, *a, **k: getattr(x, node.target)(*a, **k), (self, *rest), kwargs)
    if node.target in ("add", "add_", "__add__") and len(rest) == 1 and not kwargs:
        return _add(self, rest[0])
    if node.target in ("sub", "__sub__") and len(rest) == 1 and not kwargs:
        return _sub(self, rest[0])
    if node.target in ("mul", "__mul__") and len(rest) == 1 and not _has_box(rest[0]):
        return _scaled(self, rest[0])
    if node.target in ("div", "__truediv__") and len(rest) == 1 and not _has_box(rest[0]):
        return _scaled(self, 1.0 / torch.as_tensor(rest[0]))
    raise UnsupportedLayer(f"interval bounds have no rule for the tensor method .{node.target}() (node {node.name})")


def _module(module: nn.Module, args, kwargs, name: str, statistics: dict | None = None):
    if not _has_box(args):
        return module(*args, **kwargs)
    if isinstance(module, AFFINE_MODULES):
        return _affine_module(module, args[0], (statistics or {}).get(name))
    if isinstance(module, MONOTONE_MODULES):
        if isinstance(module, nn.LeakyReLU) and module.negative_slope < 0:
            raise UnsupportedLayer(f"LeakyReLU with a negative slope (module {name}) is not monotone")
        if isinstance(module, (nn.ELU,)) and module.alpha < 0:
            raise UnsupportedLayer(f"ELU with a negative alpha (module {name}) is not monotone")
        if getattr(module, "inplace", False):
            return _monotone(lambda x: module(x.clone()), args, kwargs)
        return _monotone(module, args, kwargs)
    raise UnsupportedLayer(f"interval bounds have no rule for {type(module).__name__} (module {name})")


def _lookup(env: dict, value):
    if isinstance(value, fx.Node):
        return env[value]
    if isinstance(value, (list, tuple)):
        return type(value)(_lookup(env, v) for v in value)
    if isinstance(value, dict):
        return {k: _lookup(env, v) for k, v in value.items()}
    return value


def run_graph(net: nn.Module, graph: fx.GraphModule, box: Box, until: fx.Node | None = None,
              known: dict | None = None, rounding=None, noise: dict | None = None,
              statistics: dict | None = None) -> dict:
    """Every node's value (a Box where it depends on the input) in the graph's order, up to and including
    `until` (default: all). Modules, parameters and buffers are looked up on `net` itself, so a graph traced
    once stays right after `net` moves to another device or its weights change. `known` holds tighter boxes
    already proven for some nodes (linear bounds): each replaces the interval one where it is computed.
    With `rounding` (bounds.rounding.Rounding) the boxes are those of the network evaluated in its precision: each
    rounding operation's box is widened by its error bound D, recorded in `noise` ({node: D}) when given.
    `statistics` ({module name: (mean, var)}, bounds.training.batch_statistics) stands for the batch statistics
    of BatchNorm layers in training mode."""
    env: dict = {}
    known = known or {}
    for node in graph.graph.nodes:
        args, kwargs = _lookup(env, node.args), _lookup(env, node.kwargs)
        if node.op == "placeholder":
            env[node] = box
        elif node.op == "get_attr":
            env[node] = _attribute(net, node.target)
        elif node.op == "call_module":
            env[node] = _module(net.get_submodule(node.target), args, kwargs, node.target, statistics)
        elif node.op == "call_function":
            env[node] = _function(node.target, args, kwargs, node.name) if _has_box(args) or _has_box(kwargs) \
                else node.target(*args, **kwargs)
        elif node.op == "call_method":
            env[node] = _method(node, args, kwargs)
        elif node.op == "output":
            env[node] = args[0]
        if rounding is not None and node.op in ("call_module", "call_function", "call_method"):
            amount = rounding.noise(net, node, env)
            if amount is not None:
                env[node] = Box(env[node].lower - amount, env[node].upper + amount)
                if noise is not None:
                    noise[node] = amount
        if node in known:
            env[node] = known[node]
        if node is until:
            break
    return env


def _attribute(net: nn.Module, target: str):
    value = net
    for part in target.split("."):
        value = getattr(value, part)
    return value


def interval_bounds(net: nn.Module, lower: torch.Tensor, upper: torch.Tensor,
                    graph: fx.GraphModule | None = None, rounding=None, statistics: dict | None = None) -> Box:
    """Bounds on the network's output for every input x with lower <= x <= upper (elementwise; with `rounding`,
    of the network evaluated in that precision; with `statistics`, training-mode BatchNorm fixed to them)."""
    graph = trace(net) if graph is None else graph
    output = next(node for node in graph.graph.nodes if node.op == "output")
    result = run_graph(net, graph, Box(lower, upper), rounding=rounding, statistics=statistics)[output]
    if not _is_box(result):
        raise UnsupportedLayer("the network's output does not depend on its input")
    return result


def last_linear(net: nn.Module, graph: fx.GraphModule) -> tuple[nn.Linear, fx.Node] | None:
    """The final Linear layer when the graph's output is exactly its result (so logit differences can be
    bounded through its weights: the last-layer elision of Gowal et al. 2018), with its input node."""
    output = next(node for node in graph.graph.nodes if node.op == "output")
    last = output.args[0]
    if isinstance(last, fx.Node) and last.op == "call_module":
        module = net.get_submodule(last.target)
        if isinstance(module, nn.Linear) and len(last.args) == 1 and isinstance(last.args[0], fx.Node):
            return module, last.args[0]
    return None


def _final_layer(net: nn.Module, lower: torch.Tensor, upper: torch.Tensor, graph: fx.GraphModule | None,
                 rounding=None):
    """(weight [K, D], bias [K], bounds of the final Linear layer's input, [N, K] that layer's own rounding
    error bound or None) when the network ends in one; else (None, None, bounds of the logits, None)."""
    graph = trace(net) if graph is None else graph
    found = last_linear(net, graph)
    if found is None:
        return None, None, interval_bounds(net, lower, upper, graph, rounding), None
    layer, features_node = found
    env = run_graph(net, graph, Box(lower, upper), until=features_node, rounding=rounding)
    features = env[features_node]
    if not _is_box(features):
        raise UnsupportedLayer("the network's output does not depend on its input")
    bias = layer.bias if layer.bias is not None else torch.zeros_like(layer.weight[:, 0])
    noise = None
    if rounding is not None:
        output = next(node for node in graph.graph.nodes if node.op == "output").args[0]
        env[output] = _affine_module(layer, features)
        noise = rounding.noise(net, output, env)
    return layer.weight, bias, features, noise


def logit_difference_lower_bounds(net: nn.Module, lower: torch.Tensor, upper: torch.Tensor,
                                  graph: fx.GraphModule | None = None, rounding=None) -> torch.Tensor:
    """[N, K, K]: entry (n, j, c) bounds z_j - z_c from below for every input of image n's box (0 where j = c).
    Through the final Linear layer's rows W_j - W_c when the network ends in one (exact given the box of that
    layer's input; with `rounding`, less that layer's own rounding of z_j and z_c), else from the logits' own
    intervals (lower_j - upper_c)."""
    weight, bias, box, noise = _final_layer(net, lower, upper, graph, rounding)
    if weight is None:
        bound = box.lower[:, :, None] - box.upper[:, None, :]
        return bound - torch.diag_embed(torch.diagonal(bound, dim1=1, dim2=2))
    centre, radius = box.centre, box.radius
    columns = []
    for c in range(len(weight)):
        difference = weight - weight[c]  # row j: W_j - W_c (row c is zero: the bound there is exactly 0)
        column = centre @ difference.T - radius @ difference.abs().T + (bias - bias[c])
        if noise is not None:
            column = column - (noise + noise[:, c:c + 1])
            column[:, c] = 0.0  # z_c - z_c is exactly 0
        columns.append(column)
    return torch.stack(columns, dim=2)


def centred_logit_upper_bounds(net: nn.Module, lower: torch.Tensor, upper: torch.Tensor,
                               graph: fx.GraphModule | None = None) -> torch.Tensor:
    """[N, K]: entry (n, j) bounds z_j - mean(z) from above for every input of image n's box (through the
    final Linear layer's centred rows when the network ends in one, else from the logits' intervals)."""
    weight, bias, box, _ = _final_layer(net, lower, upper, graph)
    if weight is None:
        num_classes = box.upper.shape[-1]
        others = box.lower.sum(-1, keepdim=True) - box.lower  # z_j - mean z = (1 - 1/K) z_j - sum_{i!=j} z_i / K
        return (1 - 1 / num_classes) * box.upper - others / num_classes
    weight, bias = weight - weight.mean(0, keepdim=True), bias - bias.mean()
    return box.centre @ weight.T + box.radius @ weight.abs().T + bias
