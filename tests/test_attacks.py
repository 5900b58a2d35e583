"""Test-time-privacy attacks: each stays in its budget in [0, 1] pixel space and raises the confidence; the
default evaluation is not fooled by dead ReLUs, is monotone in gamma, handles randomised models, and is at
least as strong as a maintained library's PGD with the same loss."""

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from conftest import CONF_DIR
from test_modules import tiny_sets
from ttp_lightning.attacks import (
    APGD,
    FGSM,
    OBJECTIVES,
    PGD,
    WORST,
    GaussianNoise,
    Probe,
    adaptive_attack,
    apgd_checkpoints,
    evaluate_attacks,
    fgsm_attack,
    gaussian_attack,
    pgd_attack,
    smooth_relu_gradients,
    zero_gradient_mask,
)
from ttp_lightning.attacks.apgd import apgd
from ttp_lightning.core.batching import ImageBatchDataset

DEFAULTS = OmegaConf.load(CONF_DIR / "attacks" / "adaptive.yaml")
PAPER = OmegaConf.merge(DEFAULTS, {"relu_gradient_beta": None, "gammas": [2, 8]})
PAPER_SUITE = {"gaussian": GaussianNoise(), "fgsm": FGSM(), "pgd": PGD()}  # conf/attacks/paper.yaml's suite
ADAPTIVE_SUITE = {"gaussian": GaussianNoise(), "apgd": APGD()}  # conf/attacks/adaptive.yaml's
FAST = OmegaConf.merge(DEFAULTS, {"apgd_steps": 30, "restarts": 2, "gammas": [2, 8]})


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.Tanh(), nn.Linear(12, 3)).eval()


def confidence(net, images):
    with torch.no_grad():
        return torch.logsumexp(net(images), dim=1)


def images_4x4(n=30, seed=1):
    return torch.rand(n, 1, 4, 4, generator=torch.Generator().manual_seed(seed))


def max_softmax(net, images):
    with torch.no_grad():
        return net(images).softmax(dim=1).max(dim=1).values


@pytest.mark.parametrize(("attack", "measure"), [(fgsm_attack, confidence), (pgd_attack, confidence),
                                                 (adaptive_attack, max_softmax)])
def test_gradient_attacks_stay_in_the_ball_and_raise_what_they_maximise(attack, measure):
    net, gamma, images = model(), 8 / 255, images_4x4()
    attacked = attack(net, images, gamma, torch.Generator().manual_seed(0), FAST, targets=torch.zeros(30).long())
    assert (attacked - images).abs().max() <= gamma + 1e-6
    assert attacked.min() >= 0 and attacked.max() <= 1
    assert (measure(net, attacked) > measure(net, images)).float().mean() > 0.9


def test_pgd_is_at_least_as_strong_as_fgsm_and_gaussian_is_seeded():
    net, gamma, images = model(), 8 / 255, images_4x4()
    pgd = pgd_attack(net, images, gamma, torch.Generator().manual_seed(0), PAPER)
    fgsm = fgsm_attack(net, images, gamma, torch.Generator().manual_seed(0), PAPER)
    assert confidence(net, pgd).mean() >= confidence(net, fgsm).mean() - 1e-4
    first = gaussian_attack(net, images, gamma, torch.Generator().manual_seed(3), PAPER)
    again = gaussian_attack(net, images, gamma, torch.Generator().manual_seed(3), PAPER)
    assert torch.equal(first, again) and not torch.equal(first, images)
    assert 0.5 * gamma < (first - images).std() < 1.5 * gamma


def test_apgd_checkpoints_follow_croce_and_hein():
    assert apgd_checkpoints(100) == [22, 41, 57, 70, 80, 87, 93, 99]
    assert apgd_checkpoints(1) == [1]


