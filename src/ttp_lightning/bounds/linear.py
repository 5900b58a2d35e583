"""Linear bound propagation (CROWN; Zhang et al. 2018) through a network's traced graph.

Interval bounds (propagate.py) lose the correlation between a layer's inputs at every layer, so through a deep or
BatchNorm network they grow far faster than the network's true range. CROWN keeps it: a lower bound on a linear
function c . f(x) of the network's output is carried backwards as a linear function A . v + b of each value v in
the graph, and only at the input is it concretised over the box (the minimum of A . x over lower <= x <= upper is
A . centre - |A| . radius). Two kinds of operation cover the supported layers:

  affine   Linear, Conv1d/2d, BatchNorm in eval mode, average and adaptive-average pooling, flatten / view /
           reshape / indexing / concatenation, mean and sum, residual additions, subtraction, negation,
           multiplication or division by a constant: A passes backwards through the operation's transpose (its
           vector-Jacobian product, which autograd computes exactly for an affine map) and b gains A . h(0);
  ReLU     relaxed by two lines over each unstable neuron's pre-activation interval [l, u] (l < 0 < u): above by
           the chord u (z - l) / (u - l), below by a z with a = 1 when u > -l, else 0 (CROWN's adaptive choice); a
           neuron with l >= 0 passes A through, one with u <= 0 stops it. A lower bound takes the lower line where
           A is positive and the chord where A is negative.
  max pool (2-d, floor mode) relaxed per window: below by its input j with the largest lower bound (max >= x_j),
           above by x_j itself where that input dominates the window (l_j >= u_i for every other i: the max is
           x_j), else by the constant max_i u_i. Overlapping windows sum their coefficients (fold).

The ReLUs' pre-activation intervals come first, in the graph's order: each from the interval pass and, with
`intermediate="crown"`, from a backward pass of its own (every neuron a specification, in chunks that bound the
memory), the tighter of the two at every neuron. `intermediate="ibp"` keeps the interval ones (CROWN-IBP:
cheaper on convolutional networks, looser). A [C, H, W] layer's passes start one position at a time (TILE) and
carry only the receptive field's window of each earlier layer while the layers keep one (bounds/windows.py): the
same numbers as the dense coefficients, at a fraction of the cost on images larger than the receptive fields; a
layer with few unstable neurons per position runs many positions a pass, each its own window (PATCHES_BELOW).
The final bounds are intersected with the interval bounds, so they
are never looser. A layer without a rule (adaptive or ceil-mode max pooling, GELU, softmax, attention, a product of
two bounded values) raises UnsupportedLayer naming it.

Arithmetic is the network's own dtype (callers use float64). With `rounding` (bounds.rounding) the bounds are those
of the network evaluated in float32 (or the precision given): every rounding operation adds a delta in [-D, D],
which the interval pass adds to its box and the backward pass to its constant (-|A| . D).
"""

import contextvars
import operator
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.func import vjp, vmap
from torch.nn.modules.utils import _pair

from ttp_lightning.bounds.propagate import ADDITIONS, Box, UnsupportedLayer, _is_box, run_graph, trace
from ttp_lightning.bounds.propagate import centred_logit_upper_bounds as interval_centred
from ttp_lightning.bounds.propagate import logit_difference_lower_bounds as interval_differences
from ttp_lightning.bounds.windows import WINDOWED, Patches, Window, merge, module_rule

AFFINE_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.BatchNorm1d, nn.BatchNorm2d, nn.AvgPool1d, nn.AvgPool2d,
                  nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.Flatten, nn.Unflatten, nn.Identity, nn.Dropout)
AFFINE_FUNCTIONS = {
    *ADDITIONS, operator.sub, torch.sub, operator.neg, torch.neg, operator.mul, torch.mul, operator.truediv,
    torch.div, torch.flatten, torch.reshape, torch.cat, torch.mean, torch.sum, operator.getitem, torch.squeeze,
    torch.unsqueeze, torch.permute, torch.transpose, F.avg_pool1d, F.avg_pool2d, F.adaptive_avg_pool1d,
    F.adaptive_avg_pool2d,
}
AFFINE_METHODS = {"flatten", "view", "reshape", "mean", "sum", "permute", "transpose", "contiguous", "squeeze",
                  "unsqueeze", "clone", "view_as", "add", "__add__", "sub", "__sub__", "mul", "__mul__", "div",
                  "__truediv__", "neg"}
OUT_OF_PLACE = {operator.iadd: operator.add}  # evaluated on fresh inputs, never in place
PRODUCTS = {operator.mul, torch.mul, "mul", "__mul__"}
QUOTIENTS = {operator.truediv, torch.div, "div", "__truediv__"}
# elementwise with constants (check_affine refuses a product of two bounded values and a bounded divisor)
ELEMENTWISE = {*ADDITIONS, operator.sub, torch.sub, operator.neg, torch.neg, *PRODUCTS, *QUOTIENTS, "add", "__add__",
               "sub", "__sub__", "neg"}
