"""Issue 37: linear bound propagation (CROWN, ttp_lightning.bounds.linear). Its lower bounds on every logit difference
hold at 10,000 random points of the box (corners included) for random small networks of every supported layer,
residual blocks and BatchNorm with negative scales included; they are never looser than the interval bounds, and
on these networks often tighter; exact for one linear layer; a layer without a rule is refused by name."""

import itertools
import math

import pytest
import torch
from torch import nn

from test_ibp import POINTS, TOLERANCE, _points, _randomise_batchnorm
from ttp_lightning.bounds import input_box
from ttp_lightning.bounds import logit_difference_lower_bounds as interval_differences
from ttp_lightning.bounds.linear import LinearBounds, logit_difference_lower_bounds
from ttp_lightning.bounds.propagate import UnsupportedLayer
from ttp_lightning.models.components.classifier import Classifier
from ttp_lightning.models.components.resnet import ResNet


class Block(nn.Module):
    """A residual block with a shortcut convolution, a constant added, a scaled branch and global average pooling."""

    def __init__(self, channels: int):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(channels, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True),
                                  nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4))
        self.shortcut = nn.Conv2d(channels, 4, 1, bias=False)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        y = torch.relu(self.body(x) + self.shortcut(x) * 0.5 - 0.1)
        return self.pool(nn.functional.avg_pool2d(y, 2)).flatten(1)


def _networks():
    torch.manual_seed(0)
    return [
        ("mlp", nn.Sequential(nn.Flatten(), nn.Linear(12, 9), nn.ReLU(), nn.Dropout(0.5), nn.Linear(9, 9),
                              nn.ReLU(), nn.Linear(9, 4)), (1, 3, 4)),
        ("bn1d", nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Identity(),
                               nn.Linear(8, 3)), (1, 3, 4)),
        ("cnn", nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AvgPool2d(2),
                              nn.Conv2d(4, 5, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(20, 4)),
         (2, 8, 8)),
        ("conv1d", nn.Sequential(nn.Flatten(2), nn.Conv1d(2, 3, 3), nn.ReLU(), nn.AdaptiveAvgPool1d(2),
                                 nn.Flatten(), nn.Linear(6, 3)), (2, 3, 3)),
        ("residual", nn.Sequential(Block(2), nn.Linear(4, 5)), (2, 8, 8)),
        ("resnet8", Classifier(ResNet(2, 8, 4, [1, 1, 0, 0], width=4), (0.4, 0.6), (0.2, 0.3)), (2, 8, 8)),
        # a ResNet stem's max pooling (overlapping 3x3 windows, stride 2, padding 1), and a plain 2x2 one
        ("maxpool_stem", nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                       nn.MaxPool2d(3, 2, 1), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
                                       nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16, 4)), (2, 8, 8)),
        ("maxpool_functional", MaxPoolFunctional(), (1, 6, 6)),
    ]


class MaxPoolFunctional(nn.Module):
    """F.max_pool2d with keyword arguments and dilation, before any ReLU (a window of signed values)."""

    def __init__(self):
        super().__init__()
        self.conv, self.head = nn.Conv2d(1, 3, 2), nn.Linear(27, 3)

    def forward(self, x):
        y = nn.functional.max_pool2d(self.conv(x), kernel_size=2, stride=2, dilation=2, padding=1)
        return self.head(torch.relu(y).flatten(1))


@pytest.mark.parametrize("intermediate", ["crown", "ibp"])
@pytest.mark.parametrize("name,net,shape", _networks(), ids=[n for n, _, _ in _networks()])
def test_linear_bounds_hold_at_random_points_and_are_never_looser_than_intervals(name, net, shape, intermediate):
    net = _randomise_batchnorm(net)
    images = torch.rand((2, *shape), dtype=torch.float64) * 0.6 + 0.2
    lower, upper = input_box(images, 12 / 255)
    crown = logit_difference_lower_bounds(net, lower, upper, intermediate=intermediate, memory=4096)
    interval = interval_differences(net, lower, upper)
    assert (crown >= interval - 1e-12).all()
    for n in range(len(images)):
        points = _points(lower[n:n + 1], upper[n:n + 1], POINTS)
        with torch.no_grad():
            logits = torch.cat([net(chunk) for chunk in points.split(2500)])
        assert (logits[:, :, None] - logits[:, None, :] >= crown[n] - TOLERANCE).all(), name