def test_evaluation_reports_every_attack_gamma_and_the_clean_scores():
    _, forget = tiny_sets(n_forget=9)
    net = model()
    scores = evaluate_attacks(net, forget, OmegaConf.merge(PAPER, {"chunk_size": 4}), PAPER_SUITE)["scores"]
    assert set(scores) == {"none", "gaussian", "fgsm", "pgd", WORST} and set(scores["pgd"]) == {"2", "8"}
    assert all(0 <= s["forget_acc"] <= 1 for per_gamma in scores.values() for s in per_gamma.values())
    images, labels = forget.everything()
    with torch.no_grad():
        probs = net(images).softmax(dim=1)
    expected = (probs.max(dim=1).values - 1 / 3).clamp(min=0).mean().item()
    assert scores["none"]["0"]["forget_conf_dist"] == pytest.approx(expected, abs=1e-5)
    assert scores["none"]["0"]["forget_acc"] == pytest.approx((probs.argmax(1) == labels).float().mean().item())
    for gamma in ("2", "8"):  # the worst case per image is at least every attack's mean
        assert scores[WORST][gamma]["forget_conf_dist"] >= max(scores[a][gamma]["forget_conf_dist"]
                                                               for a in ("gaussian", "fgsm", "pgd")) - 1e-6


def dead_relu_model():
    """Every hidden unit sits just below zero on the all-0.5 image: the exact input gradient vanishes there,
    yet within 8/255 each unit can switch on (||w_j||_1 = 16 * 0.5 = 8, so a signed step moves it by 0.25)."""
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 4), nn.ReLU(), nn.Linear(4, 3))
    with torch.no_grad():
        net[1].weight.fill_(0.5)
        net[1].bias.fill_(-0.5 * 16 * 0.5 - 0.05)  # pre-activation -0.05 at x = 0.5
        net[3].weight.copy_(torch.tensor([[20.0, 20, 20, 20], [0, 0, 0, 0], [0, 0, 0, 0]]))
        net[3].bias.zero_()
    return net.eval()


def dead_relu_forget():
    return ImageBatchDataset(torch.full((4, 1, 4, 4), 0.5), torch.tensor([0, 1, 2, 0]))


def test_masking_detector_sees_every_relu_off_and_the_default_attack_gets_through():
    net, forget = dead_relu_model(), dead_relu_forget()
    images, labels = forget.everything()
    assert zero_gradient_mask(net, images, labels, None).all()  # every exact gradient is zero
    assert not zero_gradient_mask(net, images, labels, 10.0).any()
    paper = evaluate_attacks(net, forget, PAPER, PAPER_SUITE)
    assert paper["checks"]["zero_gradient_share"] == 1.0
    assert paper["scores"]["none"]["0"]["forget_conf_dist"] == pytest.approx(0.0, abs=1e-6)  # uniform
    assert paper["scores"]["pgd"]["8"]["forget_conf_dist"] == pytest.approx(0.0, abs=1e-6)  # fooled: no move
    adaptive = evaluate_attacks(net, forget, FAST, ADAPTIVE_SUITE)
    assert adaptive["checks"]["zero_gradient_share"] == 1.0 and adaptive["checks"]["zero_gradient_share_surrogate"] == 0
    assert adaptive["scores"]["none"] == paper["scores"]["none"]  # the forward pass is the real model's
    assert adaptive["scores"]["apgd"]["8"]["forget_conf_dist"] > 0.6
    assert all(isinstance(m, nn.ReLU) for m in net if not isinstance(m, (nn.Flatten, nn.Linear)))


def test_surrogate_covers_functional_relu_and_leaves_outputs_exact():
    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = dead_relu_model()

        def forward(self, x):
            hidden = torch.nn.functional.relu(self.inner[1](self.inner[0](x)), inplace=True)
            return self.inner[3](hidden)

    net, x = Functional(), torch.full((2, 1, 4, 4), 0.5, requires_grad=True)
    with smooth_relu_gradients(10.0):
        out = net(x)
        (grad,) = torch.autograd.grad(out[:, 0].sum(), x)
    assert torch.equal(out, net(x)) and grad.abs().min() > 0