LINEAR_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d)
ELEMENTWISE_MODULES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.Identity, nn.Dropout)  # in eval mode (check_affine)
INTERMEDIATE = ("crown", "ibp")
# intermediate=auto: crown while a network has at most this many neurons per image behind a ReLU feeding another
# (a digits ResNet8 at width 16 has 3,584: about 16 s per image on 2 cores, where intervals prove none of what
# crown proves at 2/255; an MNIST one 43,904), else ibp
INTERMEDIATE_BUDGET = 4096
SLOPE_STEPS = 20  # alpha-CROWN's Adam steps on the final bounds' ReLU slopes (Prover: with intermediate=crown)
# numbers (float64: 16 MiB) one coefficient tensor of a backward pass may hold: more passes of smaller tensors
# were faster, not slower, on a CPU (the intermediate bounds of an initialised MNIST-sized ResNet8 at 1/255, one
# thread: 138 s at 16 Mi numbers, 54 s at 2 Mi) and the resident memory stayed under 1 GiB
MEMORY = 2 << 20
# a convolutional layer's intermediate bounds: the passes of each tile x tile square of positions start from a
# window (bounds/windows.py); 0 turns windows off. Full CROWN on an MNIST ResNet8 (width 16) at 2/255, 2 threads:
# 8.0 s an image at 1, 9.5 at 2, 15.5 at 4, 30.6 at 7 and 65 s dense, with the same bounds (more positions per pass
# share one window, the union of their receptive fields)
TILE = 1
# with tiles of one position: a layer with fewer unstable neurons than this per position runs its passes as
# Patches (bounds/windows.py: many positions a pass, each its own window) instead of one position a pass. A
# pass's fixed cost (about 1-2 ms) dominates where each position has a few neurons to bound; where it has many,
# one shared window per position costs less than one per neuron (cropped at the image's edge, its bounds read
# once). ERM ResNet8 on MNIST at 0.25/255, one image, 2 threads: the 28 x 28 layers (0.6 and 2.8 a position)
# 0.03 + 0.25 s as patches where they took 0.56 + 1.41 s; the 14 x 14 (25, 28) and 7 x 7 (40, 61) layers took
# 2-3 times as long as patches as by position
PATCHES_BELOW = 8
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("linear_bounds_deadline", default=None)


class OverBudget(Exception):
    """A linear bound ran past the deadline set by `deadline` (bounds.choice stops trying a bound that costs more
    than its budget): no bound was computed, none is claimed."""


@contextmanager
def deadline(seconds: float | None):
    """Inside the block a linear bound that runs longer than `seconds` (None: no limit) stops with OverBudget,
    checked between its backward passes."""
    token = _DEADLINE.set(None if seconds is None else time.perf_counter() + float(seconds))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _check_deadline() -> None:
    limit = _DEADLINE.get()
    if limit is not None and time.perf_counter() > limit:
        raise OverBudget("past the time allowed")


def is_relu(net: nn.Module, node: fx.Node) -> bool:
    if node.op == "call_module":
        return isinstance(net.get_submodule(node.target), nn.ReLU)
    if node.op == "call_function":
        return node.target in (F.relu, torch.relu)
    return node.op == "call_method" and node.target == "relu"