def test_linear_bounds_are_tighter_than_intervals_through_relus():
    """On the networks above the interval pass loses correlations CROWN keeps: the mean gap is positive."""
    gaps = {}
    for name, net, shape in _networks():
        net = _randomise_batchnorm(net)
        lower, upper = input_box(torch.rand((4, *shape), dtype=torch.float64) * 0.6 + 0.2, 12 / 255)
        gaps[name] = float((logit_difference_lower_bounds(net, lower, upper) - interval_differences(net, lower, upper))
                           .mean())
    assert all(gap >= 0 for gap in gaps.values()) and sum(gap > 1e-6 for gap in gaps.values()) >= 4, gaps


def test_linear_bounds_are_exact_for_a_single_linear_layer():
    torch.manual_seed(1)
    layer = nn.Linear(6, 4).double()
    net = nn.Sequential(nn.Flatten(), layer)
    image = torch.rand(3, 1, 2, 3, dtype=torch.float64) * 0.5 + 0.25
    lower, upper = input_box(image, 10 / 255)
    centre, radius = ((upper + lower) / 2).flatten(1), ((upper - lower) / 2).flatten(1)
    differences = logit_difference_lower_bounds(net, lower, upper)
    weight = layer.weight.detach()
    for n in range(3):
        for j in range(4):
            for c in range(4):
                corner = centre[n] - radius[n] * (weight[j] - weight[c]).sign()
                logits = layer(corner)
                assert torch.allclose(logits[j] - logits[c], differences[n, j, c], atol=1e-12)


def test_intermediate_bounds_contain_the_pre_activations_and_tighten_the_intervals():
    torch.manual_seed(2)
    net = _randomise_batchnorm(_networks()[2][1])
    lower, upper = input_box(torch.rand(1, 2, 8, 8, dtype=torch.float64), 8 / 255)
    propagation = LinearBounds(net, lower, upper, memory=2048)
    relu_inputs = [node.all_input_nodes[0] for node in propagation.nodes
                   if node.op == "call_module" and isinstance(net.get_submodule(node.target), nn.ReLU)]
    points = _points(lower, upper, 2000)
    for node in relu_inputs:
        box, interval = propagation.bounds(node), propagation.env[node]
        assert (box.lower >= interval.lower - 1e-12).all() and (box.upper <= interval.upper + 1e-12).all()
        values = _value_at(net, node.target, points)
        assert (values >= box.lower - TOLERANCE).all() and (values <= box.upper + TOLERANCE).all()
    assert (propagation.bounds(relu_inputs[-1]).upper < propagation.env[relu_inputs[-1]].upper - 1e-9).any()


def _value_at(net: nn.Sequential, name: str, points: torch.Tensor) -> torch.Tensor:
    """The output of `net`'s submodule `name` (a position in the Sequential) for each point."""
    with torch.no_grad():
        x = points
        for key, module in net.named_children():
            x = module(x)
            if key == name:
                return x
    raise KeyError(name)


def test_a_dominated_max_pooling_window_is_exact():
    """Where one input of every window is above all the others over the whole box, max pooling is that input
    (linear): the bound on a single 2x2 pooling followed by a linear layer is attained at a corner of the box."""
    torch.manual_seed(3)
    head = nn.Linear(4, 3).double()
    net = nn.Sequential(nn.MaxPool2d(2), nn.Flatten(), head).eval()
    image = torch.full((1, 1, 4, 4), 0.2, dtype=torch.float64)
    image[0, 0, ::2, ::2] = 0.8  # the top-left input of every window dominates it by far
    lower, upper = input_box(image, 4 / 255)
    differences = logit_difference_lower_bounds(net, lower, upper)
    weight = head.weight.detach()
    for j in range(3):
        for c in range(3):
            corner = image.clone()
            corner[0, 0, ::2, ::2] -= (4 / 255) * (weight[j] - weight[c]).sign().view(2, 2)
            logits = net(corner)[0]
            assert torch.allclose(logits[j] - logits[c], differences[0, j, c], atol=1e-12)


