"""Issue 62, item 1: CROWN's intermediate bounds through convolutional layers in receptive-field windows
(bounds.windows) are the dense passes' numbers, on networks whose layers exercise every window rule (stride,
dilation, groups, uneven padding, BatchNorm with negative scales, residual additions with and without a
shortcut convolution) and every way out of a window (max pooling, average pooling, a constant added, flatten)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from test_ibp import _randomise_batchnorm
from ttp_lightning.bounds import input_box, linear
from ttp_lightning.bounds.linear import LinearBounds, is_relu, logit_difference_lower_bounds
from ttp_lightning.bounds.rounding import Rounding
from ttp_lightning.bounds.windows import Patches, Window, merge, through_batchnorm, through_convolution
from ttp_lightning.models.components.resnet import ResNet


class Odd(nn.Module):
    """Stride 2 on an odd size, dilation, groups, uneven padding, a residual sum, a constant added, a max pooling
    between ReLUs (windows turn dense there) and a ReLU after it (dense from then on)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(2, 4, 3, stride=2, padding=(1, 0))
        self.b = nn.Sequential(nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=2),
                               nn.BatchNorm2d(4))
        self.c = nn.Conv2d(4, 6, 2, stride=1, padding=1)
        self.head = nn.Linear(6 * 2 * 3, 3)

    def forward(self, x):
        y = self.b(self.a(x))
        y = torch.relu(y + self.a(x))
        z = torch.relu(self.c(y) + 0.1)
        z = torch.relu(F.max_pool2d(z, 2))
        return self.head(z.flatten(1))


def _networks():
    torch.manual_seed(3)
    return [("resnet8", ResNet(2, 9, 4, [1, 1, 1, 0], width=4), (2, 9, 9)), ("odd", Odd(), (2, 9, 7))]


def _tightened(net, lower, upper, tile, rounding=None):
    propagation = LinearBounds(net, lower, upper, tile=tile, rounding=rounding)
    relus = [node for node in propagation.nodes if node in propagation.bounded and is_relu(net, node)]
    return [propagation.bounds(propagation.sources(node)[0]) for node in relus]


@pytest.mark.parametrize("name, net, shape", _networks(), ids=[n[0] for n in _networks()])
@pytest.mark.parametrize("tile, patches_below", [(1, 10**9), (1, 0), (3, 0)], ids=["patches", "positions", "tiles"])
def test_windowed_intermediate_bounds_equal_the_dense_ones(name, net, shape, tile, patches_below, monkeypatch):
    monkeypatch.setattr(linear, "PATCHES_BELOW", patches_below)  # every layer as Patches, or one position a pass
    _randomise_batchnorm(net)
    net = net.eval().double()
    images = torch.rand(2, *shape, dtype=torch.float64)
    lower, upper = input_box(images, 0.08)
    dense, windowed = _tightened(net, lower, upper, 0), _tightened(net, lower, upper, tile)
    unstable = 0
    for exact, cheap in zip(dense, windowed):
        assert torch.allclose(cheap.lower, exact.lower, rtol=0, atol=1e-9)
        assert torch.allclose(cheap.upper, exact.upper, rtol=0, atol=1e-9)
        unstable += int(((exact.lower < 0) & (exact.upper > 0)).sum())
    assert unstable > 10  # the passes had work to do
    final = logit_difference_lower_bounds(net, lower, upper)
    assert torch.isfinite(final).all()


def test_windowed_bounds_with_rounding_equal_the_dense_ones():
    _, net, shape = _networks()[0]
    _randomise_batchnorm(net)
    net = net.eval().double()
    lower, upper = input_box(torch.rand(1, *shape, dtype=torch.float64), 0.05)
    for exact, cheap in zip(_tightened(net, lower, upper, 0, Rounding()),
                            _tightened(net, lower, upper, 1, Rounding())):
        assert torch.allclose(cheap.lower, exact.lower, rtol=0, atol=1e-9)
        assert torch.allclose(cheap.upper, exact.upper, rtol=0, atol=1e-9)


def _transpose(layer, weights, size):
    """The dense transpose of `layer` (autograd's) on [S, N, C, H_out, W_out] coefficients."""
    zeros = torch.zeros(weights.shape[1], layer.in_channels if isinstance(layer, nn.Conv2d) else
                        layer.num_features, *size, dtype=weights.dtype, requires_grad=True)
    out = layer(zeros)
    rows = [torch.autograd.grad(out, zeros, grad, retain_graph=True)[0] for grad in weights]
    return torch.stack(rows), (weights * out.detach()).sum(dim=(2, 3, 4))


