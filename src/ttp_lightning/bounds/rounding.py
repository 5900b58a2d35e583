"""The network people run rounds: its float32 forward pass, as an exact network with a bounded error added at every
operation that rounds, so that interval and linear bounds hold for it and not only for the exact function of the
weights.

Interval and linear bounds (propagate.py, linear.py) are computed in float64 for the real-number function of the
released weights. The released network runs in float32, whose rounding a forger can make count: two hidden units
with biases 2^24 and 2^24 - 1 cancel exactly but not in float32 (Jia & Rinard 2021, "Exploiting verified neural
networks via floating point numerical error"). Every operation v = op(inputs) the float network evaluates returns
op(its float inputs) + delta_v, and the standard error analysis of floating-point arithmetic (Higham, "Accuracy and
Stability of Numerical Algorithms", ch. 3) bounds |delta_v| <= D_v from the magnitude M of its inputs (u the unit
roundoff, 2^-24 for float32, gamma(n) = n u / (1 - n u)):

  dot products   Linear and Conv (n terms with the bias, in any order, with or without fused multiply-adds):
                 D = gamma(n + 1) (|W| M_in + |b|);
  BatchNorm      (eval) y = s x + t with s, t computed in float from the running statistics: D = 16 u (|s| (M_in +
                 |mean|) + |bias|) (a generous count of its half-dozen roundings);
  sums, means    average pooling, mean, sum of n numbers: gamma(n + 1) times the same reduction of M_in;
  one operation  addition, subtraction, multiplication or division by a constant: D = u M_out;
  libm           sigmoid, tanh, softplus, ELU: D = 4 u M_out (a library function within 2 ulp); leaky ReLU u M_out;
  exact          ReLU, max pooling, negation, flatten / view / indexing / concatenation round nothing: D = 0.

Each D also gets n times the dtype's smallest normal number (underflow). The float network is then the exact one
with an extra input delta_v in [-D_v, D_v] at each such operation: the interval pass widens v's box by D_v
(run_graph with `rounding`), and CROWN's backward pass gains -|A_v| . D_v at v (linear.LinearBounds), so the error
is weighed by the output's actual coefficient on it rather than amplified layer by layer. M comes from the boxes
of the float network itself (they include the earlier deltas). A magnitude beyond the dtype's largest finite
number (the float network may overflow) makes D infinite and the bound NaN, which never passes.

What it assumes, stated wherever the bound is reported: IEEE arithmetic rounding to nearest in the dtype or finer,
dot products accumulated in it (any order); not TF32 (PyTorch's default for convolutions on Ampere GPUs, u =
2^-11), not Winograd or FFT convolution, not a compiler that reassociates beyond a dot product. The float64
arithmetic of the bounds themselves rounds to nearest too; its errors have the same form with float64's u, so
twice that u is added to the precision's own (a margin for them, not a proof: the bounds are not computed with
directed rounding).
"""

import math
import operator

import torch
import torch.nn.functional as F
from torch import fx, nn

from ttp_lightning.bounds.propagate import ADDITIONS, Box, UnsupportedLayer, _batchnorm_affine, _is_box

PRECISIONS = ("float32", "float64", "bfloat16", "float16")  # what a release may be run in; the bound covers it
BOUND_ARITHMETIC = 2.0 * 2.0 ** -53  # added to u: the float64 arithmetic of the bounds themselves rounds too
BATCHNORM_OPERATIONS = 16  # roundings counted for an eval-mode BatchNorm (generous)
LIBM_ULPS = 4  # a transcendental function's error, in units of u (libm is within 2 ulp)
SOFTMAX_GAP = 100.0  # logit gaps above this contribute less than exp(-100) to a softmax (softmax_margin)

EXACT_MODULES = (nn.ReLU, nn.ReLU6, nn.Hardtanh, nn.Identity, nn.Dropout, nn.Flatten, nn.Unflatten, nn.MaxPool1d,
                 nn.MaxPool2d, nn.AdaptiveMaxPool2d)
