"""Robust Alg 1's rounds (adversarial.rounds, issue 61): when a cycle ends short of the goal the next one begins with
the schedule restarted and the bound term on every unproven image; when the goal is met the fit stops."""

import math
from types import SimpleNamespace

import pytest
import torch

from ttp_lightning.alg1.callbacks import LrWarmup, RadiusFromRetainRule, Rounds, goal_met
from ttp_lightning.alg1.module import stragglers
from ttp_lightning.alg1.schema import AdversarialSettings, EarlyStoppingSchema, ParetoSchema
from ttp_lightning.core.errors import TTPUserError


def test_goal_needs_the_radius_no_exposed_image_and_proofs_where_the_bound_is_on():
    assert not goal_met(None, bound_on=False)  # no epoch qualified
    assert goal_met((0.0, 0.0, 3.0, 0.2), bound_on=False)  # the bound term off: proofs are not asked for
    assert not goal_met((0.0, 0.0, 3.0, 0.2), bound_on=True)
    assert goal_met((0.0, 0.0, 0.0, 0.05), bound_on=True)
    assert not goal_met((1.0, 0.0, 0.0, 0.05), bound_on=True)  # trained below the radius judged
    assert not goal_met((0.0, 1.0, 0.0, 0.05), bound_on=True)
    assert not goal_met((0.0, math.nan, 0.0, 0.05), bound_on=False)  # NaN never meets it


def _trainer(epoch: int, lr: float = 1e-4, initial: float = 1e-2):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=initial)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=4)
    for _ in range(epoch):
        scheduler.step()
    optimizer.param_groups[0]["lr"] = lr
    return SimpleNamespace(current_epoch=epoch - 1, sanity_checking=False, should_stop=False, global_rank=0,
                           global_step=40, lr_scheduler_configs=[SimpleNamespace(scheduler=scheduler)])


def test_a_cycle_short_of_the_goal_restarts_the_schedule_and_lifts_the_straggler_cap():
    rank = (0.0, 2.0, 5.0, 0.3)
    warmup = LrWarmup(10)
    rounds, module = Rounds(4, 3, lambda: rank, bound_on=True, warmup=warmup), SimpleNamespace(round=1)
    trainer = _trainer(3)
    rounds.on_validation_end(trainer, module)  # not a cycle's end
    assert rounds.round == 1 and module.round == 1
    trainer = _trainer(4)
    rounds.on_validation_end(trainer, module)
    assert rounds.round == 2 and module.round == 2 and not trainer.should_stop
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    for t in (1, 2, 3):  # the epochs' own steps follow the cosine from its top again
        scheduler.step()
        assert scheduler.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * (1 + math.cos(math.pi * t / 4)) / 2)
    assert warmup.origin == 40 and rounds.restarts[0]["epoch"] == 4
    # a resumed fit is in the same round
    again = Rounds(4, 3, lambda: rank, bound_on=True)
    again.load_state_dict(rounds.state_dict())
    module_again = SimpleNamespace(round=1)
    again.on_train_start(SimpleNamespace(should_stop=False), module_again)
    assert module_again.round == 2


def _radius_at_bottom():
    rule = RadiusFromRetainRule(0.9, (1.0, 0.5, 0.0), retain_key="val/retain_holdout_acc")
    rule.rung = 2  # the rule fell back to the clean images during the round
    return rule


def _validate(rule, module, retain: float):
    rule.on_validation_end(SimpleNamespace(sanity_checking=False,
                                           callback_metrics={"val/retain_holdout_acc": torch.tensor(retain)}), module)


@pytest.mark.parametrize("rank", [None, (1.0, 0.0, 0.0, 0.05)])  # no epoch kept; kept one below the radius
def test_a_round_spent_below_the_radius_holds_the_full_radius_from_then_on(rank):
    rule, module = _radius_at_bottom(), SimpleNamespace(round=1, radius_scale=0.0)
    rounds = Rounds(8, 3, lambda: rank, bound_on=True, radius=rule)
    rounds.on_validation_end(_trainer(8), module)
    assert rule.held and "radius held" in rounds.restarts[0]["why"]
    assert module.radius_scale == 0.5  # a ramp over a quarter of the cycle (2 epochs): half of it first
    _validate(rule, module, retain=0.1)  # far below tau_r: a held radius does not step down
    assert rule.rung == 0 and module.radius_scale == 1.0
    _validate(rule, module, retain=0.1)
    assert module.radius_scale == 1.0
    resumed = RadiusFromRetainRule(0.9, (1.0, 0.5, 0.0))
    resumed.load_state_dict(rule.state_dict())
    again = SimpleNamespace(radius_scale=0.0)
    resumed.on_train_start(SimpleNamespace(), again)  # a resumed fit starts at the held radius
    assert resumed.held and again.radius_scale == 1.0
    resumed.load_state_dict({"rung": 2})  # a checkpoint written before the hold existed: not held
    assert not resumed.held


