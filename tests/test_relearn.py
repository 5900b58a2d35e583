"""The relearning attack: finetuning the released weights on public data, then measuring the forget set."""

import math

import torch
from torch import nn

from ttp_lightning.attacks.relearn import relearn_attack, relearn_worst, retain_subset
from ttp_lightning.core.batching import ImageBatchDataset


def test_relearning_restores_what_finetuning_can_and_leaves_the_model_untouched():
    torch.manual_seed(0)
    centres = torch.rand(3, 1, 4, 4)
    labels = torch.arange(3).repeat_interleave(40)
    images = (centres[labels] + 0.05 * torch.randn(120, 1, 4, 4)).clamp(0, 1)
    public = ImageBatchDataset((images[:90] * 255).round().to(torch.uint8), labels[:90])
    forget = ImageBatchDataset((images[90:] * 255).round().to(torch.uint8), labels[90:])
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    nn.init.zeros_(net[1].weight)
    nn.init.zeros_(net[1].bias)  # uniform everywhere: forget CD 0
    before = [p.clone() for p in net.parameters()]
    scores = relearn_attack(net, public, forget, [1, 10, 100], lr=0.05, batch_size=32, seed=0, device="cpu")
    assert list(scores) == ["1", "10", "100"]
    assert scores["1"]["forget_conf_dist"] < scores["100"]["forget_conf_dist"]  # the forget images come back
    assert scores["100"]["forget_acc"] > 0.9 and scores["100"]["forget_worst_conf_dist"] >= scores["100"]["forget_conf_dist"]
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))  # the attack works on a copy


def _clusters(seed: int = 0):
    torch.manual_seed(seed)
    centres = torch.rand(3, 1, 4, 4)
    labels = torch.arange(3).repeat_interleave(40)
    images = ((centres[labels] + 0.05 * torch.randn(120, 1, 4, 4)).clamp(0, 1) * 255).round().to(torch.uint8)
    return ImageBatchDataset(images[:60], labels[:60]), ImageBatchDataset(images[60:90], labels[60:90]), \
        ImageBatchDataset(images[90:], labels[90:])


def test_the_worst_case_is_the_upper_envelope_over_sources_and_rates_and_names_its_run():
    retain, test, forget = _clusters()
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    nn.init.zeros_(net[1].weight)
    nn.init.zeros_(net[1].bias)
    sources = {"test": test, "retain 20": retain_subset(retain, 20, seed=0)}
    worst, runs = relearn_worst(net, sources, forget, [1, 50], [1e-4, 0.05], batch_size=16, seed=0, device="cpu")
    assert sorted(runs) == ["retain 20 lr 0.0001", "retain 20 lr 0.05", "test lr 0.0001", "test lr 0.05"]
    for steps in ("1", "50"):
        for key in ("forget_conf_dist", "forget_acc", "forget_worst_conf_dist"):
            assert worst[steps][key] == max(run[steps][key] for run in runs.values())
        assert runs[worst[steps]["run"]][steps]["forget_conf_dist"] == worst[steps]["forget_conf_dist"]
    # the higher rate restores more; the lowest barely moves the uniform model
    assert worst["50"]["run"].endswith("lr 0.05") and runs["test lr 0.0001"]["50"]["forget_conf_dist"] < 0.05


def test_the_retain_subset_is_seeded_without_replacement_and_unaugmented():
    retain, _, _ = _clusters()
    retain.augment = lambda images, generator: images * 0  # an augmented training view must not leak in
    first, again, other = (retain_subset(retain, 25, seed) for seed in (3, 3, 4))
    assert len(first) == 25 and torch.equal(first.images, again.images) and not torch.equal(first.images, other.images)
    assert first.augment is None and len(retain_subset(retain, None, 0)) == len(retain_subset(retain, 10_000, 0)) == 60
    rows = {tuple(row.flatten().tolist()) for row in first.images}
    assert len(rows) == 25 and rows <= {tuple(row.flatten().tolist()) for row in retain.images}


def test_a_nan_run_counts_as_the_worst():
    from ttp_lightning.attacks.relearn import _nan_highest

    chosen = max([0.2, float("nan"), 0.5], key=_nan_highest)
    assert math.isnan(chosen)  # NaN is the highest: a broken finetune never looks safe