EXACT_FUNCTIONS = {F.relu, torch.relu, F.relu6, F.hardtanh, F.max_pool1d, F.max_pool2d, F.adaptive_max_pool2d,
                   torch.flatten, torch.reshape, torch.cat, operator.getitem, torch.squeeze, torch.unsqueeze,
                   torch.permute, torch.transpose, F.dropout, operator.neg, torch.neg}
EXACT_METHODS = {"relu", "flatten", "view", "reshape", "permute", "transpose", "contiguous", "squeeze", "unsqueeze",
                 "expand", "clone", "view_as", "float", "to", "neg"}
LIBM_MODULES = (nn.Sigmoid, nn.Tanh, nn.Softplus, nn.ELU)
LIBM = {torch.sigmoid, torch.tanh, F.softplus, F.elu, "sigmoid", "tanh"}
ONE_ROUNDING = {*ADDITIONS, operator.sub, torch.sub, operator.mul, torch.mul, operator.truediv, torch.div,
                F.leaky_relu, "add", "add_", "__add__", "sub", "__sub__", "mul", "__mul__", "div", "__truediv__"}
AVERAGES = (nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)
AVERAGE_FUNCTIONS = {F.avg_pool1d, F.avg_pool2d, F.adaptive_avg_pool1d, F.adaptive_avg_pool2d}


def unit_roundoff(precision: str) -> float:
    """u of a precision name (PRECISIONS): half the distance from 1 to the next number."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}; choose one of {', '.join(PRECISIONS)}")
    return torch.finfo(getattr(torch, precision)).eps / 2


class Rounding:
    """The rounding error bound of one precision: `noise(net, node, env)` is D for one node of a graph whose
    inputs' boxes `env` holds (None where the operation is exact)."""

    def __init__(self, precision: str = "float32"):
        self.precision = precision
        self.unit = unit_roundoff(precision) + BOUND_ARITHMETIC
        info = torch.finfo(getattr(torch, precision))
        self.largest, self.tiny = float(info.max), float(info.tiny)

    def gamma(self, terms: int) -> float:
        """gamma(n) = n u / (1 - n u); infinite when n u >= 1 (no bound)."""
        product = terms * self.unit
        return product / (1 - product) if product < 1 else math.inf

    def noise(self, net: nn.Module, node: fx.Node, env: dict) -> torch.Tensor | None:
        """D_v >= |fl(op(inputs)) - op(inputs)| for every input in the boxes of `env` (infinite where the float
        network may overflow); None for an exact operation."""
        if not _is_box(env.get(node)):
            return None
        amount = self._amount(net, node, env)
        if amount is None:
            return None
        out = _magnitude(env[node]) + amount
        return torch.where(torch.isnan(amount) | (out > self.largest), torch.inf, amount)

    def _amount(self, net: nn.Module, node: fx.Node, env: dict) -> torch.Tensor | None:
        sources = [arg for arg in node.all_input_nodes if _is_box(env.get(arg))]
        result = _magnitude(env[node])
        if node.op == "call_module":
            return self._module(net.get_submodule(node.target), node, _magnitude(env[sources[0]]), result)
        target = node.target
        name = target if isinstance(target, str) else getattr(target, "__name__", str(target))
        if node.op == "call_function" and target in EXACT_FUNCTIONS or \
                node.op == "call_method" and target in EXACT_METHODS:
            return None
        if node.op == "call_function" and target in AVERAGE_FUNCTIONS or name in ("mean", "sum"):
            size = _reduced(node, env[sources[0]].lower, env[node].lower)
            return self.gamma(size + 1) * _replay(node, env, lambda arg: _magnitude(env[arg])) + size * self.tiny
        if target in ONE_ROUNDING:
            if "alpha" in node.kwargs:
                raise UnsupportedLayer(f"the rounding bound has no rule for {name} with alpha (node {node.name})")
            return self.unit * result + self.tiny
        if target in LIBM:
            return LIBM_ULPS * self.unit * result + self.tiny
        raise UnsupportedLayer(f"the rounding bound has no rule for {name} (node {node.name})")

    def _module(self, module: nn.Module, node: fx.Node, given: torch.Tensor, result: torch.Tensor):
        if isinstance(module, nn.Linear):
            terms = module.in_features + 1
            bias = module.bias.abs() if module.bias is not None else None
            return self.gamma(terms) * F.linear(given, module.weight.abs(), bias) + terms * self.tiny
        if isinstance(module, (nn.Conv1d, nn.Conv2d)):
            terms = module.in_channels // module.groups * math.prod(module.kernel_size) + 1
            bias = module.bias.abs() if module.bias is not None else None
            return self.gamma(terms) * module._conv_forward(given, module.weight.abs(), bias) + terms * self.tiny
        if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
            scale, _ = _batchnorm_affine(module)
            shape = (1, -1) + (1,) * (given.dim() - 2)
            scale = scale.abs().view(shape)
            offset = module.running_mean.abs().view(shape) * scale
            if module.bias is not None:
                offset = offset + module.bias.abs().view(shape)
            return BATCHNORM_OPERATIONS * (self.unit * (scale * given + offset) + self.tiny)
        if isinstance(module, EXACT_MODULES):
            return None
        if isinstance(module, AVERAGES):
            size = _module_window(module, given)
            return self.gamma(size + 1) * module(given) + size * self.tiny
        if isinstance(module, nn.LeakyReLU):
            return self.unit * result + self.tiny
        if isinstance(module, LIBM_MODULES):
            return LIBM_ULPS * self.unit * result + self.tiny
        raise UnsupportedLayer(f"the rounding bound has no rule for {type(module).__name__} (module {node.target})")


