"""Interval bound propagation (ttp_lightning.bounds): the bounds contain every output of every point of the box,
for random small networks of every supported layer; they are exact for one affine layer; unsupported layers
are refused rather than skipped."""

import math

import pytest
import torch
from torch import nn

from ttp_lightning.bounds import (
    UnsupportedLayer,
    input_box,
    interval_bounds,
    logit_difference_lower_bounds,
    proven_conf_dist,
    reverse_kl_upper_bound,
)
from ttp_lightning.models.components.classifier import Classifier
from ttp_lightning.models.components.resnet import ResNet

POINTS = 10_000
TOLERANCE = 1e-9  # float64 rounding


class Residual(nn.Module):
    """Two convolution branches added (a residual connection), then average and max pooling side by side."""

    def __init__(self, channels: int):
        super().__init__()
        self.left = nn.Sequential(nn.Conv2d(channels, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True))
        self.right = nn.Sequential(nn.Conv2d(channels, 4, 1, bias=False), nn.BatchNorm2d(4))
        self.tail = nn.Sequential(nn.LeakyReLU(0.1), nn.Conv2d(4, 3, 3, stride=2, padding=1))

    def forward(self, x):
        y = self.tail(self.left(x) + self.right(x) * 0.5 - 0.1)
        pooled = torch.cat([nn.functional.avg_pool2d(y, 2), nn.functional.max_pool2d(-y, 2)], dim=1)
        return pooled.flatten(1)


def _networks():
    """(name, network, input shape) for every supported layer kind."""
    torch.manual_seed(0)
    return [
        ("linear", nn.Sequential(nn.Flatten(), nn.Linear(12, 5)), (1, 3, 4)),
        ("mlp", nn.Sequential(nn.Flatten(), nn.Linear(12, 9), nn.ReLU(), nn.Dropout(0.5), nn.Linear(9, 9),
                              nn.Tanh(), nn.Linear(9, 6), nn.Sigmoid(), nn.Linear(6, 4)), (1, 3, 4)),
        ("bn1d", nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.BatchNorm1d(8), nn.ReLU6(), nn.Linear(8, 8),
                               nn.ELU(), nn.Hardtanh(), nn.Softplus(), nn.Identity(), nn.Linear(8, 3)), (1, 3, 4)),
        ("cnn", nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(4, 5, 3), nn.AdaptiveMaxPool2d(2), nn.AvgPool2d(2), nn.Flatten(),
                              nn.Linear(5, 4)), (2, 8, 8)),
        ("conv1d", nn.Sequential(nn.Flatten(2), nn.Conv1d(2, 3, 3), nn.ReLU(), nn.AdaptiveAvgPool1d(2),
                                 nn.Flatten(), nn.Linear(6, 3)), (2, 3, 3)),
        ("residual", nn.Sequential(Residual(2), nn.Linear(6 * 4, 5)), (2, 8, 8)),
        ("resnet8", Classifier(ResNet(2, 8, 4, [1, 1, 0, 0], width=4), (0.4, 0.6), (0.2, 0.3)), (2, 8, 8)),
    ]


def _randomise_batchnorm(net: nn.Module) -> nn.Module:
    for module in net.modules():
        if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
            module.running_mean.uniform_(-1, 1)
            module.running_var.uniform_(0.3, 2.0)
            module.weight.data.uniform_(-1.5, 1.5)  # negative scales too
            module.bias.data.uniform_(-0.5, 0.5)
    return net.double().eval()