@pytest.mark.parametrize("stride, padding, dilation, groups", [(1, 1, 1, 1), (2, 0, 1, 1), (2, 2, 2, 2), (3, 1, 1, 4)])
def test_the_window_rule_of_a_convolution_is_its_transpose(stride, padding, dilation, groups):
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 8, 3, stride, padding, dilation, groups).double()
    size = (11, 10)
    out = conv(torch.zeros(1, 4, *size, dtype=torch.float64)).shape[-2:]
    full = torch.zeros(3, 2, 8, *out, dtype=torch.float64)
    top, left, height, width = out[0] - 2, 0, 2, 3  # a window on the bottom-left edge
    full[..., top:top + height, left:left + width] = torch.randn(3, 2, 8, height, width, dtype=torch.float64)
    window = Window(full[..., top:top + height, left:left + width], top, left)
    gained, passed = through_convolution(conv, window, size)
    expected, offset = _transpose(conv, full, size)
    assert torch.allclose(passed.dense(size), expected, atol=1e-12)
    assert torch.allclose(gained, offset, atol=1e-12)
    assert passed.top >= 0 and passed.left >= 0
    assert passed.top + passed.weights.shape[-2] <= size[0] and passed.left + passed.weights.shape[-1] <= size[1]


def test_the_window_rule_of_a_batchnorm_is_its_transpose_and_merge_adds():
    norm = nn.BatchNorm2d(3).double()
    _randomise_batchnorm(norm)
    norm.eval()
    weights = torch.randn(2, 1, 3, 2, 2, dtype=torch.float64)
    full = Window(weights, 1, 2).dense((5, 5))
    gained, passed = through_batchnorm(norm, Window(weights, 1, 2))
    expected, offset = _transpose(norm, full, (5, 5))
    assert torch.allclose(passed.dense((5, 5)), expected, atol=1e-12)
    assert torch.allclose(gained, offset, atol=1e-12)
    other = Window(torch.randn(2, 1, 3, 3, 1, dtype=torch.float64), 2, 4)
    total = merge(Window(weights, 1, 2), other)
    assert torch.equal(total.dense((5, 5)), Window(weights, 1, 2).dense((5, 5)) + other.dense((5, 5)))
    assert (total.top, total.left, tuple(total.weights.shape[-2:])) == (1, 2, (4, 3))


def _patches(specs, channels, height, width, size, seed=0):
    """Random Patches of `specs` rectangles height x width at random corners, some past the edges of `size`,
    their coefficients past the edges zero (as the passes keep them)."""
    generator = torch.Generator().manual_seed(seed)
    top = torch.randint(-height + 1, size[0], (specs,), generator=generator)
    left = torch.randint(-width + 1, size[1], (specs,), generator=generator)
    weights = torch.randn(specs, 2, channels, height, width, generator=generator, dtype=torch.float64)
    rows, columns = top[:, None] + torch.arange(height), left[:, None] + torch.arange(width)
    inside = ((rows >= 0) & (rows < size[0]))[:, :, None] & ((columns >= 0) & (columns < size[1]))[:, None, :]
    return Patches(weights * inside[:, None, None], top, left)


def test_patches_take_dot_and_dense_agree_with_the_whole_layer():
    size = (6, 5)
    patches = _patches(7, 3, 3, 2, size)
    full = patches.dense(size)  # [S, N, C, H, W]
    value = torch.randn(2, 3, *size, dtype=torch.float64)
    assert torch.allclose(patches.dot(value), (full * value).sum(dim=(2, 3, 4)), atol=1e-12)
    for s in range(7):  # each rectangle reads the value at its own corner, 0 past the edge
        padded = F.pad(value, (2, 2, 3, 3))
        top, left = int(patches.top[s]) + 3, int(patches.left[s]) + 2
        assert torch.equal(patches.take(value)[s], padded[:, :, top:top + 3, left:left + 2])
    assert full.abs().sum() == pytest.approx(float(patches.weights.abs().sum()))  # nothing lost or doubled


@pytest.mark.parametrize("stride, padding, dilation, groups", [(1, 1, 1, 1), (2, 0, 1, 1), (2, 2, 2, 2), (3, 1, 1, 4)])
def test_the_patches_rule_of_a_convolution_is_its_transpose(stride, padding, dilation, groups):
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 8, 3, stride, padding, dilation, groups).double()
    size = (11, 10)
    out = tuple(conv(torch.zeros(1, 4, *size, dtype=torch.float64)).shape[-2:])
    patches = _patches(5, 8, 2, 1, out, seed=stride + padding)
    gained, passed = through_convolution(conv, patches, size)
    expected, offset = _transpose(conv, patches.dense(out), size)
    assert torch.allclose(passed.dense(size) if isinstance(passed, Patches) else passed, expected, atol=1e-12)
    assert torch.allclose(gained, offset, atol=1e-12)


def test_patches_merge_where_their_rectangles_keep_one_offset_else_none():
    size = (7, 7)
    first = _patches(4, 2, 3, 3, size, seed=1)
    second = Patches(torch.randn(4, 2, 2, 1, 1, dtype=torch.float64), first.top + 1, first.left + 2)
    total = merge(first, second)
    assert isinstance(total, Patches)
    assert torch.allclose(total.dense(size), first.dense(size) + second.dense(size), atol=1e-12)
    moved = Patches(second.weights, second.top + torch.tensor([0, 0, 0, 1]), second.left)
    assert merge(first, moved) is None  # the pass adds these densely
