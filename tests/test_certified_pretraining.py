"""Certified pretraining (issue 80): the interval bound through BatchNorm in training mode holds for the function
the batch trains (sampled points), the class margins bound z_y - z_j from below at every sampled point, the
IBP loss bounds the cross entropy everywhere in the box, the ramp and the schedule follow their rules, Shi et
al.'s initialisation has its spread, and a certified fit makes more images verifiable than plain ERM."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ttp_lightning.bounds.propagate import UnsupportedLayer, interval_bounds, trace
from ttp_lightning.bounds.training import (
    batch_statistics,
    certified_cross_entropy,
    class_margins,
    ibp_initialise,
    smoothed_ramp,
    warmup_regulariser,
)
from ttp_lightning.bounds.uniformity import input_box
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.models.certified_erm import Phases, phases
from ttp_lightning.models.components.classifier import Classifier
from ttp_lightning.models.components.resnet import ResNet

POINTS = 2000


def _resnet() -> nn.Module:
    torch.manual_seed(0)
    return Classifier(ResNet(1, 8, 4, [1, 1, 0, 0], width=4), (0.4,), (0.3,)).double()


def _frozen_batchnorm_forward(net: nn.Module, statistics: dict, x: torch.Tensor) -> torch.Tensor:
    """The training-mode network with every BatchNorm fixed to the recorded statistics: the function the
    batch trains, evaluated at other inputs."""
    hooks = []
    for name, module in net.named_modules():
        if name in statistics:
            mean, var = statistics[name]

            def affine(module, inputs, output, mean=mean, var=var):
                shape = (1, -1) + (1,) * (inputs[0].dim() - 2)
                y = (inputs[0] - mean.view(shape)) * torch.rsqrt(var.view(shape) + module.eps)
                return y * module.weight.view(shape) + module.bias.view(shape)
            hooks.append(module.register_forward_hook(affine))
    try:
        return net(x)
    finally:
        for hook in hooks:
            hook.remove()


def test_batch_statistics_are_what_batchnorm_normalises_by():
    net = _resnet().train()
    images = torch.rand(16, 1, 8, 8, dtype=torch.float64)
    logits, statistics = batch_statistics(net, images)
    assert len(statistics) == sum(isinstance(m, nn.BatchNorm2d) for m in net.modules())
    with torch.no_grad():
        again = _frozen_batchnorm_forward(net, {k: (m.detach(), v.detach()) for k, (m, v) in statistics.items()},
                                          images)
    assert torch.allclose(logits, again, atol=1e-10)


def test_training_mode_bounds_hold_for_the_function_the_batch_trains():
    net = _resnet().train()
    images = torch.rand(8, 1, 8, 8, dtype=torch.float64)
    radius = 4 / 255
    _, statistics = batch_statistics(net, images)
    statistics = {k: (m.detach(), v.detach()) for k, (m, v) in statistics.items()}
    lower, upper = input_box(images, radius)
    labels = torch.arange(8) % 4
    margins, relus = class_margins(net, trace(net), lower, upper, labels, statistics)
    box = interval_bounds(net, lower, upper, statistics=statistics)
    assert relus and all(torch.all(b.lower <= b.upper) for b in relus)
    with torch.no_grad():
        for _ in range(POINTS // 8):
            x = lower + (upper - lower) * torch.rand_like(lower)
            x = torch.where(torch.rand_like(x) < 0.2, torch.where(torch.rand_like(x) < 0.5, lower, upper), x)
            z = _frozen_batchnorm_forward(net, statistics, x)
            assert torch.all(z >= box.lower - 1e-9) and torch.all(z <= box.upper + 1e-9)
            true = z.gather(1, labels[:, None])
            assert torch.all(true - z >= margins - 1e-9)  # z_y - z_j at the point, never below its bound
            # the IBP loss bounds the cross entropy at every point of the box
            assert certified_cross_entropy(margins, labels) >= F.cross_entropy(z, labels) - 1e-9


def test_training_mode_batchnorm_without_statistics_is_refused():
    net = _resnet().train()
    lower, upper = input_box(torch.rand(2, 1, 8, 8, dtype=torch.float64), 0.01)
    with pytest.raises(UnsupportedLayer, match="training mode"):
        class_margins(net, trace(net), lower, upper, torch.zeros(2, dtype=torch.long))


def test_margins_at_radius_zero_are_the_logit_differences():
    net = _resnet().eval()
    images = torch.rand(4, 1, 8, 8, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 3])
    margins, _ = class_margins(net, trace(net), images, images, labels)
    with torch.no_grad():
        z = net(images)
    assert torch.allclose(margins, z.gather(1, labels[:, None]) - z, atol=1e-10)
    assert torch.allclose(certified_cross_entropy(margins, labels), F.cross_entropy(z, labels), atol=1e-10)


def test_smoothed_ramp_is_continuous_monotone_and_ends_at_one():
    grid = [i / 1000 for i in range(-10, 1011)]
    values = [smoothed_ramp(p) for p in grid]
    assert values[0] == 0.0 and values[-1] == 1.0
    assert all(b >= a for a, b in itertools.pairwise(values))
    assert max(b - a for a, b in itertools.pairwise(values)) < 0.002  # no jump (slope continuous at the middle)
    assert smoothed_ramp(0.125) < 0.125 / 4  # slow at first


def test_phases_follow_their_rule_and_refuse_what_does_not_fit():
    assert phases(10) == Phases(1, 3, 10)
    assert phases(3) == Phases(0, 1, 3)
    assert phases(1) == Phases(0, 1, 1)
    assert phases(70, 1, 20) == Phases(1, 20, 70)
    schedule = phases(10)
    assert schedule.share(0.5) == 0.0 and schedule.share(4.0) == 1.0 and 0 < schedule.share(2.0) < 1
    with pytest.raises(TTPUserError, match="more than pretrain.epochs=4"):
        phases(4, 2, 3)


def test_explicit_phases_longer_than_the_fit_are_one_error_line(compose_cfg):
    from ttp_lightning.run.validation import validate_config

    with pytest.raises(TTPUserError, match="pretrain.certified: warmup_epochs \\+ ramp_epochs = 9"):
        validate_config(compose_cfg("pretrain.epochs=5", "pretrain.certified.gamma=2",
                                    "pretrain.certified.warmup_epochs=4", "pretrain.certified.ramp_epochs=5"))
    with pytest.raises(TTPUserError, match="pretrain.certified.gamma"):
        validate_config(compose_cfg("pretrain.certified.gamma=-1"))


def test_ibp_initialisation_has_shis_spread_and_halves_after_a_sum():
    net = Classifier(ResNet(1, 8, 4, [1, 1, 0, 0], width=8), (0.4,), (0.3,))
    last = net.backbone.fc.weight.detach().clone()
    names = ibp_initialise(net, torch.Generator().manual_seed(0))
    assert "backbone.fc" not in names and torch.equal(net.backbone.fc.weight, last)
    stem = net.backbone.stem[0].weight  # fan_in 9: std sqrt(2 pi) / 9
    assert stem.std().item() == pytest.approx(math.sqrt(2 * math.pi) / 9, rel=0.25)
    after = net.backbone.stages[1].body[0].weight  # reads relu(block 1's sum): halved
    fan_in = after[0].numel()
    assert after.std().item() == pytest.approx(0.5 * math.sqrt(2 * math.pi) / fan_in, rel=0.15)
    first = net.backbone.stages[0].body[0].weight  # reads the stem's relu (no sum): not halved
    assert first.std().item() == pytest.approx(math.sqrt(2 * math.pi) / first[0].numel(), rel=0.15)


def test_warmup_regulariser_is_finite_and_penalises_exploding_boxes():
    net = _resnet().train()
    images = torch.rand(16, 1, 8, 8, dtype=torch.float64)
    _, statistics = batch_statistics(net, images)
    lower, upper = input_box(images, 2 / 255)
    labels = torch.zeros(16, dtype=torch.long)
    _, relus = class_margins(net, trace(net), lower, upper, labels, statistics)
    radius = (upper - lower) / 2
    value = warmup_regulariser(relus, radius, 0.5)
    assert torch.isfinite(value) and value >= 0
    assert warmup_regulariser([], radius, 0.5) == 0
    # tightness alone (every neuron surely active: the balance term is undefined and left out): a box as wide as
    # the input's costs nothing, ten times wider relu(0.5 - 0.1) / 0.5
    centre = torch.full((16, 4), 5.0, dtype=torch.float64)
    r0 = radius.mean()
    for scale, expected in ((1.0, 0.0), (10.0, 0.8)):
        box = type(relus[0])(centre - scale * r0, centre + scale * r0)
        assert warmup_regulariser([box], radius, 0.5).item() == pytest.approx(expected)
    # balance: active and inactive centres of equal size and spread cost nothing, a lopsided layer costs more
    even = torch.tensor([[-2.0, 2.0, -1.0, 1.0]], dtype=torch.float64)
    lopsided = torch.tensor([[-0.1, 2.0, -0.1, 1.0]], dtype=torch.float64)
    tight = [type(relus[0])(c - 1e-6, c + 1e-6) for c in (even, lopsided)]
    assert warmup_regulariser([tight[0]], torch.full((1,), 1e-6), 0.5) < \
        warmup_regulariser([tight[1]], torch.full((1,), 1e-6), 0.5)


def test_certified_fit_verifies_more_than_plain_erm():
    """A few hundred steps on separable toy images: the certified module's margins at the radius are positive on
    more images than plain ERM's (the bound it trains for is the one it improves)."""
    import lightning as L

    from ttp_lightning.models.certified_erm import CertifiedERMModule
    from ttp_lightning.models.erm import ERMModule

    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (256,), generator=generator)
    images = (0.5 + 0.08 * torch.randn(256, 1, 8, 8, generator=generator)).clamp(0, 1)
    for c in range(4):  # class c: a brighter quadrant
        rows, cols = divmod(c, 2)
        images[labels == c, :, rows * 4:rows * 4 + 4, cols * 4:cols * 4 + 4] += 0.3
    images = images.clamp(0, 1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels), batch_size=64)
    optim = {"optimizer": {"_target_": "torch.optim.Adam", "_partial_": True, "lr": 0.01}, "schedule": None}
    radius = 8 / 255
    verified = {}
    for name in ("erm", "certified"):
        torch.manual_seed(1)
        net = Classifier(ResNet(1, 8, 4, [1, 0, 0, 0], width=4), (0.5,), (0.2,))
        module = ERMModule(net, optim) if name == "erm" else \
            CertifiedERMModule(net, optim, radius=radius, schedule=phases(8), robust_weight=0.5)
        L.Trainer(max_epochs=8, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, accelerator="cpu").fit(module, loader)
        net.eval()
        lower, upper = input_box(images, radius)
        with torch.no_grad():
            margins, _ = class_margins(net, trace(net), lower, upper, labels)
        verified[name] = int((margins.masked_fill(F.one_hot(labels, 4).bool(), math.inf).amin(1) > 0).sum())
    assert verified["certified"] > verified["erm"] + 20, verified


