"""Every experiment file composes, passes validation and builds its model for its data set."""

import pytest
import torch

from conftest import CONF_DIR, registered_loader
from ttp_lightning.models.components import build_classifier
from ttp_lightning.run.validation import validate_config

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
REQUIRED = {
    "digits_mlp", "mnist_logreg", "mnist_mlp", "mnist_resnet18", "kmnist_logreg", "kmnist_mlp", "kmnist_resnet18",
    "svhn_resnet50", "cifar10_resnet8", "cifar10_resnet18", "cifar10_resnet50", "cifar10_vit_s_16",
    "cifar10_vit_b_16", "cifar100_resnet8", "cifar100_resnet50", "cifar100_vit_s_16", "cifar100_vit_b_16",
    "tinyimagenet_vit_s_16", "tinyimagenet_vit_b_16", "tinyimagenet_resnet50",
}


def test_every_paper_setting_has_an_experiment():
    assert REQUIRED <= set(EXPERIMENTS)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_validates_and_builds(compose_cfg, name):
    cfg = compose_cfg(f"+experiment={name}", tiny=False)
    assert cfg.experiment_name == name
    dataset, rest = name.split("_", 1)  # <dataset>_<model>[_<variant>]
    assert cfg.data.name == dataset and rest.startswith(cfg.hydra.runtime.choices.model)
    validate_config(cfg)
    info = registered_loader(dataset).info
    net = build_classifier(cfg.model, info).eval()
    with torch.no_grad():
        logits = net(torch.rand(1, info.channels, info.image_size, info.image_size))
    assert logits.shape == (1, info.num_classes)


def test_experiments_still_allow_the_retrain_method(compose_cfg):
    cfg = compose_cfg("+experiment=mnist_mlp", "method=retrain", tiny=False)
    assert cfg.method.name == "retrain" and cfg.pretrain.epochs == 5
    # an experiment that picks Alg 1's optimizer composes with every baseline too (the baselines ignore it)
    for baseline in ("retrain", "synthetic", "labeldp", "gaussian_uniform"):
        cfg = compose_cfg("experiment=cifar10_resnet18", f"method={baseline}", tiny=False)
        assert cfg.method.name == baseline and cfg.method.optimizer._target_ == "torch.optim.SGD"


def test_the_typed_schemas_check_types_choices_and_ranges(compose_cfg):
    """Types and closed choices fail at composition; ranges when validate_config builds the schema objects."""
    from omegaconf.errors import ValidationError

    from ttp_lightning.alg1.schema import ParetoSchema
    from ttp_lightning.config.schema import typed
    from ttp_lightning.core.errors import TTPUserError

    cfg = compose_cfg()
    settings = typed(cfg.method, "method")
    assert isinstance(settings, ParetoSchema) and settings.mode == "minibatch" and settings.theta == 0.75
    assert type(cfg.method.mode).__name__ == "Mode" and f"{cfg.method.mode}" == "minibatch"
    for bad in ("method.theta=high", "method.mode=sometimes", "pretrain.projection=ball", "data.augment=rotate",
                "method.early_stopping.patience=soon"):
        with pytest.raises(Exception) as caught:
            compose_cfg(bad)
        assert isinstance(caught.value.__cause__ or caught.value, ValidationError) or "Invalid value" in str(caught.value)
    for bad, message in (("method.theta=1.5", "method.theta=1.5 is not allowed"),
                         ("method.early_stopping.retain_acc_at_least=2", "retain_acc_at_least=2.0 is not allowed"),
                         ("data.train_fraction=1", "data.train_fraction=1.0 is not allowed")):
        key = bad.split(".")[0]
        with pytest.raises(TTPUserError, match=message):
            typed(compose_cfg(bad)[key], key)


@pytest.mark.parametrize("name,key,grid", [
    ("mnist_mlp_forget_size", "data.forget.size", "100,250,500,1000,5000"),
    ("mnist_logreg_certified_forget_size", "data.forget.size", "100,250,500,1000,5000"),
    ("mnist_mlp_test_instances", "data.forget.test_fraction", "0,0.2,0.5,1.0"),
    ("mnist_mlp_synthetic_k", "method.k", "5,25,125,250,500"),
])
def test_ablation_experiments_sweep_the_paper_grid(compose_cfg, name, key, grid):
    cfg = compose_cfg(f"+experiment={name}", tiny=False)
    assert cfg.hydra.sweeper.params[key] == grid


@pytest.mark.parametrize("overrides, expected", [
    ((), "digits_mlp"),
    (("data=cifar10", "model=resnet8"), "cifar10_resnet8"),
    (("data=cifar10", "model=resnet8", "model.width=16"), "cifar10_resnet8"),  # the closest registered config
    (("data=mnist", "model=resnet50"), "mnist_resnet50"),
    (("model=timm", "model.name=hf-hub:org/net"), "digits_timm_hf-hub_org_net"),  # a path-safe name
    (("+experiment=cifar10_resnet18", "model.width=8"), "cifar10_resnet18"),  # an experiment names itself
    (("data=cifar10", "model=resnet8", "experiment_name=mine"), "mine"),
])
def test_without_an_experiment_file_the_name_is_the_data_and_the_model(compose_cfg, overrides, expected):
    cfg = compose_cfg(*overrides, tiny=False)
    assert cfg.experiment_name == expected
    assert f"outputs/{expected}/pareto/" in cfg.hydra.run.dir
