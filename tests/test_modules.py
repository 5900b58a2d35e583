import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from ttp_lightning.alg1.callbacks import ConstrainedBestModel
from ttp_lightning.alg1.module import ParetoFinetuneModule
from ttp_lightning.core.batching import ImageBatchDataset
from ttp_lightning.core.objectives import kl_to_uniform, retain_loss
from ttp_lightning.models.optim import project_to_norm_ball

OPTIM = {"optimizer": {"_target_": "torch.optim.Adam", "_partial_": True, "lr": 0.01}, "schedule": None}


def tiny_sets(n_retain=37, n_forget=6):
    g = torch.Generator().manual_seed(0)
    retain = ImageBatchDataset(torch.randint(0, 256, (n_retain, 1, 4, 4), dtype=torch.uint8, generator=g),
                               torch.randint(0, 3, (n_retain,), generator=g))
    forget = ImageBatchDataset(torch.randint(0, 256, (n_forget, 1, 4, 4), dtype=torch.uint8, generator=g),
                               torch.randint(0, 3, (n_forget,), generator=g))
    return retain, forget


def tiny_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))


def test_project_to_norm_ball_global_and_per_tensor():
    net = tiny_net()
    project_to_norm_ball(net, 0.5, "global")
    assert torch.sqrt(sum(p.pow(2).sum() for p in net.parameters())) <= 0.5 + 1e-6
    net = tiny_net()
    project_to_norm_ball(net, 0.1, "per_tensor")
    assert all(p.norm() <= 0.1 + 1e-6 for p in net.parameters())


def test_fullbatch_mean_gradient_equals_whole_set_gradient_for_any_chunk_size():
    retain, forget = tiny_sets()
    module = ParetoFinetuneModule(tiny_net(), 0.75, OPTIM, mode="fullbatch", chunk_size=5,
                                  retain_data=retain, forget_data=forget)
    chunked, loss = module._mean_gradient(retain, module._retain_loss)
    images, labels = retain.everything()
    whole = retain_loss(module.net(images), labels)
    expected = torch.autograd.grad(whole, list(module.net.parameters()))
    assert torch.allclose(loss.float(), whole.detach(), atol=1e-6)
    for a, b in zip(chunked, expected):
        assert torch.allclose(a, b, atol=1e-6)
    forget_grads, _ = module._mean_gradient(forget, module._forget_loss)
    images, _ = forget.everything()
    expected = torch.autograd.grad(kl_to_uniform(module.net(images)), list(module.net.parameters()))
    for a, b in zip(forget_grads, expected):
        assert torch.allclose(a, b, atol=1e-6)


def fake_trainer(epoch, conf_dist, retain_acc):
    metrics = {"val/forget_conf_dist": torch.tensor(conf_dist), "val/retain_acc": torch.tensor(retain_acc)}
    return SimpleNamespace(sanity_checking=False, callback_metrics=metrics, current_epoch=epoch, should_stop=False)


def test_constrained_best_model_keeps_lowest_qualifying_and_restores_it():
    net = nn.Linear(1, 1)
    module = SimpleNamespace(state_dict=net.state_dict, load_state_dict=net.load_state_dict)
    callback = ConstrainedBestModel(conf_dist_below=0.5, retain_acc_at_least=0.9)
    trajectory = [(0.6, 0.95), (0.4, 0.95), (0.1, 0.80), (0.3, 0.92), (0.35, 0.99)]  # epochs 1..5
    for epoch, (cd, acc) in enumerate(trajectory):
        with torch.no_grad():
            net.weight.fill_(float(epoch + 1))
        callback.on_validation_end(fake_trainer(epoch, cd, acc), module)
    assert {k: callback.summary()[k] for k in ("best_epoch", "constraint_met")} == {"best_epoch": 4, "constraint_met": True}
    callback.on_fit_end(None, module)
    assert net.weight.item() == 4.0  # epoch 4's weights, not epoch 3's lower but unqualified CD


def test_constrained_best_model_without_qualifying_epoch_keeps_last():
    callback = ConstrainedBestModel(conf_dist_below=0.1, retain_acc_at_least=0.9)
    module = SimpleNamespace(state_dict=dict, load_state_dict=pytest.fail)
    for epoch in range(3):
        callback.on_validation_end(fake_trainer(epoch, 0.5, 0.95), module)
    callback.on_fit_end(None, module)
    assert callback.summary() == {"best_epoch": 3, "constraint_met": False,
                                  "selection_rule": "no epoch met the thresholds: the last epoch"}


def test_patience_stops_after_stale_epochs():
    callback = ConstrainedBestModel(conf_dist_below=1.0, patience=2)
    module = SimpleNamespace(state_dict=dict, load_state_dict=lambda s: None)
    trainers = [fake_trainer(e, cd, 1.0) for e, cd in enumerate([0.5, 0.6, 0.7])]
    for trainer in trainers:
        callback.on_validation_end(trainer, module)
    assert [t.should_stop for t in trainers] == [False, False, True]