def test_a_round_kept_at_the_radius_leaves_the_rule_free():
    rule, module = _radius_at_bottom(), SimpleNamespace(round=1, radius_scale=0.0)
    rounds = Rounds(8, 3, lambda: (0.0, 2.0, 5.0, 0.3), bound_on=True, radius=rule)
    rounds.on_validation_end(_trainer(8), module)
    assert rounds.round == 2 and not rule.held and "radius held" not in rounds.restarts[0]["why"]
    _validate(rule, module, retain=0.1)
    assert rule.rung == 2  # still the rule's to move


def test_the_goal_met_at_a_cycles_end_stops_the_fit_and_a_resume_stays_stopped():
    rounds = Rounds(4, 3, lambda: (0.0, 0.0, 0.0, 0.05), bound_on=True)
    trainer = _trainer(4)
    rounds.on_validation_end(trainer, SimpleNamespace(round=1))
    assert trainer.should_stop and rounds.round == 1
    resumed = Rounds(4, 3, lambda: None, bound_on=True)
    resumed.load_state_dict(rounds.state_dict())
    fresh = SimpleNamespace(should_stop=False)
    resumed.on_train_start(fresh, SimpleNamespace(round=1))
    assert fresh.should_stop


def test_the_last_round_ends_the_fit_without_another():
    rounds = Rounds(4, 2, lambda: (0.0, 3.0, 3.0, 0.5), bound_on=True)
    trainer = _trainer(8)
    trainer.current_epoch = 7
    rounds.on_validation_end(trainer, SimpleNamespace(round=2))
    assert rounds.round == 1 and not rounds.restarts  # the fit's own end (max_epochs) comes next


@pytest.mark.parametrize("rank", [None, (1.0, 0.0, 0.0, 0.05), (0.0, 4.0, 9.0, 0.4)])
def test_a_round_that_keeps_nothing_new_ends_the_fit_and_a_resume_stays_ended(rank):
    rounds, module = Rounds(4, 3, lambda: rank, bound_on=True), SimpleNamespace(round=1)
    rounds.on_validation_end(_trainer(4), module)  # round 1 ends short of the goal: round 2
    assert rounds.round == 2 and rounds.ended is None
    trainer = _trainer(8)
    rounds.on_validation_end(trainer, module)  # round 2 kept no better epoch than round 1: no round 3
    assert trainer.should_stop and rounds.round == 2 and "kept no epoch better" in rounds.ended
    resumed = Rounds(4, 3, lambda: rank, bound_on=True)
    resumed.load_state_dict(rounds.state_dict())
    fresh = SimpleNamespace(should_stop=False)
    resumed.on_train_start(fresh, SimpleNamespace(round=1))
    assert fresh.should_stop and resumed.ended == rounds.ended


def test_a_round_that_improves_the_kept_epoch_goes_on():
    ranks = iter([(0.0, 4.0, 9.0, 0.4), (0.0, 2.0, 9.0, 0.4)])
    current = {}
    rounds, module = Rounds(4, 3, lambda: current["rank"], bound_on=True), SimpleNamespace(round=1)
    for epoch in (4, 8):
        current["rank"] = next(ranks)
        trainer = _trainer(epoch)
        rounds.on_validation_end(trainer, module)
        assert not trainer.should_stop
    assert rounds.round == 3 and rounds.ended is None


def test_later_rounds_cover_every_unproven_image():
    unproven = torch.tensor([True] * 6 + [False] * 14)
    assert len(stragglers(unproven)) == 0  # more than a tenth: the first round leaves them to the attack term
    assert stragglers(unproven, every=True).tolist() == list(range(6))
    # once covered, an image stays covered in later rounds (a proven image no longer pulled back out of the
    # provable region by dropping its term: the alternate-epoch flip of docs/robust-budget.md)
    covered = torch.tensor([2, 9, 15])
    assert stragglers(unproven, every=True, covered=covered).tolist() == [0, 1, 2, 3, 4, 5, 9, 15]
    assert stragglers(torch.zeros(20, dtype=torch.bool), every=True, covered=covered).tolist() == [2, 9, 15]
    assert len(stragglers(unproven, covered=covered)) == 0  # the first round: the cap, nothing kept on
    assert stragglers(unproven, every=True, covered=torch.empty(0, dtype=torch.long)).tolist() == list(range(6))