def _points(lower: torch.Tensor, upper: torch.Tensor, count: int) -> torch.Tensor:
    """`count` points of the box of one image: uniform inside, and a third of them on its corners."""
    draws = torch.rand((count, *lower.shape[1:]), dtype=torch.float64)
    corners = torch.rand_like(draws) < 0.5
    draws[: count // 3] = corners[: count // 3].double()
    return lower + (upper - lower) * draws


@pytest.mark.parametrize("name,net,shape", _networks(), ids=[n for n, _, _ in _networks()])
def test_bounds_contain_every_output_of_random_points_of_the_box(name, net, shape):
    net = _randomise_batchnorm(net)
    image = torch.rand((1, *shape), dtype=torch.float64)
    lower, upper = input_box(image, 12 / 255)
    points = _points(lower, upper, POINTS)
    with torch.no_grad():
        logits = torch.cat([net(chunk) for chunk in points.split(2500)])
        box = interval_bounds(net, lower, upper)
        differences = logit_difference_lower_bounds(net, lower, upper)[0]
        kl_bound = reverse_kl_upper_bound(net, image, 12 / 255)[0]
    assert (logits >= box.lower - TOLERANCE).all() and (logits <= box.upper + TOLERANCE).all()
    assert (box.upper - box.lower).min() >= 0
    assert (logits[:, :, None] - logits[:, None, :] >= differences - TOLERANCE).all()  # z_j - z_c >= d_jc
    num_classes = logits.shape[-1]
    kl = torch.logsumexp(logits, -1) - logits.mean(-1) - math.log(num_classes)
    assert (kl <= kl_bound + TOLERANCE).all()
    bound = proven_conf_dist(net, image, 12)[0]
    conf_dist = (logits.softmax(-1).amax(-1) - 1 / num_classes).clamp(min=0)
    assert (conf_dist <= bound + TOLERANCE).all()
    with torch.no_grad():  # not vacuous: a box of one point gives that point's logits
        point = interval_bounds(net, image, image)
        assert torch.allclose(point.lower, net(image)) and torch.allclose(point.upper, net(image))


def test_bounds_are_exact_for_a_single_linear_layer():
    torch.manual_seed(1)
    layer = nn.Linear(6, 4).double()
    net = nn.Sequential(nn.Flatten(), layer)
    image = torch.rand(3, 1, 2, 3, dtype=torch.float64) * 0.5 + 0.25  # the box stays inside [0, 1]
    lower, upper = input_box(image, 10 / 255)
    centre, radius = ((upper + lower) / 2).flatten(1), ((upper - lower) / 2).flatten(1)
    box = interval_bounds(net, lower, upper)
    differences = logit_difference_lower_bounds(net, lower, upper)
    weight = layer.weight.detach()
    for n in range(3):
        for j in range(4):
            # each logit's bounds are attained at a corner of the box
            low_corner = centre[n] - radius[n] * weight[j].sign()
            high_corner = centre[n] + radius[n] * weight[j].sign()
            assert torch.allclose(layer(low_corner)[j], box.lower[n, j], atol=1e-12)
            assert torch.allclose(layer(high_corner)[j], box.upper[n, j], atol=1e-12)
            for c in range(4):  # and so is each logit difference's
                corner = centre[n] - radius[n] * (weight[j] - weight[c]).sign()
                logits = layer(corner)
                assert torch.allclose(logits[j] - logits[c], differences[n, j, c], atol=1e-12)


def test_at_radius_zero_the_proven_cd_is_the_clean_cd():
    torch.manual_seed(2)
    net = _randomise_batchnorm(_networks()[3][1]).float()
    images = torch.rand(5, 2, 8, 8)
    with torch.no_grad():
        clean = (net(images).softmax(-1).amax(-1) - 1 / 4).clamp(min=0).double()
    at_zero = proven_conf_dist(net, images, 0)  # sound for float32: never below, at most its rounding above
    assert (at_zero >= clean - 1e-7).all() and (at_zero - clean).max() < 1e-3, (at_zero - clean).max()
    from ttp_lightning.bounds.uniformity import Prover

    exact = Prover(net, precision="float64").conf_dist(images, 0)
    with torch.no_grad():
        clean64 = (net.double()(images.double()).softmax(-1).amax(-1) - 1 / 4).clamp(min=0)
    assert torch.allclose(exact, clean64, atol=1e-9)
    net.float()
    assert (proven_conf_dist(net, images, 4) >= proven_conf_dist(net, images, 1) - 1e-12).all()


def test_the_interval_term_is_differentiable_in_the_weights():
    torch.manual_seed(3)
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 4))
    loss = reverse_kl_upper_bound(net, torch.rand(2, 1, 3, 4), 8 / 255).mean()
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters())


@pytest.mark.parametrize("layer", [nn.LayerNorm(12), nn.GELU(), nn.Softmax(dim=-1)], ids=["layernorm", "gelu", "softmax"])
def test_unsupported_layers_are_refused_not_skipped(layer):
    net = nn.Sequential(nn.Flatten(), layer, nn.Linear(12, 3)).eval()
    lower, upper = input_box(torch.rand(1, 1, 3, 4), 0.01)
    with pytest.raises(UnsupportedLayer, match=type(layer).__name__):
        interval_bounds(net, lower, upper)


def test_batchnorm_in_training_mode_is_refused():
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 4), nn.BatchNorm1d(4), nn.Linear(4, 3)).train()
    lower, upper = input_box(torch.rand(2, 1, 3, 4), 0.01)
    with pytest.raises(UnsupportedLayer, match="training mode"):
        interval_bounds(net, lower, upper)


def test_a_timm_resnet_is_bounded():
    timm = pytest.importorskip("timm")
    torch.manual_seed(4)
    net = _randomise_batchnorm(Classifier(timm.create_model("resnet10t", num_classes=3, in_chans=3),
                                          (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)))
    image = torch.rand(1, 3, 32, 32, dtype=torch.float64)
    lower, upper = input_box(image, 1 / 255)
    points = _points(lower, upper, 64)
    with torch.no_grad():
        logits = net(points)
        differences = logit_difference_lower_bounds(net, lower, upper)[0]
    assert (logits[:, :, None] - logits[:, None, :] >= differences - TOLERANCE).all()