def test_worst_case_never_drops_with_gamma_and_unbounded_restores_confidence():
    _, forget = tiny_sets(n_forget=12)
    net = model()
    result = evaluate_attacks(net, forget, OmegaConf.merge(FAST, {"gammas": [1, 2, 5, 8, 16]}), ADAPTIVE_SUITE,
                              reference_conf_dist=0.05)
    worst = [result["scores"][WORST][g]["forget_conf_dist"] for g in ("1", "2", "5", "8", "16")]
    assert worst == sorted(worst) and worst[-1] > worst[0]
    checks = result["checks"]
    assert checks["monotone_in_gamma"] is True and checks["randomised"] is False
    assert checks["unbounded"]["restored"] is True and checks["unbounded"]["forget_conf_dist"] >= worst[-1] - 1e-6


def test_unbounded_check_says_when_the_table_is_only_a_lower_bound():
    net, forget = dead_relu_model(), dead_relu_forget()
    checks = evaluate_attacks(net, forget, PAPER, PAPER_SUITE, reference_conf_dist=0.9)["checks"]  # pgd: 50 steps of 1e-3
    assert checks["unbounded"]["restored"] is False and "lower bound" in checks["unbounded"]["note"]


class RandomisedDefence(nn.Module):
    """Adds fresh input noise on every call: outputs differ between two passes on the same image."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x + 0.05 * torch.randn_like(x))


def test_randomised_models_are_detected_and_attacked_with_eot():
    _, forget = tiny_sets(n_forget=8)
    torch.manual_seed(0)
    result = evaluate_attacks(RandomisedDefence(model()), forget, FAST, ADAPTIVE_SUITE)
    assert result["checks"]["randomised"] is True and result["checks"]["eot_samples"] == DEFAULTS.eot_samples
    assert result["scores"]["apgd"]["8"]["forget_conf_dist"] > result["scores"]["none"]["0"]["forget_conf_dist"]


def test_objectives_are_per_image_and_the_pretrained_label_objective_is_its_log_probability():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    targets = torch.tensor([1, 2])
    log_p = logits.log_softmax(-1)
    assert torch.allclose(OBJECTIVES["ce_pretrained"](logits, targets), log_p[[0, 1], [1, 2]])
    assert torch.allclose(OBJECTIVES["max_softmax"](logits, targets), log_p.max(-1).values)
    assert torch.allclose(OBJECTIVES["logsumexp"](logits, targets), logits.logsumexp(-1))


def test_our_attack_is_at_least_as_strong_as_torchattacks_pgd_with_the_same_loss():
    """At equal budget (eps 8/255, 20 steps, one start) and the same loss (cross-entropy towards a target
    label, torchattacks' targeted mode), APGD on ce_pretrained ends at least as close to the target."""
    torchattacks = pytest.importorskip("torchattacks")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3)).eval()
    images, targets = images_4x4(64, seed=5), torch.randint(0, 3, (64,), generator=torch.Generator().manual_seed(6))
    attack = torchattacks.PGD(net, eps=8 / 255, alpha=2 / 255, steps=20, random_start=False)
    attack.set_mode_targeted_by_label(quiet=True)
    theirs = attack(images, targets)
    ours = apgd(Probe(net, ["ce_pretrained"]), images, targets, torch.zeros(64, dtype=torch.long), 8 / 255,
                steps=20, start=images).best_objective
    assert (ours - images).abs().max() <= 8 / 255 + 1e-6 and (theirs - images).abs().max() <= 8 / 255 + 1e-6

    def target_log_prob(x):
        with torch.no_grad():
            return OBJECTIVES["ce_pretrained"](net(x), targets)

    assert target_log_prob(theirs).mean() > target_log_prob(images).mean()  # the library attack works
    assert target_log_prob(ours).mean() >= target_log_prob(theirs).mean() - 1e-4