def test_a_run_relearns_its_models_and_the_retrained_floor(run_main, tmp_path):
    """The pipeline: relearning from the test split and a retain sample at two rates, the worst case in the attack
    table and results.json, and A(D_r) (trained once, then from the cache) finetuned the same way as the floor."""
    overrides = ("attacks.relearn.floor=true", "attacks.relearn.data=[test,retain]", "attacks.relearn.lrs=[0.001,0.01]",
                 "attacks.relearn.retain_size=200", "attacks.apgd_steps=10", "attacks.restarts=1")
    code, out, err, results = run_main(*overrides)
    assert code in (0, 4), err
    assert sorted(results["relearn_runs"]["pareto"]) == ["retain 200 lr 0.001", "retain 200 lr 0.01",
                                                         "test lr 0.001", "test lr 0.01"]
    floor = results["relearn_floor"]
    assert floor["retrain_cached"] is False and list(floor["worst"]) == ["1", "10", "100"]
    # A(D_r) never saw the forget images and was never made uniform: confident on them before any finetuning
    assert floor["worst"]["1"]["forget_conf_dist"] > 0.5
    assert "relearn floor: A(D_r)" in out and results["relearn"]["pareto"]["100"]["run"] in results["relearn_runs"]["pareto"]
    assert "relearn floor: A(D_r)" in (tmp_path / "out" / results["release"]["folder"] / "README.md").read_text()
    (tmp_path / "out" / "results.json").unlink()
    code, _, err, again = run_main(*overrides)
    assert code in (0, 4), err
    assert again["relearn_floor"]["retrain_cached"] is True and again["relearn_floor"]["worst"] == floor["worst"]


def test_no_floor_is_trained_when_there_is_nothing_to_relearn_on():
    """A(D_r) costs a training: it is not trained for method=retrain (it is A(D_r)), with the floor off, or when no
    relearning source exists (the attack off, or data=[test] on a data set without a test split)."""
    from types import SimpleNamespace

    import pytest

    from ttp_lightning.config.schema import RelearnSchema
    from ttp_lightning.run.assessment import relearn_sources, run_relearn_sources
    from ttp_lightning.run.pipeline import retrain_floor

    datamodule = SimpleNamespace(test_labels=torch.zeros(0))
    never = (lambda: pytest.fail("A(D_r) was built"))

    def settings(attacks_on=True, **relearn):
        return SimpleNamespace(attacks=SimpleNamespace(enabled=attacks_on, seed=0, relearn=RelearnSchema(**relearn)))

    method, some = SimpleNamespace(name="pareto"), {"test": object()}
    assert relearn_sources(datamodule, RelearnSchema(data=["test"]), 0) == {}
    assert run_relearn_sources(settings(attacks_on=False).attacks, datamodule) == {}  # the attacks off: no floor
    assert run_relearn_sources(settings(enabled=False).attacks, datamodule) == {}  # relearning off: none either
    assert retrain_floor(settings(data=["test"]), None, datamodule, method, never, {}) is None
    assert retrain_floor(settings(floor=False), None, datamodule, method, never, some) is None
    assert retrain_floor(settings(), None, datamodule, SimpleNamespace(name="retrain"), never, some) is None