@pytest.mark.parametrize("layer", [nn.MaxPool2d(2, ceil_mode=True), nn.AdaptiveMaxPool2d(2), nn.GELU(),
                                   nn.Sigmoid()], ids=["maxpool_ceil", "adaptive_maxpool", "gelu", "sigmoid"])
def test_a_layer_without_a_linear_rule_is_refused_by_name(layer):
    net = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), layer, nn.Flatten(), nn.LazyLinear(3)).double()
    net(torch.zeros(1, 1, 4, 4, dtype=torch.float64))  # materialise the lazy layer
    lower, upper = input_box(torch.rand(1, 1, 4, 4, dtype=torch.float64), 0.01)
    with pytest.raises(UnsupportedLayer, match="ceil_mode" if getattr(layer, "ceil_mode", False)
                       else type(layer).__name__):
        logit_difference_lower_bounds(net.eval(), lower, upper)


@pytest.mark.parametrize("bound", ["interval", "linear"])
def test_the_radius_search_matches_a_full_scan_and_grows_with_the_threshold(bound):
    """The bisection returns, per image, the largest radius of the grid (0, 1/4, ..., 16 per 255) whose proven CD
    is at most the threshold, as a scan of every radius does; it never shrinks when the threshold grows; every
    radius it returns is proven (its bound passes); per-image radii give each image its own ball."""
    from ttp_lightning.bounds.uniformity import RADIUS_STEP, Prover

    torch.manual_seed(5)
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 10), nn.ReLU(), nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 4))
    for layer in net:
        if isinstance(layer, nn.Linear):
            layer.weight.data *= 3  # confident enough that the radii spread over the grid
    net = net.double().eval()
    images = torch.rand(12, 1, 3, 4, dtype=torch.float64)
    prover = Prover(net, bound)
    grid = torch.arange(0.0, 16.0 + RADIUS_STEP / 2, RADIUS_STEP, dtype=torch.float64)
    scan = torch.stack([prover.conf_dist(images, float(g)) for g in grid], dim=1)  # [N, 65]
    assert torch.allclose(prover.conf_dist(images, grid[:12]), scan[torch.arange(12), torch.arange(12)])
    previous, seen = torch.zeros(12, dtype=torch.float64), set()
    for threshold in (0.05, 0.15, 0.3, 0.5, 0.7):
        radius = prover.radius(images, threshold)
        ok = scan <= threshold
        largest = torch.tensor([grid[row.nonzero().max()].item() if row.any() else 0.0 for row in ok],
                               dtype=torch.float64)
        assert torch.equal(radius, largest), (threshold, radius, largest)
        known = {float(grid[i]): scan[:, i] for i in (4, 8, 20, 32)}  # the bounds at 1, 2, 5 and 8 per 255
        assert torch.equal(prover.radius(images, threshold, known=known), largest)  # bracketed by them
        assert (radius >= previous).all()
        proven = prover.conf_dist(images, radius) <= threshold
        assert (proven | (radius == 0)).all()
        previous = radius
        seen |= set(radius.tolist())
    assert len(seen) >= 5  # the radii are spread over the grid, so the comparison says something