def test_without_a_qualifying_epoch_the_pareto_fallback_keeps_a_pareto_optimal_epoch():
    net = nn.Linear(1, 1)
    module = SimpleNamespace(state_dict=net.state_dict, load_state_dict=net.load_state_dict)
    callback = ConstrainedBestModel(conf_dist_below=0.05, retain_acc_at_least=0.98, fallback="pareto")
    trajectory = [(0.30, 0.90), (0.10, 0.89), (0.08, 0.80), (0.07, 0.74)]  # CD falls, accuracy collapses
    for epoch, (cd, acc) in enumerate(trajectory):
        with torch.no_grad():
            net.weight.fill_(float(epoch + 1))
        callback.on_validation_end(fake_trainer(epoch, cd, acc), module)
    callback.on_fit_end(None, module)
    summary = callback.summary()
    assert summary["best_epoch"] == 2 and summary["constraint_met"] is False and "fallback" in summary["selection_rule"]
    assert net.weight.item() == 2.0  # 0.89 - 0.10 is the best trade-off; the last epoch (0.74) is not kept


def test_select_proven_prefers_fewest_exposed_then_fewest_unproven_then_the_strongest_proof():
    """Robust Alg 1's rank (select=proven): the attack's count first (the gate's), then the interval bound's
    unproven count, then the proven worst CD where every image is proven (else the attacked mean); a NaN bound is
    not a proof, and a checkpoint written when ranks were one number still resumes."""
    from ttp_lightning.alg1.method import PROVEN_RULE, proven_rank

    def trainer(epoch, exposed, unproven, proven_worst, attacked_mean):
        metrics = {"val/forget_worst_conf_dist": 0.01, "val/retain_acc": 0.99, "val/forget_robust_exposed": exposed,
                   "val/forget_unproven": unproven, "val/forget_proven_worst_conf_dist": proven_worst,
                   "val/forget_robust_conf_dist": attacked_mean}
        return SimpleNamespace(sanity_checking=False, callback_metrics={k: torch.tensor(v) for k, v in metrics.items()},
                               current_epoch=epoch, should_stop=False)

    net = nn.Linear(1, 1)
    module = SimpleNamespace(state_dict=net.state_dict, load_state_dict=net.load_state_dict)
    callback = ConstrainedBestModel(conf_dist_below=0.1, conf_dist_key="val/forget_worst_conf_dist",
                                    rank=proven_rank, rank_rule=PROVEN_RULE)
    epochs = [(2, 0, 0.02, 0.001),    # 1: two images exposed under attack, although all proven
              (0, 3, 0.9, 0.0001),    # 2: none exposed, three unproven: the lowest attacked mean so far
              (0, 1, 0.9, 0.01),      # 3: one unproven beats three, whatever the attacked mean
              (0, 0, 0.08, 0.02),     # 4: all proven
              (0, 0, 0.04, 0.03),     # 5: all proven, by a stronger proof: kept
              (0, 0, 0.06, 0.0)]      # 6: a weaker proof, though the attack does better
    for epoch, values in enumerate(epochs):
        with torch.no_grad():
            net.weight.fill_(float(epoch + 1))
        callback.on_validation_end(trainer(epoch, *values), module)
    callback.on_fit_end(None, module)
    assert callback.summary()["best_epoch"] == 5 and net.weight.item() == 5.0
    assert callback.summary()["selection_rule"].startswith(PROVEN_RULE)
    assert proven_rank({"val/forget_robust_exposed": 0.0, "val/forget_robust_conf_dist": 0.5,
                           "val/forget_proven_worst_conf_dist": 0.01})[2] == math.inf  # not counted: unproven
    # an epoch the radius rule trained below the radius judged fails the gate: any epoch at the radius ranks first
    at_radius = {"val/forget_robust_exposed": 5.0, "val/forget_robust_conf_dist": 0.5,
                 "val/forget_proven_worst_conf_dist": 0.9}
    assert proven_rank(at_radius) < proven_rank({**at_radius, "val/below_radius": 1.0,
                                                       "val/forget_robust_exposed": 0.0})
    old = ConstrainedBestModel(rank=proven_rank)
    old.load_state_dict({**callback.state_dict(), "best_rank": 0.25})
    assert old.best_rank == [0.25]


def test_optimizers_and_schedules_are_partial_configs_composed_by_hydra(compose_cfg):
    """`pretrain.optimizer=sgd pretrain.schedule=cosine` select conf/optimizer/sgd.yaml and
    conf/schedule/cosine.yaml, whose lr / momentum / weight decay come from the section; T_max is the fit's epochs."""
    from ttp_lightning.models.optim import configure_optimizer, optimizer_settings

    cfg = compose_cfg("pretrain.optimizer=sgd", "pretrain.schedule=cosine", "pretrain.lr=0.05",
                      "pretrain.momentum=0.8", "method.optimizer=adamw", "method.schedule=none")
    pretrain, method = optimizer_settings(cfg.pretrain), optimizer_settings(cfg.method)
    built = configure_optimizer(tiny_net().parameters(), 7, **pretrain)
    optimizer, scheduler = built["optimizer"], built["lr_scheduler"]["scheduler"]
    assert isinstance(optimizer, torch.optim.SGD) and built["lr_scheduler"]["interval"] == "epoch"
    assert optimizer.defaults["lr"] == 0.05 and optimizer.defaults["momentum"] == 0.8
    assert isinstance(scheduler, torch.optim.lr_scheduler.CosineAnnealingLR) and scheduler.T_max == 7
    plain = configure_optimizer(tiny_net().parameters(), 7, **method)
    assert isinstance(plain, torch.optim.AdamW) and method["schedule"] is None
    assert isinstance(configure_optimizer(tiny_net().parameters(), 3, **optimizer_settings(compose_cfg().pretrain)),
                      torch.optim.Adam)  # the default
