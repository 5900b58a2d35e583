"""How far the network people run (float32 arithmetic) can be from the network the bounds describe.

Interval and linear bounds (propagate.py, linear.py) bound the exact function of the released weights, computed
in float64. The released network runs in float32, whose rounding a forger can make count: two hidden units with
biases 2^24 and 2^24 - 1 cancel exactly but not in float32 (Jia & Rinard 2021, "Exploiting verified neural
networks via floating point numerical error"). This module bounds, for every input of an image's box and every
value v of the network's graph, the distance |v_float - v_exact| <= E_v, in one pass over the graph that follows
the standard error analysis of floating-point arithmetic (Higham, "Accuracy and Stability of Numerical
Algorithms", ch. 3), with u the unit roundoff (2^-24 for float32) and gamma(n) = n u / (1 - n u):

  dot products   Linear and Conv (n terms with the bias, in any order, with or without fused multiply-adds):
                 |fl(W y + b) - (W y + b)| <= gamma(n + 1) (|W| |y| + |b|), and the input's own error passes
                 through |W|: E_out = |W| E_in + gamma(n + 1) (|W| M_in + |b|);
  BatchNorm      (eval) y = s x + t with s, t computed in float from the running statistics: 16 u (|s| (M_in +
                 |mean|) + |bias|) on top of |s| E_in (a generous count of its half-dozen roundings);
  sums, means    average pooling, mean, sum: gamma(n + 1) times the same reduction of the magnitudes;
  one operation  addition, subtraction, multiplication or division by a constant: u times the result's
                 magnitude, the inputs' errors added (scaled by |constant|);
  exact          ReLU, max pooling, flatten / view / indexing / concatenation and the like round nothing and are
                 1-Lipschitz, so the error passes through them (the same operation applied to E);
  smooth         sigmoid (Lipschitz 1/4), tanh, softplus, ELU (alpha <= 1), leaky ReLU: their Lipschitz constant
                 times E_in plus 4 u times the result's magnitude (a libm function within 2 ulp).

M_v = max(|lower_v|, |upper_v|) + E_v bounds |v_float| from the exact bounds (the interval pass). Each term also
gets n times the dtype's smallest normal number (underflow). A magnitude beyond the dtype's largest finite number
(the float network may overflow) makes the error infinite, so the bound becomes vacuous, never wrong.

What it assumes, stated wherever the bound is reported: IEEE arithmetic with rounding to nearest in the dtype or
finer, dot products accumulated in it (any order); not TF32 (PyTorch's default for convolutions on Ampere GPUs,
u = 2^-11), not Winograd or FFT convolution, not a compiler that reassociates beyond a dot product. The float64
arithmetic of the bounds themselves rounds to nearest; its errors are of the same form with float64's u, so twice
that u is added to the precision's own (a margin for them, not a proof: the bounds are not computed with directed
rounding).
"""

import math
import operator

import torch
import torch.nn.functional as F
from torch import fx, nn

from ttp_lightning.ibp.propagate import (
    ADDITIONS,
    Box,
    UnsupportedLayer,
    _batchnorm_affine,
    _is_box,
    run_graph,
)

PRECISIONS = ("float32", "float64", "bfloat16", "float16")  # what a release may be run in; the bound covers it
BOUND_ARITHMETIC = 2.0 * 2.0 ** -53  # added to u: the float64 arithmetic of the bounds themselves rounds too
BATCHNORM_OPERATIONS = 16  # roundings counted for an eval-mode BatchNorm (generous)
LIBM_ULPS = 4  # a transcendental function's error, in units of u (libm is within 2 ulp)

EXACT_MODULES = (nn.ReLU, nn.ReLU6, nn.Hardtanh, nn.Identity, nn.Dropout, nn.Flatten, nn.Unflatten, nn.MaxPool1d,
                 nn.MaxPool2d, nn.AdaptiveMaxPool2d)
EXACT_FUNCTIONS = {F.relu, torch.relu, F.relu6, F.hardtanh, F.max_pool1d, F.max_pool2d, F.adaptive_max_pool2d,
                   torch.flatten, torch.reshape, torch.cat, operator.getitem, torch.squeeze, torch.unsqueeze,
                   torch.permute, torch.transpose, F.dropout}
EXACT_METHODS = {"relu", "flatten", "view", "reshape", "permute", "transpose", "contiguous", "squeeze", "unsqueeze",
                 "expand", "clone", "view_as"}
IDENTITY_METHODS = {"float", "to"}  # dtype conversions: the network runs in one dtype; the error stays as it is
ELEMENTWISE_EXACT = (nn.ReLU, nn.ReLU6, nn.Hardtanh)  # 1-Lipschitz elementwise: the error passes unchanged
AVERAGES = (nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)
AVERAGE_FUNCTIONS = {F.avg_pool1d, F.avg_pool2d, F.adaptive_avg_pool1d, F.adaptive_avg_pool2d}


