"""Issue 59: the proven CD holds for the float32 network people run, not only for the exact function of its
weights (ttp_lightning.bounds.rounding). The rounding error bound holds at random points of the box for every supported
layer (the float32 output against the float64 one), is small on ordinary networks (so a proven radius barely
moves), and makes the bound vacuous, never wrong, where float32 and exact arithmetic part: the cancellation of
Jia & Rinard (2021) in either layer, overflow to infinity."""

import copy
import math

import pytest
import torch
from torch import nn

from test_ibp import _points, _randomise_batchnorm
from test_linear_bounds import _networks
from ttp_lightning.bounds import input_box
from ttp_lightning.bounds.linear import logit_difference_lower_bounds
from ttp_lightning.bounds.propagate import Box, run_graph, trace
from ttp_lightning.bounds.rounding import PRECISIONS, Rounding, unit_roundoff
from ttp_lightning.bounds.uniformity import Prover
from ttp_lightning.core.metrics import conf_dist_of_probs
from ttp_lightning.models.components.classifier import Classifier
from ttp_lightning.models.components.linear import MLP


@pytest.mark.parametrize("name,net,shape", _networks(), ids=[n for n, _, _ in _networks()])
def test_bounds_of_the_float32_network_hold_at_random_points_of_the_box(name, net, shape):
    """With the rounding term, the interval boxes of every value and CROWN's logit-difference bounds hold for the
    network evaluated in float32 at 3,000 points of each image's box (corners included), and the term costs
    little: each rounding operation's D is below 1e-4 of its value's magnitude (plus 1e-6) on these networks."""
    torch.manual_seed(3)
    net = _randomise_batchnorm(net)
    images = torch.rand((2, *shape), dtype=torch.float64) * 0.6 + 0.2
    lower, upper = input_box(images, 12 / 255)
    graph, noise = trace(net), {}
    env = run_graph(net, graph, Box(lower, upper), rounding=Rounding(), noise=noise)
    output = next(node for node in graph.graph.nodes if node.op == "output").args[0]
    crown = logit_difference_lower_bounds(net, lower, upper, graph, rounding=Rounding())
    single = copy.deepcopy(net).float()
    for n in range(len(images)):
        points = _points(lower[n:n + 1], upper[n:n + 1], 3000)
        with torch.no_grad():
            logits = single(points.float()).double()
        box = env[output]
        assert ((logits >= box.lower[n]) & (logits <= box.upper[n])).all(), name
        assert (logits[:, :, None] - logits[:, None, :] >= crown[n]).all(), name
    assert noise and all((amount <= 1e-4 * env[node].upper.abs().maximum(env[node].lower.abs()) + 1e-6).all()
                         for node, amount in noise.items()), name


def test_a_dot_products_error_bound_holds_where_its_terms_cancel():
    """One Linear layer at inputs built to cancel (large terms of both signs summing to about 0): the float32
    result is within D of the float64 one."""
    torch.manual_seed(4)
    layer = nn.Linear(256, 8).double()
    with torch.no_grad():
        layer.weight.copy_(torch.randn(8, 256) * 1e3)
        layer.bias.copy_(-(layer.weight @ torch.full((256,), 0.5, dtype=torch.float64)))  # 0 at x = 0.5
    net = nn.Sequential(layer)
    x = torch.full((1, 256), 0.5, dtype=torch.float64)
    lower, upper = x - 1e-3, x + 1e-3
    graph, noise = trace(net), {}
    run_graph(net, graph, Box(lower, upper), rounding=Rounding(), noise=noise)
    (amount,) = noise.values()
    points = _points(lower, upper, 2000)
    with torch.no_grad():
        exact, rounded = net(points), copy.deepcopy(net).float()(points.float()).double()
    assert ((rounded - exact).abs() <= amount).all()
    assert float((rounded - exact).abs().max()) > 0  # the float32 evaluation did round here


def test_the_unit_roundoff_of_each_precision():
    assert unit_roundoff("float32") == 2.0 ** -24 and unit_roundoff("float64") == 2.0 ** -53
    assert unit_roundoff("bfloat16") == 2.0 ** -8 and unit_roundoff("float16") == 2.0 ** -11
    assert set(PRECISIONS) == {"float32", "float64", "bfloat16", "float16"}
    with pytest.raises(ValueError, match="choose one of"):
        unit_roundoff("tf32")