def softmax_margin(classes: int, unit: float) -> float:
    """The relative error of a float softmax's top probability: K exponentials of gaps z_j - max z (each gap rounded
    by u times itself, which moves its exponential by a factor e^(100 u) at most where the gap is within 100 and by
    less than e^-100 beyond), their sum and one division; the confidence bound is multiplied by 1 + this."""
    return 2 * (classes + 4) * unit + 2 * SOFTMAX_GAP * unit + classes * math.exp(-SOFTMAX_GAP)


def _magnitude(box: Box) -> torch.Tensor:
    return torch.maximum(box.lower.abs(), box.upper.abs())


def _replay(node: fx.Node, env: dict, value_of) -> torch.Tensor:
    """The node's own operation applied to `value_of(arg)` for each bounded input (and the graph's values else)."""
    def value(arg):
        if isinstance(arg, fx.Node):
            return value_of(arg) if _is_box(env.get(arg)) else env[arg]
        if isinstance(arg, (list, tuple)):
            return type(arg)(value(a) for a in arg)
        if isinstance(arg, dict):
            return {k: value(v) for k, v in arg.items()}
        return arg

    args, kwargs = value(node.args), value(node.kwargs)
    kwargs = {k: v for k, v in kwargs.items() if k != "inplace"}
    if node.op == "call_function":
        return node.target(*args, **kwargs)
    return getattr(args[0], node.target)(*args[1:], **kwargs)


def _module_window(module: nn.Module, value: torch.Tensor) -> int:
    """The number of inputs one output of an average pooling sums (at most)."""
    if isinstance(module, (nn.AvgPool1d, nn.AvgPool2d)):
        kernel = module.kernel_size
        return math.prod(kernel) if isinstance(kernel, tuple) else kernel ** (value.dim() - 2)
    return math.prod(value.shape[2:])  # adaptive: never more than the whole input


def _reduced(node: fx.Node, before: torch.Tensor, after: torch.Tensor) -> int:
    """How many numbers one output of a reduction sums: an average pooling's kernel when given, else at most the
    input's numbers per output."""
    if node.target in (F.avg_pool1d, F.avg_pool2d):
        kernel = node.kwargs.get("kernel_size", node.args[1] if len(node.args) > 1 else None)
        if kernel is not None:
            return math.prod(kernel) if isinstance(kernel, (tuple, list)) else kernel ** (before.dim() - 2)
    if node.target in AVERAGE_FUNCTIONS:
        return math.prod(before.shape[2:])
    return max(1, before.numel() // max(1, after.numel()))