def unit_roundoff(precision: str) -> float:
    """u of a precision name (PRECISIONS): half the distance from 1 to the next number."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}; choose one of {', '.join(PRECISIONS)}")
    return torch.finfo(getattr(torch, precision)).eps / 2


class Rounding:
    """The error pass of one network in one precision (its graph traced once, its weights those of `net`)."""

    def __init__(self, net: nn.Module, graph: fx.GraphModule, precision: str = "float32"):
        self.net, self.graph, self.precision = net, graph, precision
        self.unit = unit_roundoff(precision) + BOUND_ARITHMETIC
        info = torch.finfo(getattr(torch, precision))
        self.largest, self.tiny = float(info.max), float(info.tiny)

    def gamma(self, terms: int) -> float:
        """gamma(n) = n u / (1 - n u); infinite when n u >= 1 (no bound)."""
        product = terms * self.unit
        return product / (1 - product) if product < 1 else math.inf

    @torch.no_grad()
    def logit_errors(self, lower: torch.Tensor, upper: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """([N, K] E, [N, K] M): per image's box, a bound on |logits_float - logits_exact| and on |logits_float|."""
        env = run_graph(self.net, self.graph, Box(lower, upper))
        errors: dict = {}
        for node in self.graph.graph.nodes:
            value = env.get(node)
            if node.op == "output":
                last = node.args[0]
                if not (isinstance(last, fx.Node) and last in errors):
                    raise UnsupportedLayer("the network's output does not depend on its input")
                return errors[last], _magnitude(env[last]) + errors[last]
            if not _is_box(value):
                continue
            if node.op == "placeholder":
                errors[node] = torch.zeros_like(value.lower)
                continue
            error = self._node(node, env, errors)
            magnitude = _magnitude(value) + error
            # the float network may overflow, or an infinite error times a zero weight: no bound, never a wrong one
            error = torch.where(torch.isnan(error) | (magnitude > self.largest), torch.inf, error)
            errors[node] = error
        raise UnsupportedLayer("the network's graph has no output")

    # ------------------------------------------------------------------------------------------ one node
    def _node(self, node: fx.Node, env: dict, errors: dict) -> torch.Tensor:
        sources = [arg for arg in node.all_input_nodes if arg in errors]

        def error(arg):
            return errors[arg]

        def magnitude(arg):
            return _magnitude(env[arg]) + errors[arg]

        result = _magnitude(env[node])
        if node.op == "call_module":
            return self._module(node, self.net.get_submodule(node.target), sources, error, magnitude, result)
        target = node.target
        if node.op == "call_function" and target in EXACT_FUNCTIONS or \
                node.op == "call_method" and target in EXACT_METHODS:
            return self._replay(node, env, errors)
        if node.op == "call_method" and target in IDENTITY_METHODS:
            return error(sources[0])
        if node.op == "call_function" and target in AVERAGE_FUNCTIONS:
            size = _window(node, env[sources[0]].lower, env[node].lower)
            return self._replay(node, env, errors) + self.gamma(size + 1) * self._replay(node, env, errors, magnitude)
        name = target if isinstance(target, str) else getattr(target, "__name__", str(target))
        reduction = name in ("mean", "sum")
        if reduction:
            size = max(1, env[sources[0]].lower.numel() // max(1, env[node].lower.numel()))
            return self._replay(node, env, errors) + self.gamma(size + 1) * self._replay(node, env, errors, magnitude)
        return self._arithmetic(node, name, sources, env, error, magnitude, result)

    def _module(self, node, module, sources, error, magnitude, result) -> torch.Tensor:
        (source,) = sources[:1]
        if isinstance(module, nn.Linear):
            terms = module.in_features + 1
            bias = module.bias.abs() if module.bias is not None else None
            return F.linear(error(source), module.weight.abs()) + \
                self.gamma(terms) * F.linear(magnitude(source), module.weight.abs(), bias) + terms * self.tiny
        if isinstance(module, (nn.Conv1d, nn.Conv2d)):
            terms = module.in_channels // module.groups * math.prod(module.kernel_size) + 1
            bias = module.bias.abs() if module.bias is not None else None
            return module._conv_forward(error(source), module.weight.abs(), None) + \
                self.gamma(terms) * module._conv_forward(magnitude(source), module.weight.abs(), bias) + \
                terms * self.tiny
        if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
            scale, _ = _batchnorm_affine(module)
            shape = (1, -1) + (1,) * (error(source).dim() - 2)
            scale = scale.abs().view(shape)
            offset = module.running_mean.abs().view(shape) * scale
            if module.bias is not None:
                offset = offset + module.bias.abs().view(shape)
            return scale * error(source) + BATCHNORM_OPERATIONS * self.unit * (scale * magnitude(source) + offset) \
                + BATCHNORM_OPERATIONS * self.tiny
        if isinstance(module, ELEMENTWISE_EXACT):
            return error(source)
        if isinstance(module, EXACT_MODULES):
            return module(error(source))
        if isinstance(module, AVERAGES):
            size = _module_window(module, error(source))
            return module(error(source)) + self.gamma(size + 1) * module(magnitude(source))
        lipschitz = _lipschitz(module)
        if lipschitz is not None:
            return lipschitz * error(source) + LIBM_ULPS * self.unit * result + self.tiny
        raise UnsupportedLayer(f"the rounding bound has no rule for {type(module).__name__} (module {node.target})")

    def _arithmetic(self, node, name, sources, env, error, magnitude, result) -> torch.Tensor:
        target = node.target
        additive = target in ADDITIONS or name in ("add", "add_", "__add__", "sub", "__sub__", "neg") or \
            target in (operator.sub, torch.sub, operator.neg, torch.neg)
        if additive:
            if "alpha" in node.kwargs:
                raise UnsupportedLayer(f"the rounding bound has no rule for {name} with alpha (node {node.name})")
            total = sum(error(source) for source in sources)
            exact = name == "neg" or target in (operator.neg, torch.neg)
            return total if exact else total + self.unit * result + self.tiny
        if target in (operator.mul, torch.mul, operator.truediv, torch.div) or \
                name in ("mul", "__mul__", "div", "__truediv__"):
            (source,) = sources
            other = next(arg for arg in node.args if not (isinstance(arg, fx.Node) and arg is source))
            factor = torch.as_tensor(env[other] if isinstance(other, fx.Node) else other,
                                     dtype=result.dtype, device=result.device).abs()
            if target in (operator.truediv, torch.div) or name in ("div", "__truediv__"):
                factor = 1.0 / factor
            return factor * error(source) + self.unit * result + self.tiny
        function = {torch.sigmoid: 0.25, torch.tanh: 1.0, F.softplus: 1.0, "sigmoid": 0.25, "tanh": 1.0}.get(target)
        if function is not None:
            return function * error(sources[0]) + LIBM_ULPS * self.unit * result + self.tiny
        raise UnsupportedLayer(f"the rounding bound has no rule for {name} (node {node.name})")

    def _replay(self, node: fx.Node, env: dict, errors: dict, of=None) -> torch.Tensor:
        """The node's own operation applied to its inputs' errors (or to `of(arg)` per bounded input)."""
        def value(arg):
            if isinstance(arg, fx.Node):
                if arg in errors:
                    return errors[arg] if of is None else of(arg)
                return env[arg]
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


def _magnitude(box: Box) -> torch.Tensor:
    return torch.maximum(box.lower.abs(), box.upper.abs())


def _lipschitz(module: nn.Module) -> float | None:
    if isinstance(module, nn.Sigmoid):
        return 0.25
    if isinstance(module, (nn.Tanh, nn.Softplus)):
        return 1.0
    if isinstance(module, nn.ELU):
        return max(1.0, abs(module.alpha))
    if isinstance(module, nn.LeakyReLU):
        return max(1.0, abs(module.negative_slope))
    return None


def _module_window(module: nn.Module, value: torch.Tensor) -> int:
    """The number of inputs one output of an average pooling sums (at most)."""
    if isinstance(module, (nn.AvgPool1d, nn.AvgPool2d)):
        kernel = module.kernel_size
        return math.prod(kernel) if isinstance(kernel, tuple) else kernel ** (value.dim() - 2)
    return math.prod(value.shape[2:])  # adaptive: never more than the whole input


def _window(node: fx.Node, before: torch.Tensor, after: torch.Tensor) -> int:
    """An average pooling function's window: its kernel when given, else the whole input."""
    kernel = node.kwargs.get("kernel_size", node.args[1] if len(node.args) > 1 else None)
    if node.target in (F.avg_pool1d, F.avg_pool2d) and kernel is not None:
        return math.prod(kernel) if isinstance(kernel, (tuple, list)) else kernel ** (before.dim() - 2)
    return math.prod(before.shape[2:])


def widen(differences: torch.Tensor, errors: torch.Tensor, magnitudes: torch.Tensor, unit: float) -> torch.Tensor:
    """[N, K, K] lower bounds on z_j - z_c of the exact network, turned into ones of the float network's logits
    (each off by at most errors[n, j]) and of the softmax's own subtraction z_j - z_c (u times their magnitude)."""
    spread = errors[:, :, None] + errors[:, None, :] + unit * (magnitudes[:, :, None] + magnitudes[:, None, :])
    spread = spread - torch.diag_embed(torch.diagonal(spread, dim1=1, dim2=2))  # z_c - z_c is exactly 0
    return torch.nan_to_num(differences - spread, nan=-torch.inf)


def softmax_margin(classes: int, unit: float) -> float:
    """The relative error of a float softmax's top probability: K exponentials summed, one division, within
    (K + 4) u of the exact one (so the confidence bound is multiplied by 1 + 2 (K + 4) u)."""
    return 2 * (classes + 4) * unit