def test_the_bound_term_is_on_by_rule_for_a_batchnorm_network_trained_for_the_bound_and_the_card_says_so():
    """interval_weight=auto: 0 on a BatchNorm network (naturally trained, as measured), 0.1 on one whose A(D) was
    certified-pretrained here; the card names certified pretraining as not the paper's A(D), and a provider's
    checkpoint as the provider's."""
    import dataclasses
    from types import SimpleNamespace

    from ttp_lightning.alg1.method import INTERVAL_WEIGHT_AUTO, resolve_interval_weight
    from ttp_lightning.alg1.schema import AdversarialSettings
    from ttp_lightning.config.schema import CertifiedPretrainSchema
    from ttp_lightning.core.batching import ImageBatchDataset
    from ttp_lightning.release.card import starting_point

    forget = ImageBatchDataset(torch.rand(1, 2), torch.zeros(1, dtype=torch.long))
    auto = dataclasses.replace(AdversarialSettings(), interval_weight="auto")
    net = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)).eval()
    assert resolve_interval_weight(auto, net, forget).interval_weight == 0.0
    assert resolve_interval_weight(auto, net, forget, trained_for_bound=True).interval_weight == INTERVAL_WEIGHT_AUTO
    certified = SimpleNamespace(model={}, pretrain=SimpleNamespace(certified=CertifiedPretrainSchema(gamma=3)))
    assert "interval bound at 3/255" in starting_point(certified) and "not the paper's" in starting_point(certified)
    plain = SimpleNamespace(model={}, pretrain=SimpleNamespace(certified=CertifiedPretrainSchema()))
    assert starting_point(plain) == "a model pretrained by ttp_lightning"
    provider = SimpleNamespace(model={"checkpoint": "x.safetensors"}, pretrain=certified.pretrain)
    assert "provider's checkpoint" in starting_point(provider)
