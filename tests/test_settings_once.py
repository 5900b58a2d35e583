"""Settings are checked once and handed down typed (issue 27): each schema's range checks run once per run,
and the data module, the method and the fits hold the very objects validate_config made."""

from collections import Counter

import pytest

from ttp_lightning.alg1 import schema as pareto_schema
from ttp_lightning.config import schema as config_schema
from ttp_lightning.data import build_datamodule
from ttp_lightning.fit.training import RunContext
from ttp_lightning.reporting.run_identity import swept_keys
from ttp_lightning.run.validation import build_method, validate_config

CHECKED = ("MainSchema", "DataSchema", "ForgetSchema", "ParetoSchema", "EarlyStoppingSchema", "AttacksSchema",
           "RelearnSchema", "PretrainSchema", "PerformanceSchema", "ReleaseGateSchema")


@pytest.fixture
def checks_run(monkeypatch):
    """How often each schema's __post_init__ (its range checks) runs."""
    calls: Counter = Counter()
    for name in CHECKED:
        schema = getattr(config_schema, name, None) or getattr(pareto_schema, name)
        original = schema.__dict__["__post_init__"]

        def counted(self, _original=original, _name=name):
            calls[_name] += 1
            _original(self)

        monkeypatch.setattr(schema, "__post_init__", counted)
    return calls


def test_each_section_is_checked_once_and_its_object_is_what_the_parts_read(compose_cfg, checks_run):
    settings = validate_config(compose_cfg())
    method = build_method(settings)
    datamodule = build_datamodule(settings.data)
    ctx = RunContext.of(settings)
    assert checks_run == Counter(dict.fromkeys(CHECKED, 1))
    assert method.settings is settings.method and isinstance(method.settings, pareto_schema.ParetoSchema)
    assert datamodule.forget_cfg is settings.data.forget  # not checked again by the data module
    assert ctx.fit_settings.pretrain is settings.pretrain and ctx.fit_settings.performance is settings.performance


def test_a_config_from_elsewhere_is_checked_by_the_same_schema(compose_cfg):
    """A data config that did not come through validate_config (a results.json's) still gets one line."""
    from omegaconf import OmegaConf

    from ttp_lightning.core.errors import TTPUserError

    data = OmegaConf.to_container(compose_cfg().data, resolve=True)
    data["forget"]["size"] = 0
    with pytest.raises(TTPUserError, match=r"data.forget.size=0 is not allowed"):
        build_datamodule(data)


def test_the_swept_keys_are_what_hydras_parser_calls_a_sweep():
    overrides = ["method.theta=0.25,0.75", "method=pareto,retrain", "seed=1", "+attacks/suite@attacks.suite.apgd=apgd",
                 "hydra.sweep.dir=x,y", "data.forget.size=range(10,30,10)", "data@other=digits,mnist",
                 "method.lr=choice(0.1,0.01)"]
    assert swept_keys(overrides) == ["method.theta", "method", "data.forget.size", "data@other", "method.lr"]


def test_a_robust_alg1_setting_that_does_not_exist_is_one_line_not_ignored():
    """A typo under method.adversarial in an experiment file was dropped silently by AdversarialSettings."""
    from ttp_lightning.alg1.schema import adversarial_settings
    from ttp_lightning.core.errors import TTPUserError

    assert adversarial_settings({"gamma": 4, "surrogate_betas": [10]}).surrogate_betas == (10,)
    with pytest.raises(TTPUserError, match=r"method.adversarial.gama is not a setting of robust Alg 1; allowed: gamma,"):
        adversarial_settings({"gama": 4})


def test_plain_alg1_under_a_robust_experiment_file_is_one_line_not_half_robust(compose_cfg):
    """+experiment=mnist_resnet8_robust sets method.adversarial (its attack steps); with method=pareto those keys made
    plain Alg 1 robust under AdversarialSettings' other defaults (a fixed radius, no margin), filed as plain Alg 1.
    It is one line now, and method.adversarial=null gives plain Alg 1."""
    from ttp_lightning.core.errors import TTPUserError

    with pytest.raises(TTPUserError, match=r"method.adversarial=\{.*'steps': 10.*\} is not allowed with method=pareto, plain"
                                           r" Alg 1 .*; choose method=pareto_robust, or add method.adversarial=null"):
        build_method(validate_config(compose_cfg("+experiment=mnist_resnet8_robust", "method=pareto")))
    plain = build_method(validate_config(compose_cfg("+experiment=mnist_resnet8_robust", "method=pareto",
                                                     "method.adversarial=null")))
    assert plain.settings.name == "pareto" and not plain.settings.adversarial
    robust = build_method(validate_config(compose_cfg("+experiment=mnist_resnet8_robust")))
    assert robust.settings.name == "pareto_robust" and robust.settings.adversarial["steps"] == 10
