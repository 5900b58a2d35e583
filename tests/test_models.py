import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from conftest import CONF_DIR, registered_loader
from ttp_lightning.models.components import build_classifier
from ttp_lightning.models.components.classifier import Classifier


def model_cfg(name: str, **overrides):
    cfg = OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml")
    return OmegaConf.merge(cfg, overrides)


def last_affine(module: nn.Module) -> nn.Linear:
    return [m for m in module.modules() if isinstance(m, nn.Linear)][-1]


@pytest.mark.parametrize("name", ["logreg", "mlp", "resnet8", "resnet18", "resnet50"])
@pytest.mark.parametrize("dataset", ["digits", "mnist", "cifar10"])
def test_models_give_logits_for_each_input_shape(name, dataset):
    info = registered_loader(dataset).info
    model = build_classifier(model_cfg(name), info).eval()
    logits = model(torch.rand(2, info.channels, info.image_size, info.image_size))
    assert logits.shape == (2, info.num_classes)
    # Prop. uniform_learner_exists: zeroing the final affine layer gives the uniform softmax
    head = last_affine(model)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
    probs = model(torch.rand(2, info.channels, info.image_size, info.image_size)).softmax(-1)
    assert torch.allclose(probs, torch.full_like(probs, 1 / info.num_classes))


def test_resnet_depths():
    info = registered_loader("cifar10").info
    count = lambda name: sum(p.numel() for p in build_classifier(model_cfg(name), info).parameters())
    assert count("resnet8") < count("resnet18") < count("resnet50")
    assert 11.0e6 < count("resnet18") < 11.3e6  # the standard CIFAR ResNet18 size


@pytest.mark.parametrize("name,low,high", [("vit_s_16", 20e6, 23e6)])
def test_vit_builds_for_small_images(name, low, high):
    info = registered_loader("cifar100").info
    model = build_classifier(model_cfg(name), info).eval()
    assert low < sum(p.numel() for p in model.parameters()) < high
    assert model(torch.rand(1, 3, 32, 32)).shape == (1, 100)
    assert model.backbone.patch_embed.num_patches == 64


def test_normalisation_lives_inside_the_model():
    backbone = nn.Flatten()
    model = Classifier(backbone, mean=(0.5,), std=(0.25,))
    images = torch.rand(3, 1, 2, 2)
    assert torch.allclose(model(images), ((images - 0.5) / 0.25).flatten(1))