def _bn_net(seed: int) -> nn.Module:
    """An MLP with batch norm (its statistics must stay per run). No bias before batch norm: a bias there has a
    gradient of zero up to rounding, which Adam's first steps (about lr times its sign) turn into steps of lr in
    directions that rounding decides."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8, bias=False), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def test_runs_trained_together_take_the_steps_each_takes_alone():
    """The batched attack (every model, source and rate in one vmapped step) against one run at a time, for two
    different nets with batch norm (whose statistics each run keeps apart): the same scores after every count."""
    from ttp_lightning.attacks.relearn import relearn_each

    retain, test, forget = _clusters()
    nets = {"a": _bn_net(1), "b": _bn_net(2)}
    sources = {"test": test, "retain 25": retain_subset(retain, 25, seed=0)}
    together = relearn_each(nets, sources, forget, [1, 5, 30], [1e-3, 0.05], batch_size=8, seed=3, device="cpu")
    assert list(together) == ["a", "b"]
    for name, net in nets.items():
        worst, runs = together[name]
        assert sorted(runs) == ["retain 25 lr 0.001", "retain 25 lr 0.05", "test lr 0.001", "test lr 0.05"]
        for label, scores in runs.items():
            source, lr = label.rsplit(" lr ", 1)
            alone = relearn_attack(net, sources[source], forget, [1, 5, 30], float(lr), 8, 3, "cpu")
            for count, row in alone.items():
                for key, value in row.items():
                    assert abs(scores[count][key] - value) < 1e-4, (name, label, count, key)
        assert worst["30"]["forget_conf_dist"] == max(run["30"]["forget_conf_dist"] for run in runs.values())
    assert together["a"][1] != together["b"][1]  # two nets, two answers


def test_runs_too_large_for_one_step_are_split_and_other_architectures_kept_apart(monkeypatch):
    from ttp_lightning.attacks import relearn

    _, test, forget = _clusters()
    nets = {"bn": _bn_net(1), "linear": nn.Sequential(nn.Flatten(), nn.Linear(16, 3))}
    runs = [relearn._Run(model, "test", lr) for model in nets for lr in (0.1, 0.01, 0.001)]
    monkeypatch.setattr(relearn, "MAX_VALUES_PER_STEP", 2 * 8 * 16)  # two runs of 8 images of 16 values a step
    groups = relearn._groups(runs, nets, 8, 16)
    assert [[(run.model, run.lr) for run in group] for group in groups] == [
        [("bn", 0.1), ("bn", 0.01)], [("bn", 0.001)], [("linear", 0.1), ("linear", 0.01)], [("linear", 0.001)]]
    # a convolution's runs train one at a time (vmap makes it a grouped convolution, slower on a CPU)
    cnn = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 3))
    assert not relearn.trains_together(cnn) and relearn.trains_together(nets["bn"])
    alone = relearn._groups([relearn._Run("cnn", "test", lr) for lr in (0.1, 0.01)], {"cnn": cnn}, 8, 16)
    assert [len(group) for group in alone] == [1, 1]
    split = relearn.relearn_each(nets, {"test": test}, forget, [3], [0.1, 0.01, 0.001], 8, 0, "cpu")
    monkeypatch.setattr(relearn, "MAX_VALUES_PER_STEP", 2 ** 22)
    whole = relearn.relearn_each(nets, {"test": test}, forget, [3], [0.1, 0.01, 0.001], 8, 0, "cpu")
    for name in nets:
        for label, scores in whole[name][1].items():
            for key, value in scores["3"].items():
                assert abs(split[name][1][label]["3"][key] - value) < 1e-5


def test_a_cnn_relearns_in_channels_last_on_a_cpu_with_the_default_formats_scores(monkeypatch):
    """A CNN's one-at-a-time runs train in channels_last on a CPU (about 1.6x faster on the MNIST ResNet8): the
    same steps, the scores of the default memory format up to the order of the convolutions' sums."""
    from ttp_lightning.attacks import relearn

    _, test, forget = _clusters()
    torch.manual_seed(3)
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 2),
                        nn.Flatten(), nn.Linear(4, 3))
    assert relearn.channels_last_on_cpu(cnn, "cpu") and not relearn.channels_last_on_cpu(nn.Linear(2, 2), "cpu")
    fast = relearn.relearn_attack(cnn, test, forget, [1, 10, 30], 0.01, 8, 0, "cpu")
    monkeypatch.setattr(relearn, "channels_last_on_cpu", lambda net, device: False)
    plain = relearn.relearn_attack(cnn, test, forget, [1, 10, 30], 0.01, 8, 0, "cpu")
    assert fast.keys() == plain.keys() == {"1", "10", "30"}
    for step, scores in plain.items():
        for key, value in scores.items():
            assert abs(fast[step][key] - value) < 1e-4, (step, key)
    assert plain["30"]["forget_conf_dist"] != plain["1"]["forget_conf_dist"]  # it trained