@pytest.mark.parametrize("name,net,shape", [_networks()[i] for i in (0, 2, 4, 5)], ids=["mlp", "cnn", "residual", "resnet8"])
def test_the_crown_ibp_training_term_bounds_the_ball_and_its_gradient_is_the_true_one(name, net, shape):
    """Robust Alg 1's bound term with bound_term=linear (CROWN-IBP): an upper bound on KL(u || p) at 10,000
    points of each ball, never above the interval term, and its gradient in the weights equal to the finite
    difference along a random direction (the backward pass runs through torch.func's transposes)."""
    import math

    from ttp_lightning.bounds.uniformity import reverse_kl_upper_bound

    net = _randomise_batchnorm(net)
    images = torch.rand((2, *shape), dtype=torch.float64) * 0.6 + 0.2
    linear_term = reverse_kl_upper_bound(net, images, 12 / 255, bound="linear")
    with torch.no_grad():
        interval_term = reverse_kl_upper_bound(net, images, 12 / 255)
        lower, upper = input_box(images, 12 / 255)
        for n in range(len(images)):
            logits = torch.cat([net(chunk) for chunk in _points(lower[n:n + 1], upper[n:n + 1], POINTS).split(2500)])
            kl = torch.logsumexp(logits, -1) - logits.mean(-1) - math.log(logits.shape[-1])
            assert (kl <= linear_term[n] + TOLERANCE).all(), name
    assert (linear_term <= interval_term + 1e-12).all()
    params = [p for p in net.parameters() if p.requires_grad]
    gradients = torch.autograd.grad(linear_term.sum(), params)
    torch.manual_seed(3)
    direction = [torch.randn_like(p) for p in params]
    step = 1e-6
    with torch.no_grad():
        for p, d in zip(params, direction):
            p += step * d
        moved = reverse_kl_upper_bound(net, images, 12 / 255, bound="linear").sum()
        for p, d in zip(params, direction):
            p -= step * d
    predicted = sum((g * d).sum() for g, d in zip(gradients, direction))
    assert abs(float((moved - linear_term.sum()) / step - predicted)) <= 1e-4 * max(1.0, abs(float(predicted)))


@pytest.mark.parametrize("name,net,shape", [_networks()[i] for i in (0, 2, 4)], ids=["mlp", "cnn", "residual"])
def test_optimised_slopes_hold_at_random_points_and_are_never_looser_than_crown(name, net, shape):
    """alpha-CROWN (slope_steps > 0): any lower slope in [0, 1] gives a valid bound, so the optimised bounds hold
    at 10,000 points of each box, are never below CROWN's own and, on these networks with a ReLU behind a ReLU,
    raise some of them."""
    torch.manual_seed(4)
    net = _randomise_batchnorm(net)
    images = torch.rand((2, *shape), dtype=torch.float64) * 0.6 + 0.2
    lower, upper = input_box(images, 16 / 255)
    crown = logit_difference_lower_bounds(net, lower, upper, memory=4096)
    alpha = logit_difference_lower_bounds(net, lower, upper, memory=4096, slope_steps=10)
    assert (alpha >= crown - 1e-12).all()
    assert (alpha > crown + 1e-9).any(), name
    for n in range(len(images)):
        with torch.no_grad():
            logits = torch.cat([net(chunk) for chunk in _points(lower[n:n + 1], upper[n:n + 1], POINTS).split(2500)])
        assert (logits[:, :, None] - logits[:, None, :] >= alpha[n] - TOLERANCE).all(), name


def test_the_certifier_optimises_slopes_only_where_a_relu_feeds_another():
    """alpha-CROWN's steps go where they can change a bound: with intermediate crown and a ReLU behind a ReLU
    (one ReLU layer: CROWN's own slopes; the optimised ones changed no bound measured there, at 30x the cost)."""
    from ttp_lightning.bounds.uniformity import Prover

    torch.manual_seed(2)
    images = torch.rand(3, 1, 3, 4, dtype=torch.float64)
    shallow = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 4))
    deep = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    used = {}
    for name, net in (("shallow", shallow), ("deep", deep)):
        for intermediate in ("auto", "ibp"):
            prover = Prover(net, "linear", intermediate=intermediate, slope_steps=5)
            prover.conf_dist(images, 4.0)
            used[name, intermediate] = prover.slopes_used
    assert used == {("shallow", "auto"): 0, ("shallow", "ibp"): 0, ("deep", "auto"): 5, ("deep", "ibp"): 0}
    assert Prover(deep, "interval", slope_steps=5).slopes_used == 0