def _cancelling(scale: float, in_first_layer: bool) -> nn.Module:
    """A network that is exactly uniform everywhere but not in float32: two ReLU units (or two output weights)
    with values `scale` and `scale` minus float32's spacing below it, cancelled by the next layer."""
    net = Classifier(MLP(1, 4, 10, 8), (0.0,), (1.0,)).eval()
    gap = scale * 2.0 ** -24
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.zero_()
        first, last = net.backbone[1], net.backbone[3]
        if in_first_layer:  # Jia & Rinard's construction: h0 = x + scale, h1 = x + scale - gap
            first.weight[0, 0] = first.weight[1, 0] = gap
            first.bias[0], first.bias[1] = scale, scale - gap
            last.weight[0, 0], last.weight[0, 1], last.bias[0] = -16.0 / gap, 16.0 / gap, 16.0  # powers of two
        else:  # the output layer: z0 = scale * h - (scale - gap) * h - gap * h with h = relu(x)
            first.weight[0, 0] = 1.0
            last.weight[0, 0], last.weight[0, 1], last.weight[0, 2] = scale, -(scale - gap), -gap
            first.weight[1, 0] = first.weight[2, 0] = 1.0
    return net


@pytest.mark.parametrize("scale", [2.0 ** 20, 2.0 ** 24, 2.0 ** 30])
@pytest.mark.parametrize("in_first_layer", [True, False], ids=["hidden", "output"])
def test_a_network_that_only_rounding_makes_confident_is_never_certified(scale, in_first_layer):
    net = _cancelling(scale, in_first_layer)
    points = torch.rand(4000, 1, 4, 4)
    with torch.no_grad():
        exact = conf_dist_of_probs(copy.deepcopy(net).double()(points.double()).softmax(-1))
        rounded = conf_dist_of_probs(net(points).softmax(-1))
    assert float(exact.max()) < 1e-6  # exactly uniform: an exact bound proves CD 0 everywhere
    image = points[rounded.argmax()][None]
    for bound in ("interval", "linear"):
        proven = Prover(net, bound).conf_dist(image, 8.0)
        assert float(proven[0]) >= float(rounded.max()) - 1e-6, (bound, float(proven[0]))
    exact_bound = Prover(net, "linear", precision="float64").conf_dist(image, 8.0)
    assert float(exact_bound[0]) < 0.01  # the float64 network is proven (CROWN is exact on it)
    assert float(rounded.max()) > 0.5 or not in_first_layer  # float32 makes it confident somewhere


def test_a_network_that_overflows_float32_is_never_certified():
    """Weights near float32's largest number: the float network returns inf or NaN, the exact one is finite."""
    net = Classifier(MLP(1, 4, 10, 8), (0.0,), (1.0,)).eval()
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.zero_()
        net.backbone[1].weight[0, :] = 3e38
        net.backbone[3].weight[0, 0], net.backbone[3].weight[1, 0] = 1e-38, -1e-38
    image = torch.full((1, 1, 4, 4), 0.5)
    with torch.no_grad():
        assert not torch.isfinite(net(image)).all()
    for bound in ("interval", "linear"):
        proven = float(Prover(net, bound).conf_dist(image, 1.0)[0])
        assert proven == pytest.approx(0.9) or math.isnan(proven)  # vacuous, or NaN (which never passes)


def test_the_float32_bound_barely_moves_an_ordinary_certificate():
    """A random MNIST-sized MLP (784 terms per dot product): the rounding term raises the proven CD by less
    than 2 % of itself (the worst case of a dot product's rounding grows with its length), and a deep BatchNorm
    ResNet8's CROWN bound by less than 15 % (its error weighed by CROWN's own coefficients, not amplified)."""
    torch.manual_seed(5)
    net = Classifier(MLP(1, 28, 10, 100), (0.13,), (0.31,)).eval()
    images = torch.rand(4, 1, 28, 28)
    for bound in ("interval", "linear"):
        rounded = Prover(net, bound).conf_dist(images, 1.0)
        exact = Prover(net, bound, precision="float64").conf_dist(images, 1.0)
        assert (rounded >= exact).all() and float(((rounded - exact) / exact).max()) < 0.02, bound
    from ttp_lightning.models.components.resnet import ResNet

    deep = Classifier(ResNet(1, 8, 10, [1, 1, 1, 1], width=16), (0.3,), (0.37,)).eval()
    for module in deep.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_var.uniform_(0.5, 2)
            module.running_mean.uniform_(-0.5, 0.5)
    images = torch.rand(1, 1, 8, 8)
    rounded = Prover(deep, "linear", intermediate="crown").conf_dist(images, 1.0)
    exact = Prover(deep, "linear", intermediate="crown", precision="float64").conf_dist(images, 1.0)
    assert (rounded >= exact).all() and float(((rounded - exact) / exact).max()) < 0.15
