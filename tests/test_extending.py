"""Adding an attack, a baseline and a data set touches no file of the package: each is one module (importable
from anywhere) plus one YAML in a config folder on Hydra's search path (`hydra.searchpath=[file://DIR]`).
The method case is test_cli.test_a_method_is_one_module_plus_one_yaml."""

import textwrap

import pytest

from conftest import TINY_WITHOUT_METHOD
from ttp_lightning.core.errors import EXIT_NOT_PROTECTED


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """write(module_name, code, group, yaml_name, yaml) -> the hydra.searchpath override for tmp_path/conf."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(module: str, code: str, group: str, name: str, yaml: str) -> str:
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(code))
        (tmp_path / "conf" / group).mkdir(parents=True, exist_ok=True)
        (tmp_path / "conf" / group / f"{name}.yaml").write_text(textwrap.dedent(yaml))
        return f"hydra.searchpath=[file://{tmp_path / 'conf'}]"

    return write


FAST_ATTACKS = ["attacks.gammas=[8]", "attacks.robust_gamma=8", "attacks.apgd_steps=5", "attacks.restarts=1",
                "attacks.relearn.enabled=false"]


def test_an_attack_is_one_module_plus_one_yaml(run_main, plugin):
    search = plugin("brighten", """
        import torch
        from ttp_lightning.attacks import Attack

        class Brighten(Attack):
            random = True  # reads no gradient

            def __call__(self, model, images, gamma, generator, cfg, **_):
                return (images + gamma).clamp(0, 1)
        """, "attacks/suite", "brighten", "_target_: brighten.Brighten\n")
    code, out, err, results = run_main(search, "+attacks/suite@attacks.suite.brighten=brighten", *FAST_ATTACKS)
    assert code in (0, EXIT_NOT_PROTECTED), err[-2000:]  # the tiny run's gate is not what this test is about
    attacks = results["attacks"]["pareto"]
    assert list(attacks) == ["none", "worst", "gaussian", "apgd", "brighten"]  # the suite's order, worst added
    assert attacks["worst"]["8"]["forget_conf_dist"] >= attacks["brighten"]["8"]["forget_conf_dist"]
    assert "brighten" in out
    # the group's earlier spelling (conf/attack/, before issue 60) still adds it
    code, _, err, _ = run_main(search, "+attack@attacks.suite.brighten=brighten", "attacks.suite.brighten._target_=brighten.Nope",
                               *FAST_ATTACKS)
    assert code == 2 and err.strip().splitlines()[-1].startswith(
        "error: attacks.suite.brighten._target_=brighten.Nope cannot be built")


def test_a_baseline_is_one_module_plus_one_yaml(run_main, plugin):
    """A baseline that trains nothing: the final layer zeroed gives the uniform softmax everywhere (Prop.
    `uniform_learner_exists`), the trivial end of the privacy / utility trade-off."""
    search = plugin("uniform_head", """
        import copy
        import torch
        from torch import nn
        from ttp_lightning.methods import Method, MethodOutput

        class UniformHead(Method):
            def run(self, ctx, pretrained, datamodule, make_net):
                net = copy.deepcopy(pretrained)
                head = [m for m in net.modules() if isinstance(m, nn.Linear)][-1]
                with torch.no_grad():
                    head.weight.zero_()
                    head.bias.zero_()
                return MethodOutput(net, {})
        """, "method", "uniform_head", "_target_: uniform_head.UniformHead\nname: uniform_head\n")
    code, _, err, results = run_main("method=uniform_head", search, "attacks.enabled=false", *TINY_WITHOUT_METHOD,
                                     tiny=False)
    assert code == 0, err[-2000:]
    metrics = results["metrics"]["uniform_head"]
    assert metrics["forget_conf_dist"] == pytest.approx(0, abs=1e-6) and metrics["test_conf_dist"] == pytest.approx(0, abs=1e-6)
    assert results["release_gate"]["passed"] and results["method"] == "uniform_head"


def test_a_data_set_is_one_module_plus_one_yaml(run_main, plugin):
    """Three classes of 6x6 grey images (a bright row per class, plus noise), read by a Source subclass."""
    search = plugin("bright_rows", """
        import torch
        from ttp_lightning.data.arrays import ImageArrays
        from ttp_lightning.data.sources import Source

        class BrightRows(Source):
            def read(self, root, download):
                generator = torch.Generator().manual_seed(0)
                labels = torch.arange(300) % 3
                images = torch.rand(300, 1, 6, 6, generator=generator) * 0.3
                images[torch.arange(300), 0, 2 * labels] += 0.7
                pixels = (images.clamp(0, 1) * 255).round().to(torch.uint8)
                return ImageArrays(pixels, labels, pixels[:0], labels[:0])
        """, "data", "bright_rows", """
        defaults:
          - /data_defaults@_here_
          - _self_
        name: bright_rows
        loader:
          _target_: bright_rows.BrightRows
          num_classes: 3
          channels: 1
          image_size: 6
          mean: [0.3]
          std: [0.3]
          expected_files: nothing (generated)
          has_official_split: false
        split: paper
        forget:
          size: 6
        """)
    code, _, err, results = run_main("data=bright_rows", search, *FAST_ATTACKS, "data.forget.size=6")
    assert code in (0, EXIT_NOT_PROTECTED), err[-2000:]
    assert results["experiment"] == "bright_rows_mlp" and results["data"]["train_size"] == 210  # 70 % of 300
    assert results["metrics"]["pretrain"]["test_acc"] > 0.9
    assert results["metrics"]["pareto"]["forget_conf_dist"] < results["metrics"]["pretrain"]["forget_conf_dist"]