@dataclass(frozen=True)
class MaxPool:
    """A 2-d max pooling's windows (floor mode), each as a pair."""
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]

    def windows(self, values: torch.Tensor) -> torch.Tensor:
        """[B, C, H, W] -> [B, C, window size, windows]; padding is -inf (never a window's maximum)."""
        (pad_h, pad_w), (batch, channels) = self.padding, values.shape[:2]
        padded = F.pad(values, (pad_w, pad_w, pad_h, pad_h), value=-torch.inf)
        columns = F.unfold(padded, self.kernel, dilation=self.dilation, stride=self.stride)
        return columns.view(batch, channels, self.kernel[0] * self.kernel[1], -1)

    def fold(self, columns: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        """The transpose of `windows`: [B, C, window size, windows] summed back onto [B, C, *size]."""
        (pad_h, pad_w), batch = self.padding, columns.shape[0]
        padded = F.fold(columns.reshape(batch, -1, columns.shape[-1]), (size[0] + 2 * pad_h, size[1] + 2 * pad_w),
                        self.kernel, dilation=self.dilation, stride=self.stride)
        return padded[:, :, pad_h:pad_h + size[0], pad_w:pad_w + size[1]]


def max_pool(net: nn.Module, node: fx.Node) -> MaxPool | None:
    """The node's MaxPool when it is a 2-d max pooling (nn.MaxPool2d or F.max_pool2d), None when it is not one;
    UnsupportedLayer for the ceil-mode and index-returning forms."""
    if node.op == "call_module" and isinstance(net.get_submodule(node.target), nn.MaxPool2d):
        module = net.get_submodule(node.target)
        kernel, stride, padding, dilation, ceil, indices = (module.kernel_size, module.stride, module.padding,
                                                            module.dilation, module.ceil_mode, module.return_indices)
    elif node.op == "call_function" and node.target is F.max_pool2d:
        names = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
        given = {**dict(zip(names, node.args)), **node.kwargs}
        kernel, padding, dilation = given["kernel_size"], given.get("padding", 0), given.get("dilation", 1)
        stride = given.get("stride") or kernel
        ceil, indices = given.get("ceil_mode", False), given.get("return_indices", False)
    else:
        return None
    if ceil or indices:
        raise UnsupportedLayer(f"linear bounds have no rule for max pooling with "
                               f"{'ceil_mode' if ceil else 'return_indices'}=True (node {node.name})")
    return MaxPool(_pair(kernel), _pair(stride), _pair(padding), _pair(dilation))


def check_affine(net: nn.Module, node: fx.Node, bounded: list[fx.Node]) -> None:
    """UnsupportedLayer (naming it) unless `node` is affine in its `bounded` inputs."""
    if node.op == "call_module":
        module = net.get_submodule(node.target)
        needs_eval = isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d, nn.Dropout)) and module.training
        if isinstance(module, AFFINE_MODULES) and not needs_eval:
            return
        raise UnsupportedLayer(f"linear bounds have no rule for {type(module).__name__}"
                               f"{' in training mode' if needs_eval else ''} (module {node.target})")
    known = node.target in AFFINE_FUNCTIONS if node.op == "call_function" else \
        node.op == "call_method" and node.target in AFFINE_METHODS
    if not known:
        raise UnsupportedLayer(f"linear bounds have no rule for {getattr(node.target, '__name__', node.target)} "
                               f"(node {node.name})")
    if node.target in PRODUCTS and len(bounded) > 1:
        raise UnsupportedLayer(f"linear bounds have no rule for a product of two bounded values (node {node.name})")
    if node.target in QUOTIENTS and (len(node.args) < 2 or node.args[1] in bounded):
        raise UnsupportedLayer(f"linear bounds have no rule for division by a bounded value (node {node.name})")