def test_later_rounds_take_their_weight_decay_and_the_first_keeps_the_methods():
    """adversarial.later_weight_decay: set on every parameter group when round 2 begins (the optimizer's state,
    which a checkpoint saves, carries it on); 0 leaves the method's own."""
    rank = (0.0, 2.0, 5.0, 0.3)
    for decay, expected in ((1e-4, 1e-4), (0.0, 0.5)):
        trainer = _trainer(4)
        optimizer = trainer.lr_scheduler_configs[0].scheduler.optimizer
        optimizer.param_groups[0]["weight_decay"] = 0.5
        trainer.optimizers = [optimizer]
        rounds = Rounds(4, 3, lambda: rank, bound_on=True, weight_decay=decay)
        rounds.on_validation_end(_trainer_like(trainer, 3), SimpleNamespace(round=1))  # not a cycle's end
        assert optimizer.param_groups[0]["weight_decay"] == 0.5
        rounds.on_validation_end(trainer, SimpleNamespace(round=1))
        assert rounds.round == 2 and optimizer.param_groups[0]["weight_decay"] == expected
    with pytest.raises(TTPUserError, match="later_weight_decay=-0.1 is not allowed"):
        AdversarialSettings(later_weight_decay=-0.1)
    with pytest.raises(TTPUserError, match="later_weight_decay=nan"):
        AdversarialSettings(later_weight_decay=math.nan)


def test_later_rounds_start_their_cycle_at_a_decayed_top_rate():
    """adversarial.later_lr_scale: round k's cosine starts at lr x scale^(k-1) and anneals from there; 1 keeps
    every round at the method's rate; the first round is never scaled."""
    ranks = [(0.0, 2.0, 5.0, 0.3)]
    for scale in (0.1, 1.0):
        ranks[0] = (0.0, 2.0, 5.0, 0.3)
        rounds, module = Rounds(4, 3, lambda: ranks[0], bound_on=True, lr_scale=scale), SimpleNamespace(round=1)
        trainer = _trainer(4)
        scheduler = trainer.lr_scheduler_configs[0].scheduler
        rounds.on_validation_end(trainer, module)
        assert rounds.round == 2 and scheduler.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * scale)
        for t in (1, 2, 3):
            scheduler.step()
            expected = 1e-2 * scale * (1 + math.cos(math.pi * t / 4)) / 2
            assert scheduler.optimizer.param_groups[0]["lr"] == pytest.approx(expected)
        scheduler.step()
        ranks[0] = (0.0, 1.0, 5.0, 0.3)  # a better kept epoch: round 3 begins
        rounds.on_validation_end(_trainer_like(trainer, 8), module)
        assert rounds.round == 3 and scheduler.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * scale ** 2)
    for bad in (0.0, -0.5, 1.5, math.nan):
        with pytest.raises(TTPUserError, match="later_lr_scale="):
            AdversarialSettings(later_lr_scale=bad)


def _trainer_like(trainer, epoch: int):
    return SimpleNamespace(**{**vars(trainer), "current_epoch": epoch - 1})


def test_a_round_visits_each_forget_image_at_most_visits_per_round_times():
    from ttp_lightning.alg1.method import round_epochs

    settings = AdversarialSettings(visits_per_round=2000)
    assert round_epochs(100, settings, 437, 10, 100) == 46  # MNIST: 43.7 visits an epoch
    assert round_epochs(100, settings, 9, 10, 20) == 100  # a small retain set: 4.5 visits an epoch, `epochs`
    assert round_epochs(100, settings, 100_000, 10, 100) == 1  # never below one epoch
    assert round_epochs(100, AdversarialSettings(visits_per_round=None), 437, 10, 100) == 100
    assert round_epochs(100, None, 437, 10, 100) == 100  # plain Alg 1
    with pytest.raises(TTPUserError, match="method.adversarial.visits_per_round=0 is not allowed"):
        AdversarialSettings(visits_per_round=0)


def test_rounds_are_checked():
    with pytest.raises(TTPUserError, match="method.adversarial.rounds=0"):
        AdversarialSettings(rounds=0)
    with pytest.raises(TTPUserError, match="rounds=2 is not allowed"):
        ParetoSchema(lr=0.01, weight_decay=0.0, momentum=0.9, name="pareto_robust", adversarial={"rounds": 2},
                     early_stopping=EarlyStoppingSchema(select="robust_conf_dist"))