def test_the_targeted_objective_runs_once_per_top_class_and_finds_what_each_class_finds(monkeypatch):
    """`targeted` adds one APGD run per class (each image's highest-scoring at the image, every class here: 3 <=
    TARGETED_CLASSES), targeting that class's log-probability; per image the result is at least as confident as
    every single-class run of the same steps from the same starts would find by itself."""
    from ttp_lightning.attacks import apgd as apgd_module

    net, images = model(), images_4x4(n=6)
    calls = []
    real = apgd_module.apgd

    def spy(probe, rows, targets, objective_ids, gamma, steps, start):
        calls.append((list(probe.objectives), targets.clone(), objective_ids.clone()))
        return real(probe, rows, targets, objective_ids, gamma, steps, start)

    monkeypatch.setattr(apgd_module, "apgd", spy)
    cfg = OmegaConf.merge(FAST, {"objectives": ["max_softmax", "targeted"], "restarts": 2, "surrogate_betas": [None]})
    found = adaptive_attack(net, images, 8 / 255, torch.Generator().manual_seed(0), cfg,
                            targets=torch.zeros(6, dtype=torch.long))
    (names, targets, ids), = calls
    assert names == ["max_softmax", "targeted"] and len(targets) == 6 * (2 + 3)  # 2 restarts + 3 classes
    with torch.no_grad():
        order = net(images).argsort(-1, descending=True)
    assert torch.equal(targets[12:].view(3, 6), order.T) and (ids[12:] == 1).all() and (ids[:12] == 0).all()
    assert (found - images).abs().max() <= 8 / 255 + 1e-6
    assert (max_softmax(net, found) >= max_softmax(net, images) - 1e-6).all()
    untargeted = adaptive_attack(net, images, 8 / 255, torch.Generator().manual_seed(0),
                                 OmegaConf.merge(cfg, {"objectives": ["max_softmax"]}),
                                 targets=torch.zeros(6, dtype=torch.long))
    assert (max_softmax(net, found) >= max_softmax(net, untargeted) - 1e-6).all()  # the same starts, plus targets