def _relu_step_reference(low, high, weights, slope=None):
    """CROWN's lower-bound step through a ReLU, written over every neuron (the form the faster step replaced)."""
    unstable, active = (low < 0) & (high > 0), (low >= 0).to(low.dtype)
    chord = torch.where(unstable, high / (high - low).clamp(min=torch.finfo(low.dtype).tiny), active)
    below = torch.where(unstable, (high > -low).to(low.dtype) if slope is None else slope, active)
    intercept = torch.where(unstable, -chord * low, torch.zeros_like(low))
    positive, negative = weights.clamp(min=0), weights.clamp(max=0)
    dims = tuple(range(2, weights.dim()))
    return positive * below + negative * chord, (negative * intercept).sum(dims)


@pytest.mark.parametrize("optimised", [False, True])
def test_the_relu_step_over_the_unstable_neurons_alone_equals_the_step_over_every_neuron(optimised):
    """The ReLU step touches only neurons unstable in some image; a neuron stable in one image and unstable in
    another, active and inactive ones, and alpha-CROWN's per-specification slopes give the full step's numbers."""
    torch.manual_seed(3)
    net = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(48, 4)).double().eval()
    images = torch.rand(2, 1, 4, 4, dtype=torch.float64)
    bounds = LinearBounds(net, *input_box(images, 0.05))
    relu = next(node for node in bounds.nodes if node.op == "call_module" and node.target == "1")
    (source,) = bounds.sources(relu)
    box = bounds.bounds(source)
    unstable = (box.lower < 0) & (box.upper > 0)
    assert unstable.any() and (~unstable).any() and (unstable[0] != unstable[1]).any()  # every case is met
    weights = torch.randn(5, 2, 3, 4, 4, dtype=torch.float64)
    slope = torch.rand(5, 2, 3, 4, 4, dtype=torch.float64) if optimised else None
    if optimised:
        bounds.slopes = {source: slope}
    passed, gained = bounds._through_relu(source, weights)
    want_passed, want_gained = _relu_step_reference(box.lower, box.upper, weights, slope)
    assert torch.allclose(passed, want_passed, atol=1e-14) and torch.allclose(gained, want_gained, atol=1e-14)


@pytest.mark.parametrize("bound", ["interval", "linear"])
def test_the_radius_search_climbs_from_the_smallest_radius_and_never_tries_far_past_the_answer(bound, monkeypatch):
    """The search doubles up from the grid's first radius and bisects below the first failure: an image proven
    at no radius costs the bounds at 1/4 and 0 per 255 alone, and no image is bounded at more than twice its
    proven radius plus a step (bisecting the whole grid started at 8/255 for every image: on a CNN the costliest
    bound, and the one that proves least)."""
    from ttp_lightning.bounds.uniformity import RADIUS_STEP, Prover

    torch.manual_seed(5)
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 10), nn.ReLU(), nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 4))
    for layer in net:
        if isinstance(layer, nn.Linear):
            layer.weight.data *= 3
    net = net.double().eval()
    images = torch.rand(12, 1, 3, 4, dtype=torch.float64)
    prover = Prover(net, bound)
    tried: list[torch.Tensor] = []
    conf_dist = Prover.conf_dist

    def recording(self, batch, gamma):
        if self.bound == bound:  # not the linear search's interval floor
            tried.append(torch.as_tensor(gamma, dtype=torch.float64).expand(len(batch)).clone())
        return conf_dist(self, batch, gamma)

    monkeypatch.setattr(Prover, "conf_dist", recording)
    seen = set()
    for threshold, image in itertools.product((0.05, 0.15, 0.3, 0.5, 0.7), images):
        tried.clear()
        radius = prover.radius(image[None], threshold).item()
        radii = torch.cat(tried) if tried else torch.zeros(0, dtype=torch.float64)
        if radius == 0 and bound == "interval":
            assert sorted(radii.tolist()) == [0.0, RADIUS_STEP]
        assert (radii <= 2 * radius + RADIUS_STEP + 1e-12).all(), (threshold, radius, radii)
        assert len(radii) <= 2 * math.log2(max(radius, RADIUS_STEP) / RADIUS_STEP) + 2
        seen.add(radius)
    assert len(seen) >= 5  # radii spread over the grid