class LinearBounds:
    """CROWN over one network's traced graph for one batch of input boxes. `lower_bound(node, spec)` bounds
    spec . node from below; `bounds(node)` is a node's tightest elementwise Box (a ReLU input's tightened by its
    own backward passes, computed once, on first use)."""

    def __init__(self, net: nn.Module, lower: torch.Tensor, upper: torch.Tensor, graph: fx.GraphModule | None = None,
                 intermediate: str = "crown", memory: int = MEMORY, rounding=None, tile: int | None = None):
        if intermediate not in INTERMEDIATE:
            raise ValueError(f"intermediate={intermediate!r}; choose one of {', '.join(INTERMEDIATE)}")
        self.net, self.graph = net, trace(net) if graph is None else graph
        self.intermediate, self.memory, self.rounding = intermediate, memory, rounding
        # a convolutional layer's intermediate bounds in windows of tile x tile positions (0: dense coefficients;
        # None: TILE, read when called)
        self.tile = TILE if tile is None else tile
        self.noise: dict[fx.Node, torch.Tensor] = {}  # with `rounding`: each rounding operation's error bound D
        # the interval pass: every node's Box (of the network evaluated in `rounding`'s precision, when given)
        self.env = run_graph(net, self.graph, Box(lower, upper), rounding=rounding, noise=self.noise)
        self.nodes = list(self.graph.graph.nodes)
        self.input = next(node for node in self.nodes if node.op == "placeholder")
        self.output = next(node for node in self.nodes if node.op == "output").args[0]
        self.bounded = {node for node in self.nodes if _is_box(self.env.get(node)) and node.op != "output"}
        self.position = {node: i for i, node in enumerate(self.nodes)}
        self.tightened: dict[fx.Node, Box] = {}
        self.slopes: dict[fx.Node, torch.Tensor] | None = None  # alpha-CROWN's lower slopes, by ReLU input
        self.pools = {node: pool for node in self.nodes if node in self.bounded and (pool := max_pool(net, node))}
        for node in self.nodes:
            if node in self.bounded and node is not self.input and not is_relu(net, node) and node not in self.pools:
                check_affine(net, node, self.sources(node))

    def sources(self, node: fx.Node) -> list[fx.Node]:
        """The node's inputs that depend on the network's input, in order."""
        return [arg for arg in node.all_input_nodes if arg in self.bounded]

    def chunk(self, images: int) -> int:
        """Specifications per backward pass, so that its largest coefficient tensor stays within `memory`."""
        largest = max(self.env[node].lower[0].numel() for node in self.bounded)
        return max(1, self.memory // max(1, images * largest))

    # ------------------------------------------------------------------------------- the ReLUs' intervals
    def bounds(self, node: fx.Node) -> Box:
        """A ReLU input's pre-activation bounds: the interval pass rerun from the bounds already tightened
        before it, then, for the neurons still unstable in some image (the only ones whose relaxation the
        bounds' values change), CROWN's, the tighter of the two at every neuron."""
        if node in self.tightened:
            return self.tightened[node]
        box = self.env[node]
        if self.intermediate == "ibp" or node is self.input:
            return box
        if self.exact_by_intervals(node):  # kept, so that each ReLU pass through it does not walk the graph again
            self.tightened[node] = box
            return box
        refined = run_graph(self.net, self.graph, self.env[self.input], until=node, known=self.tightened,
                            rounding=self.rounding)[node]
        box = Box(torch.maximum(box.lower, refined.lower), torch.minimum(box.upper, refined.upper))
        flat_lower, flat_upper = box.lower.flatten(1).clone(), box.upper.flatten(1).clone()
        unstable = ((flat_lower < 0) & (flat_upper > 0)).any(0).nonzero().flatten()
        positions = box.lower.shape[-2] * box.lower.shape[-1] if box.lower.dim() == 4 else 0  # [N, C, H, W]
        if self.tile == 1 and positions and len(unstable) < PATCHES_BELOW * positions:
            self._patched(node, unstable, flat_lower, flat_upper)
        elif self.tile and positions:
            self._tiled(node, unstable, flat_lower, flat_upper)
        else:
            self._dense(node, unstable, flat_lower, flat_upper)
        self.tightened[node] = Box(flat_lower.view_as(box.lower), flat_upper.view_as(box.upper))
        return self.tightened[node]

    def exact_by_intervals(self, node: fx.Node) -> bool:
        """Whether the interval pass's box of `node` is already its range over the input box, so that backward
        passes cannot tighten it: one Linear or convolution between the input and it, every other step
        elementwise (BatchNorm in eval mode, identity, dropout in eval mode, a constant added, subtracted,
        multiplied or divided by, as the input's normalisation). Interval arithmetic is exact on one
        affine map of a box (each output's minimum is c . centre - |c| . radius, as CROWN's pass gives) and on
        elementwise affine maps before and after it: a network's first ReLU, which CROWN took 0.7 s an image to
        bound again on an MNIST ResNet8."""
        crossed = False
        while node is not self.input:
            sources = self.sources(node)
            module = self.net.get_submodule(node.target) if node.op == "call_module" else None
            if len(sources) != 1 or module is not None and len(node.all_input_nodes) != 1:
                return False
            if isinstance(module, LINEAR_MODULES) and not crossed:
                crossed = True
            elif not (isinstance(module, ELEMENTWISE_MODULES) if module is not None else node.target in ELEMENTWISE):
                return False
            elif self.env[node].lower.shape != self.env[sources[0]].lower.shape:
                return False  # broadcast: copies of one value, which a later linear map sums as if independent
            node = sources[0]
        return True

    def _dense(self, node: fx.Node, unstable: torch.Tensor, flat_lower: torch.Tensor, flat_upper: torch.Tensor
               ) -> None:
        """bounds' backward passes over the whole layer, `chunk` neurons a pass; `flat_lower` and `flat_upper`
        ([N, neurons]) are tightened in place."""
        (images, count), shape = flat_lower.shape, self.env[node].lower.shape[1:]
        step = self.chunk(images)
        for start in range(0, len(unstable), step):
            _check_deadline()
            rows = unstable[start:start + step]
            spec = torch.zeros(len(rows), images, count, dtype=flat_lower.dtype, device=flat_lower.device)
            spec[torch.arange(len(rows)), :, rows] = 1.0
            spec = spec.view(len(rows), images, *shape)
            flat_lower[:, rows] = torch.maximum(flat_lower[:, rows], self.lower_bound(node, spec).T)
            flat_upper[:, rows] = torch.minimum(flat_upper[:, rows], -self.lower_bound(node, -spec).T)

    def _tiled(self, node: fx.Node, unstable: torch.Tensor, flat_lower: torch.Tensor, flat_upper: torch.Tensor
               ) -> None:
        """bounds' backward passes for a [C, H, W] layer, tile by tile: the unstable neurons of each `tile` x
        `tile` square of positions (every channel) in passes that start from a Window of that square, both
        signs in one pass; `flat_lower` and `flat_upper` ([N, C * H * W]) are tightened in place."""
        images, (channels, height, width) = flat_lower.shape[0], self.env[node].lower.shape[1:]
        channel, row, column = unstable // (height * width), unstable // width % height, unstable % width
        across = -(-width // self.tile)  # tiles in a row
        tiles = (row // self.tile) * across + column // self.tile
        order = torch.argsort(tiles, stable=True)
        step = max(1, self.chunk(images) // 2)
        for tile in torch.unique_consecutive(tiles[order]).tolist():
            members = order[tiles[order] == tile]
            top, left = (tile // across) * self.tile, (tile % across) * self.tile
            size = (min(self.tile, height - top), min(self.tile, width - left))
            for start in range(0, len(members), step):
                _check_deadline()
                chosen = members[start:start + step]
                count = len(chosen)
                spec = torch.zeros(2 * count, images, channels, *size, dtype=flat_lower.dtype,
                                   device=flat_lower.device)
                index = torch.arange(count)
                spec[index, :, channel[chosen], row[chosen] - top, column[chosen] - left] = 1.0
                spec[index + count, :, channel[chosen], row[chosen] - top, column[chosen] - left] = -1.0
                self._tighten(flat_lower, flat_upper, unstable[chosen], self.lower_bound(node, Window(spec, top, left)))

    def _patched(self, node: fx.Node, unstable: torch.Tensor, flat_lower: torch.Tensor, flat_upper: torch.Tensor
                 ) -> None:
        """bounds' backward passes for a [C, H, W] layer, each neuron's from the 1 x 1 window of its position
        (bounds.windows.Patches), many neurons at any positions in one pass, both signs in it; `flat_lower` and
        `flat_upper` ([N, C * H * W]) are tightened in place."""
        images, (channels, height, width) = flat_lower.shape[0], self.env[node].lower.shape[1:]
        channel, row, column = unstable // (height * width), unstable // width % height, unstable % width
        step = max(1, self.chunk(images) // 2)
        for start in range(0, len(unstable), step):
            _check_deadline()
            chosen = slice(start, start + step)
            count = len(unstable[chosen])
            spec = torch.zeros(2 * count, images, channels, 1, 1, dtype=flat_lower.dtype, device=flat_lower.device)
            index = torch.arange(count)
            spec[index, :, channel[chosen], 0, 0] = 1.0
            spec[index + count, :, channel[chosen], 0, 0] = -1.0
            bound = self.lower_bound(node, Patches(spec, row[chosen].repeat(2), column[chosen].repeat(2)))
            self._tighten(flat_lower, flat_upper, unstable[chosen], bound)

    @staticmethod
    def _tighten(flat_lower: torch.Tensor, flat_upper: torch.Tensor, rows: torch.Tensor, bound: torch.Tensor
                 ) -> None:
        """Tightens the neurons `rows` of [N, neurons] bounds in place from a pass's [2 len(rows), N] lower bounds:
        first on +neuron (its lower bound), then on -neuron (minus its upper bound)."""
        count = len(rows)
        flat_lower[:, rows] = torch.maximum(flat_lower[:, rows], bound[:count].T)
        flat_upper[:, rows] = torch.minimum(flat_upper[:, rows], -bound[count:].T)

    # ------------------------------------------------------------------------------- the backward pass
    def lower_bound(self, target: fx.Node, spec: torch.Tensor | Window | Patches) -> torch.Tensor:
        """[S, N]: for each specification s, a lower bound on sum(spec[s, n] * target[n]) over image n's box
        (spec: [S, N, *target's shape per image], or a Window or Patches of a 4-d target's coefficients)."""
        coefficients = {target: spec}
        first = spec.weights if isinstance(spec, WINDOWED) else spec
        constant = torch.zeros(first.shape[:2], dtype=first.dtype, device=first.device)
        for node in sorted(self._ancestors(target), key=self.position.get, reverse=True):
            if node is self.input or node not in coefficients:
                continue
            weights = coefficients.pop(node)
            if isinstance(weights, WINDOWED) and not self._keeps_window(node):
                weights = weights.dense(tuple(self.env[node].lower.shape[-2:]))
            if node in self.noise:  # the float network adds delta in [-D, D] here: the worst case is -|A| . D
                noise = self.noise[node].expand_as(self.env[node].lower)
                constant = constant - (weights.abs().dot(noise) if isinstance(weights, WINDOWED)
                                       else (weights.abs() * noise).sum(tuple(range(2, weights.dim()))))
            gained, passed = self._backward(node, weights)
            constant = constant + gained
            for source, weights_in in passed.items():
                self._add_to(coefficients, source, weights_in)
        weights = coefficients.get(self.input)
        if weights is None:  # the target does not depend on the input
            return constant
        box = self.env[self.input]
        if isinstance(weights, WINDOWED):
            return constant + weights.dot(box.centre) - weights.abs().dot(box.radius)
        dims = tuple(range(2, weights.dim()))
        return constant + (weights * box.centre).sum(dims) - (weights.abs() * box.radius).sum(dims)

    def _backward(self, node: fx.Node, weights: torch.Tensor | Window | Patches) -> tuple[torch.Tensor, dict]:
        """(the constant gained, {source: its coefficients}) for a lower bound, through one node."""
        if is_relu(self.net, node):
            (source,) = self.sources(node)
            if isinstance(weights, Patches):  # an intermediate bound's pass: CROWN's own slopes
                return self._through_relu_patches(source, weights)
            if isinstance(weights, Window):
                passed, gained = self._through_relu(source, weights.weights, weights.take)
                return gained, {source: weights.like(passed)}
            passed, gained = self._through_relu(source, weights)
            return gained, {source: passed}
        if node in self.pools:
            source = self.sources(node)[0]
            passed, gained = self._through_max_pool(node, source, weights)
            return gained, {source: passed}
        if isinstance(weights, WINDOWED):
            sources = self.sources(node)
            if node.op != "call_module":  # a residual addition: each summand has the sum's coefficients
                return weights.no_constant(), {source: weights for source in sources}
            module = self.net.get_submodule(node.target)
            gained, passed = module_rule(module)(module, weights, tuple(self.env[sources[0]].lower.shape[-2:]))
            return gained, {sources[0]: passed}
        offset, passed = self._through_affine(node, weights)
        return offset, passed

    def _keeps_window(self, node: fx.Node) -> bool:
        """Whether windows.py has the node's exact transpose on a window (else it takes dense coefficients)."""
        if is_relu(self.net, node):
            return self.env[node].lower.dim() == 4
        if node.op == "call_module":
            return module_rule(self.net.get_submodule(node.target)) is not None
        if node.op == "call_function" and node.target in ADDITIONS or \
                node.op == "call_method" and node.target in ("add", "__add__"):
            sources = self.sources(node)
            # a sum of exactly its bounded inputs (no constant, no alpha) of one shape
            return (len(node.args) == 2 and not node.kwargs and all(arg in sources for arg in node.args)
                    and all(self.env[arg].lower.shape == self.env[node].lower.shape for arg in sources))
        return False

    def _add_to(self, coefficients: dict, node: fx.Node, weights: torch.Tensor | Window | Patches) -> None:
        if node not in coefficients:
            coefficients[node] = weights
            return
        held = coefficients[node]
        if isinstance(held, WINDOWED) and isinstance(weights, WINDOWED) and \
                (merged := merge(held, weights)) is not None:
            coefficients[node] = merged
            return
        size = tuple(self.env[node].lower.shape[-2:])
        coefficients[node] = (held.dense(size) if isinstance(held, WINDOWED) else held) + \
            (weights.dense(size) if isinstance(weights, WINDOWED) else weights)

    def optimised_lower_bound(self, target: fx.Node, spec: torch.Tensor, steps: int = 20,
                              rate: float = 0.1) -> torch.Tensor:
        """lower_bound with alpha-CROWN's optimised slopes (Xu et al. 2021): each unstable ReLU's lower line
        a z may take any slope a in [0, 1] (a z <= relu(z) there), one per specification, image and neuron;
        `steps` of Adam raise the bound from CROWN's adaptive choice, and the best bound met is returned (every
        one is valid, so it is never looser than CROWN's). The ReLUs' intervals stay those of `bounds`."""
        inputs = [self.sources(node)[0] for node in self._ancestors(target) if is_relu(self.net, node)]
        for source in sorted(inputs, key=self.position.get):
            self.bounds(source)  # every interval fixed first, with CROWN's own slopes
        best = self.lower_bound(target, spec)
        if steps <= 0 or not inputs:
            return best
        slopes = {}
        for source in inputs:
            box = self.bounds(source)
            initial = (box.upper > -box.lower).to(spec.dtype)
            slopes[source] = initial.expand(len(spec), *initial.shape).clone().requires_grad_(True)
        optimiser = torch.optim.Adam(list(slopes.values()), lr=rate)
        self.slopes = slopes
        try:
            for _ in range(steps):
                _check_deadline()
                with torch.enable_grad():
                    bound = self.lower_bound(target, spec)
                    if not bound.requires_grad:  # every ReLU stable: no slope to optimise
                        return torch.maximum(best, bound)
                    gradients = torch.autograd.grad(-bound.sum(), list(slopes.values()), allow_unused=True)
                best = torch.maximum(best, bound.detach())
                for value, gradient in zip(slopes.values(), gradients):
                    value.grad = torch.zeros_like(value) if gradient is None else gradient
                optimiser.step()
                with torch.no_grad():
                    for value in slopes.values():
                        value.clamp_(0.0, 1.0)
            return torch.maximum(best, self.lower_bound(target, spec))
        finally:
            self.slopes = None

    def _ancestors(self, target: fx.Node) -> set:
        found, stack = set(), [target]
        while stack:
            node = stack.pop()
            if node not in found and node in self.bounded:
                found.add(node)
                stack.extend(node.all_input_nodes)
        return found

    @staticmethod
    def _chord(low: torch.Tensor, high: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(unstable, chord): where l < 0 < u, and the slope each neuron passes a negative coefficient with (the
        upper line's: u / (u - l) where unstable, else 1 where active and 0 where inactive)."""
        unstable, active = (low < 0) & (high > 0), (low >= 0).to(low.dtype)
        return unstable, torch.where(unstable, high / (high - low).clamp(min=torch.finfo(low.dtype).tiny), active)

    def _through_relu(self, source: fx.Node, weights: torch.Tensor, take=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(the coefficients of the ReLU's input, the constant gained) for a lower bound; `take` (a Window's)
        cuts the bounds and slopes to the window that `weights` cover."""
        box, take = self.bounds(source), take or (lambda value: value)
        low, high = take(box.lower), take(box.upper)
        unstable, chord = self._chord(low, high)
        # a stable neuron passes its coefficient times 1 (active) or 0, with no constant: one product over the
        # whole tensor; only the neurons unstable in some image get the lower line's slope and the chord's
        # intercept, read at those positions alone (most neurons are stable: the pass costs what they cost)
        columns = unstable.flatten(1).any(0).nonzero().flatten()
        passed = weights * chord
        if not len(columns):
            return passed, torch.zeros(weights.shape[:2], dtype=weights.dtype, device=weights.device)
        slope = (high > -low).to(low.dtype) if self.slopes is None else take(self.slopes[source])
        chord_u, low_u = chord.flatten(1)[:, columns], low.flatten(1)[:, columns]
        slope_u = slope.flatten(slope.dim() - low.dim() + 1)[..., columns]
        weights_u = weights.flatten(2)[..., columns]  # [S, N, U]
        unstable_u = unstable.flatten(1)[:, columns]  # a column may be stable in some images
        below_u = torch.where(unstable_u, slope_u, chord_u)
        intercept_u = torch.where(unstable_u, -chord_u * low_u, torch.zeros_like(low_u))
        correction = weights_u.clamp(min=0) * (below_u - chord_u)  # positive weights take the lower line
        passed = passed.flatten(2).index_add(2, columns, correction).view_as(weights)
        return passed, (weights_u.clamp(max=0) * intercept_u).sum(-1)

    def _through_relu_patches(self, source: fx.Node, weights: Patches) -> tuple[torch.Tensor, dict]:
        """_through_relu for Patches, with CROWN's own slopes (Patches carry only intermediate bounds' passes,
        which alpha-CROWN leaves as CROWN's): each specification's rectangle of the bounds, every neuron
        elementwise (past the layer's edge the bounds read 0 and the coefficients are 0)."""
        box = self.bounds(source)
        low, high = weights.take(box.lower), weights.take(box.upper)  # [S, N, C, h, w]
        unstable, chord = self._chord(low, high)
        below = torch.where(unstable, (high > -low).to(low.dtype), chord)  # stable: chord is 1 or 0 too
        positive, negative = weights.weights.clamp(min=0), weights.weights.clamp(max=0)
        gained = (negative * torch.where(unstable, -chord * low, torch.zeros_like(low))).sum(dim=(2, 3, 4))
        return gained, {source: weights.like(positive * below + negative * chord)}

    def _value_box(self, node: fx.Node) -> Box:
        """A node's elementwise bounds: a ReLU's output from its input's tightened bounds, else the interval pass's."""
        box = self.env[node]
        if is_relu(self.net, node):
            inner = self.bounds(self.sources(node)[0])
            box = Box(torch.maximum(box.lower, inner.lower.clamp(min=0)), torch.minimum(box.upper, inner.upper.clamp(min=0)))
        return box

    def _through_max_pool(self, node: fx.Node, source: fx.Node, weights: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the coefficients of the pooling's input, the constant gained) for a lower bound: positive weights
        take the window's input with the largest lower bound (a line below the max), negative ones the same input
        where it dominates its window and the window's largest upper bound (a constant above the max) elsewhere."""
        pool, box = self.pools[node], self._value_box(source)
        lower, upper = pool.windows(box.lower), pool.windows(box.upper)  # [N, C, window, L]
        best, chosen = lower.max(dim=2, keepdim=True)
        others = upper.scatter(2, chosen, -torch.inf).amax(dim=2, keepdim=True)
        dominant, ceiling = best >= others, upper.amax(dim=2, keepdim=True)  # [N, C, 1, L]
        specs, images, channels = weights.shape[:3]
        flat = weights.reshape(specs, images, channels, 1, -1)
        negative = flat.clamp(max=0)
        taken = flat.clamp(min=0) + torch.where(dominant, negative, torch.zeros_like(negative))
        columns = torch.zeros(specs, *lower.shape, dtype=weights.dtype, device=weights.device)
        columns.scatter_(3, chosen.expand(specs, *chosen.shape), taken)
        gained = (torch.where(dominant, torch.zeros_like(negative), negative * ceiling)).sum(dim=(2, 3, 4))
        size = tuple(box.lower.shape[-2:])
        passed = pool.fold(columns.reshape(specs * images, *lower.shape[1:]), size)
        return passed.reshape(specs, images, channels, *size), gained

    def _through_affine(self, node: fx.Node, weights: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """(A . h(0), {bounded input: its coefficients}) for an affine node h, by its vector-Jacobian product
        (taken at 0, over the traced batch, and mapped over the specifications)."""
        sources = self.sources(node)
        zeros = [torch.zeros_like(self.env[source].lower) for source in sources]
        offset, transpose = vjp(lambda *values: self._evaluate(node, dict(zip(sources, values))), *zeros)
        dims = tuple(range(2, weights.dim()))
        grads = vmap(transpose)(weights)
        return (weights * offset).sum(dims), dict(zip(sources, grads))

    def _evaluate(self, node: fx.Node, values: dict) -> torch.Tensor:
        """`node` with its bounded inputs replaced by `values` and its other inputs as the graph gives them."""
        def resolve(arg):
            if isinstance(arg, fx.Node):
                return values[arg] if arg in values else self.env[arg]
            return arg

        args, kwargs = _map(node.args, resolve), _map(node.kwargs, resolve)
        if node.op == "call_module":
            return self.net.get_submodule(node.target)(*args, **kwargs)
        if node.op == "call_function":
            return OUT_OF_PLACE.get(node.target, node.target)(*args, **kwargs)
        return getattr(args[0], node.target)(*args[1:], **kwargs)


def deep_relu_neurons(net: nn.Module, image: torch.Tensor, graph: fx.GraphModule | None = None) -> int:
    """Neurons per image at the input of a ReLU that has another ReLU before it: the ones whose pre-activation
    bounds CROWN tightens by backward passes of their own (its cost on a network; the others are affine in the
    input, where the interval pass is as good or the bound is cheap)."""
    graph = trace(net) if graph is None else graph
    env = run_graph(net, graph, Box(image, image))
    relus = [node for node in graph.graph.nodes if _is_box(env.get(node)) and is_relu(net, node)]

    def behind_relu(node: fx.Node) -> bool:
        stack, seen = list(node.all_input_nodes), set()
        while stack:
            current = stack.pop()
            if current in seen or not _is_box(env.get(current)):
                continue
            seen.add(current)
            if is_relu(net, current):
                return True
            stack.extend(current.all_input_nodes)
        return False

    inputs = {node.all_input_nodes[0] for node in relus}
    return sum(env[node].lower[0].numel() for node in inputs if behind_relu(node))


def _map(value, function):
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, function) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, function) for k, v in value.items()}
    return function(value)


def _output_lower_bounds(net: nn.Module, lower: torch.Tensor, upper: torch.Tensor, graph: fx.GraphModule | None,
                         intermediate: str, memory: int, rows, slope_steps: int = 0, rounding=None):
    """(LinearBounds, [N, S]): lower bounds on rows[s] . logits over each image's box, rows ([S, K], the same for
    every image) made by `rows(classes)`, in chunks of specifications that keep within `memory`."""
    propagation = LinearBounds(net, lower, upper, graph, intermediate, memory, rounding)
    if propagation.output not in propagation.bounded:
        raise UnsupportedLayer("the network's output does not depend on its input")
    images, classes = propagation.env[propagation.output].lower.shape
    spec = rows(torch.eye(classes, dtype=lower.dtype, device=lower.device))[:, None, :].expand(-1, images, -1)
    step = propagation.chunk(images)
    bounds = [propagation.optimised_lower_bound(propagation.output, spec[start:start + step].contiguous(), slope_steps)
              for start in range(0, len(spec), step)]
    return propagation, torch.cat(bounds).T


@torch.no_grad()  # the transposes are torch.func's own; nothing here needs the weights' gradients
def logit_difference_lower_bounds(net: nn.Module, lower: torch.Tensor, upper: torch.Tensor,
                                  graph: fx.GraphModule | None = None, intermediate: str = "crown",
                                  memory: int = MEMORY, slope_steps: int = 0, rounding=None) -> torch.Tensor:
    """[N, K, K]: entry (n, j, c) bounds z_j - z_c from below over image n's box (0 where j = c), by CROWN
    (with `slope_steps` > 0: alpha-CROWN's optimised slopes for these final bounds), never looser than the
    interval bound (propagate.logit_difference_lower_bounds); with `rounding`, of the network evaluated in that
    precision."""
    def differences(eye):  # row j * K + c: e_j - e_c
        return (eye[:, None, :] - eye[None, :, :]).reshape(-1, eye.shape[0])

    propagation, crown = _output_lower_bounds(net, lower, upper, graph, intermediate, memory, differences, slope_steps,
                                              rounding)
    classes = propagation.env[propagation.output].lower.shape[1]
    crown = crown.reshape(len(crown), classes, classes)  # (n, j, c)
    crown = crown - torch.diag_embed(torch.diagonal(crown, dim1=1, dim2=2))
    return torch.maximum(crown, interval_differences(net, lower, upper, propagation.graph, rounding))


def centred_logit_upper_bounds(net: nn.Module, lower: torch.Tensor, upper: torch.Tensor,
                               graph: fx.GraphModule | None = None, memory: int = MEMORY) -> torch.Tensor:
    """[N, K]: entry (n, j) bounds z_j - mean(z) from above over image n's box by CROWN-IBP (the ReLUs' inputs
    from the interval pass, CROWN from the output back; Zhang et al. 2020), intersected with the interval bound.
    Differentiable in the network's weights (torch.func's transposes compose with autograd): robust Alg 1's bound
    term with `bound_term=linear`. BatchNorm layers must be in eval mode."""
    def negated_centred(eye):  # row j: -(e_j - 1/K), whose lower bound is minus the upper bound wanted
        return 1.0 / len(eye) - eye

    propagation, negated = _output_lower_bounds(net, lower, upper, graph, "ibp", memory, negated_centred)
    return torch.minimum(-negated, interval_centred(net, lower, upper, propagation.graph))