def test_the_probe_takes_the_rows_a_slice_at_a_time_and_returns_what_one_pass_returns(monkeypatch):
    """APGD's probe runs the model on at most ROWS_PER_PASS rows a pass (a CPU is faster on small passes); each
    row's objective, input gradient and confidence are those of one pass over every row, in order, for a batch
    that is not a multiple of the slice, and an empty batch gives empty results."""
    from ttp_lightning.attacks import apgd as apgd_module

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                        nn.Linear(64, 3)).eval()
    rows = torch.rand(11, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    ids, targets = torch.arange(11) % 2, torch.arange(11) % 3
    passes = []
    net.register_forward_hook(lambda module, args, out: passes.append(len(args[0])))
    probe = Probe(net, ["max_softmax", "ce_pretrained"])
    whole = probe(rows, ids, targets)
    assert passes == [11]
    passes.clear()
    monkeypatch.setattr(apgd_module, "ROWS_PER_PASS", 4)
    monkeypatch.setattr(apgd_module, "VALUES_PER_PASS", 4 * 16)
    sliced = probe(rows, ids, targets)
    assert passes == [4, 4, 3]
    for one, other in zip(whole, sliced, strict=True):
        assert one.shape == other.shape and torch.allclose(one, other, atol=1e-6)
    assert float(whole[1].abs().sum()) > 0  # a real gradient, compared row by row
    assert all(len(values) == 0 for values in probe(rows[:0], ids[:0], targets[:0]))
    monkeypatch.setattr(apgd_module, "VALUES_PER_PASS", 8 * 16)  # a pass holds 8 such images' values
    passes.clear()
    probe(rows, ids, targets)
    assert passes == [8, 3]


def test_a_pass_holds_as_many_input_values_as_128_mnist_images_and_never_fewer_than_128_rows():
    from ttp_lightning.attacks.apgd import rows_per_pass

    assert rows_per_pass(torch.zeros(2, 1, 28, 28)) == 128
    assert rows_per_pass(torch.zeros(2, 64)) == 128 * 784 // 64  # scikit-learn's digits: 1,568 rows a pass
    assert rows_per_pass(torch.zeros(2, 3, 224, 224)) == 128
    assert rows_per_pass(torch.zeros(0, 64)) >= 128


class OneSaturated(nn.Module):
    """Logits 100 x a fixed direction on images whose first pixel is above 0.5 (max softmax 1 in float32, within
    any ball of radius < 0.5 around them), a small linear map elsewhere."""

    def __init__(self):
        super().__init__()
        self.inner = model()

    def forward(self, x):
        flat = x.flatten(1)
        sure = torch.tensor([100.0, 0.0, 0.0]).expand(len(x), 3)
        return torch.where((flat[:, :1] > 0.5), sure, self.inner(x))


def test_apgd_stops_once_every_row_is_saturated():
    """No step can raise a confidence already within SATURATED of 1: APGD ends after the start's one probe."""
    from ttp_lightning.attacks.base import SATURATED

    images = torch.full((5, 1, 4, 4), 0.9)
    calls = []
    probe = Probe(OneSaturated().eval(), ["max_softmax"])

    def counted(x, ids, targets):
        calls.append(len(x))
        return Probe.__call__(probe, x, ids, targets)

    found = apgd(counted, images, torch.zeros(5, dtype=torch.long), torch.zeros(5, dtype=torch.long), 8 / 255, 50,
                 images)
    assert calls == [5] and (found.confidence >= 1 - SATURATED).all() and torch.equal(found.most_confident, images)
    calls.clear()
    apgd(counted, images * 0.1, torch.zeros(5, dtype=torch.long), torch.zeros(5, dtype=torch.long), 8 / 255, 50,
         images * 0.1)
    assert len(calls) == 51  # not saturated: every step


def test_the_suite_does_not_attack_a_saturated_image_again_and_scores_it_as_before(monkeypatch):
    """A saturated image (a confident pretrained model's, mostly) is left out of APGD's batch: its score is the
    confidence it already has, and the other images are attacked as without it."""
    images = torch.rand(6, 1, 4, 4, generator=torch.Generator().manual_seed(3)) * 0.5
    images[[1, 4], 0, 0, 0] = 0.9  # saturated at the image, and anywhere in the balls attacked here
    forget, net = ImageBatchDataset(images, torch.tensor([0, 1, 2, 0, 1, 2])), OneSaturated().eval()
    seen = []
    original = APGD.__call__

    def spy(self, model, x, *args, **kwargs):
        seen.append(len(x))
        return original(self, model, x, *args, **kwargs)

    monkeypatch.setattr(APGD, "__call__", spy)
    cfg = OmegaConf.merge(FAST, {"gammas": [2, 8], "apgd_steps": 5})
    apgd_only = {"apgd": APGD()}  # Gaussian noise draws per image, whether saturated or not
    result = evaluate_attacks(net, forget, cfg, apgd_only)
    assert seen == [4, 4, 4]  # gamma 2, gamma 8 and the unbounded check: the 4 open images only
    worst = result["worst_per_image"]["8"]
    assert worst[1] == worst[4] == pytest.approx(1 - 1 / 3) and max(worst[i] for i in (0, 2, 3, 5)) < 1 - 1 / 3
    alone = evaluate_attacks(net, ImageBatchDataset(images[[0, 2, 3, 5]], torch.tensor([0, 2, 0, 2])), cfg,
                             apgd_only)["worst_per_image"]["8"]
    assert alone == pytest.approx([worst[i] for i in (0, 2, 3, 5)])
    seen.clear()
    evaluate_attacks(net, forget, OmegaConf.merge(cfg, {"objectives": ["targeted"]}), apgd_only)
    assert seen == [6, 6, 6]  # targeted runs start at random points, not at the warm start: every image