def test_a_relu_input_one_linear_map_from_the_input_keeps_its_interval_bounds_which_crown_cannot_tighten(monkeypatch):
    """conv -> BatchNorm -> ReLU: the first ReLU's interval bounds are its exact range (one affine map of the box,
    then a per-channel scale), so its CROWN passes are skipped. Every bound is the one the passes gave, to
    rounding; the second ReLU's input (two convolutions in) is not taken as exact."""
    torch.manual_seed(3)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1),
                        nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)).double()
    _randomise_batchnorm(net)
    net.eval()
    lower, upper = input_box(torch.rand(2, 1, 6, 6, dtype=torch.float64), 0.05)
    bounds = LinearBounds(net, lower, upper)
    relu_inputs = [bounds.sources(node)[0] for node in bounds.nodes if node.op == "call_module"
                   and isinstance(net.get_submodule(node.target), nn.ReLU)]
    assert [bounds.exact_by_intervals(node) for node in relu_inputs] == [True, False]
    skipped = logit_difference_lower_bounds(net, lower, upper)
    monkeypatch.setattr(LinearBounds, "exact_by_intervals", lambda self, node: False)
    passes = LinearBounds(net, lower, upper, graph=bounds.graph)
    first = passes.bounds(relu_inputs[0])
    assert torch.allclose(first.lower, bounds.env[relu_inputs[0]].lower, atol=1e-12)
    assert torch.allclose(first.upper, bounds.env[relu_inputs[0]].upper, atol=1e-12)
    assert ((first.lower < 0) & (first.upper > 0)).any()  # unstable neurons: the passes had work to do
    assert torch.allclose(logit_difference_lower_bounds(net, lower, upper), skipped, atol=1e-12)


class _Broadcast(nn.Module):
    """One input channel scaled into two (a broadcast product), then a convolution summing them: the copies are
    one value, so the interval bound of the sum is not its range."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.tensor([1.0, -1.0], dtype=torch.float64).view(1, 2, 1, 1))
        self.conv = nn.Conv2d(2, 3, 3, padding=1).double()

    def forward(self, x):
        return torch.relu(self.conv((x - 0.5) * self.scale))


def test_intervals_are_not_taken_as_exact_after_normalisation_unless_nothing_is_broadcast():
    torch.manual_seed(4)
    lower, upper = input_box(torch.rand(1, 1, 5, 5, dtype=torch.float64), 0.05)
    broadcast = _Broadcast().eval()
    bounds = LinearBounds(broadcast, lower, upper)
    relu_input = next(node for node in bounds.nodes if node.target is torch.relu).args[0]
    assert not bounds.exact_by_intervals(relu_input)
    tightened = bounds.bounds(relu_input)  # the passes see the copies as one value: tighter than the intervals
    assert (tightened.upper - tightened.lower).sum() < (bounds.env[relu_input].upper - bounds.env[relu_input].lower
                                                        ).sum() - 1e-6
    backbone = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(75, 4))
    net = Classifier(backbone, mean=(0.5,), std=(0.25,)).double().eval()  # (x - mean) / std, then the network
    bounds = LinearBounds(net, lower, upper)
    relu_input = next(node for node in bounds.nodes if node.op == "call_module"
                      and isinstance(net.get_submodule(node.target), nn.ReLU)).args[0]
    assert bounds.exact_by_intervals(relu_input)
