"""A budget the rule selects by on one half of the held-out images and that is confirmed on the other (issue 79):
the halves, the confirmation that never chooses the kept epoch, the gate that refuses an unconfirmed budget,
and the frontier and card that state the confirmed cost."""

import copy
import math

import pytest
import torch
from omegaconf import open_dict

from ttp_lightning.alg1 import method as method_code
from ttp_lightning.alg1.method import CONFIRM_PART, holdout_fraction, split_for_confirmation
from ttp_lightning.assess.frontier import format_frontier, frontier, trained_radii
from ttp_lightning.assess.protection import GateSettings, judge
from ttp_lightning.core.batching import ImageBatchDataset


def _images(count: int, seed: int = 0) -> ImageBatchDataset:
    images = torch.arange(count, dtype=torch.float32).view(count, 1, 1, 1).expand(count, 1, 2, 2).clone() / count
    return ImageBatchDataset(images, torch.arange(count) % 3, seed=seed)


def _keys(dataset: ImageBatchDataset) -> set[float]:
    return {float(value) for value in dataset.everything()[0][:, 0, 0, 0]}


def test_the_held_out_images_split_in_two_disjoint_seeded_halves():
    whole = _images(9)
    select, confirm = split_for_confirmation(whole)
    assert (len(select), len(confirm)) == (5, 4)
    assert not _keys(select) & _keys(confirm) and _keys(select) | _keys(confirm) == _keys(whole)
    again = split_for_confirmation(_images(9))
    assert _keys(again[0]) == _keys(select)  # the same seed, the same halves (every rank, every rerun)
    other = split_for_confirmation(_images(9, seed=1))
    assert _keys(other[0]) != _keys(select)
    one, none = split_for_confirmation(_images(1))
    assert len(one) == 1 and none is None


@pytest.mark.parametrize(("count", "budget", "split"), [(248, 0.01, False), (1000, 0.01, True), (998, 0.01, False),
                                                        (248, 0.05, True), (9, None, True)])
def test_the_images_split_only_where_a_half_holds_five_images_of_the_budget(count, budget, split):
    """Digits' 248 held-out images split would leave 124 a half, on which one image is 0.81 of a 1-point budget:
    they stay whole (unconfirmed, said so); 500 images a half hold 5 images of it."""
    select, confirm = split_for_confirmation(_images(count), budget)
    assert (confirm is not None) == split
    assert len(select) + (0 if confirm is None else len(confirm)) == count


def test_auto_withholds_two_halves_of_up_to_2000_images_and_never_more_than_a_fifth():
    assert round(holdout_fraction("auto", 59_900) * 59_900) == 4000  # MNIST: 2,000 to select by, 2,000 to confirm
    assert holdout_fraction("auto", 10_000) == 0.2 and holdout_fraction("auto", 1_238) == 0.2  # letters, digits
    assert holdout_fraction(0.3, 100) == 0.3 and holdout_fraction(0, 100) == 0.0


def _job(compose_cfg, tmp_path, name: str, *overrides: str, budget: float = 0.05) -> dict:
    from ttp_lightning.run.pipeline import run

    out = tmp_path / name
    out.mkdir()
    cfg = compose_cfg("method.early_stopping.retain_holdout=auto", f"paths.output_dir={out}",
                      "attacks.relearn.enabled=false", f"method.early_stopping.retain_acc_drop_at_most={budget}", *overrides)
    with open_dict(cfg):
        del cfg["hydra"]
    return run(cfg, str(out)).to_json() | {"out": out}


def test_the_confirmation_images_never_choose_the_kept_epoch(compose_cfg, tmp_path, monkeypatch):
    """Relabelling every confirmation image at random changes what the confirmation reads and nothing else: the
    same epoch is kept with the same weights, every rule's reading is the same, and the rule never read them."""
    monkeypatch.setenv("TTP_CACHE_DIR", str(tmp_path / "cache"))
    honest = _job(compose_cfg, tmp_path, "honest")
    real = method_code.split_for_confirmation

    def scrambled(holdout, budget=None):
        select, confirm = real(holdout, budget)
        wrong = (confirm.labels + 1 + torch.randint(0, 8, confirm.labels.shape)) % 10
        return select, confirm.relabelled(wrong)

    monkeypatch.setattr(method_code, "split_for_confirmation", scrambled)
    lied = _job(compose_cfg, tmp_path, "lied")
    first, second = (result["metrics"]["pareto"] for result in (honest, lied))
    assert first["best_epoch"] == second["best_epoch"] and first["test_acc"] == second["test_acc"]
    for before, after in zip(honest["history"]["pareto"], lied["history"]["pareto"]):
        assert {k: v for k, v in before.items() if k not in ("retain_confirm_acc", "retain_confirm_conf_dist",
                                                            "elapsed_s")} == \
            {k: v for k, v in after.items() if k not in ("retain_confirm_acc", "retain_confirm_conf_dist", "elapsed_s")}
    weights = [(result["out"] / result["weights_file"]).read_bytes() for result in (honest, lied)]
    assert weights[0] == weights[1]
    confirmed = first["retain_confirmed"]
    assert confirmed["paired"] and confirmed["images"] + first["retain_holdout_size"] == honest["data"]["val_size"]
    for key in ("start_acc", "kept_acc"):  # what the confirmation reads did change (A(D) and the kept weights)
        assert second["retain_confirmed"][key] < confirmed[key]
    # the console's rule and the card state the confirmed cost beside the rule's
    assert "retain_confirm_acc" in honest["history"]["pareto"][0] and CONFIRM_PART == "retain_confirm"
    card = next(f for f in honest["out"].iterdir() if f.name.startswith("release")) / "README.md"
    assert f"- accuracy cost, confirmed: {100 * confirmed['cost']:.2f} points" in card.read_text()


GATE_ROWS = [{"id": "a", "pareto": {"clean": 0.0, "attacked": None, "proven": None, "proven_radius": None}}]


def _confirmed(kept_acc, threshold=0.95) -> dict:
    return {"images": 1000, "start_acc": 0.96, "kept_acc": kept_acc, "cost": 0.96 - kept_acc, "cost_upper": 0.03,
            "confidence": 0.95, "threshold": threshold, "passes": True, "paired": True, "lost": 30, "gained": 10}


@pytest.mark.parametrize("kept_acc, passes", [(0.951, True), (0.95, True), (0.949, False), (math.nan, False)])
def test_the_gate_refuses_a_budget_the_confirmation_images_do_not_meet(kept_acc, passes):
    """The gate recomputes the confirmation's verdict from its accuracies (the record's own `passes` is ignored);
    NaN never passes; an epoch that met no rule is refused for that alone."""
    reported = {"train_steps": 5, "retain_confirmed": _confirmed(kept_acc)}
    verdict = judge(GATE_ROWS, "pareto", reported, GateSettings(), 8)
    assert verdict.passed == passes
    if not passes:
        assert any("confirmation images" in reason and "below the retain rule" in reason for reason in verdict.reasons)
    unmet = judge(GATE_ROWS, "pareto", reported | {"constraint_met": False}, GateSettings(), 8)
    assert not unmet.passed and not any("confirmation" in reason for reason in unmet.reasons)


def _row(epoch, gamma, acc, confirm_acc, exposed=0, unproven=0):
    return {"epoch": epoch, "train_gamma": gamma, "retain_holdout_acc": acc, "retain_confirm_acc": confirm_acc,
            "forget_robust_exposed": exposed, "forget_unproven": unproven}


def test_the_frontier_prices_at_the_confirmed_cost_and_chooses_by_the_rule():
    """Each row's best epoch is the rule's (the selection half), its cost shown on both halves; the budget offered
    covers the larger of the two, and an epoch within the budget on the rule's images but not on the confirmation
    images is what a larger budget would release."""
    history = [_row(1, 12.0, 0.95, 0.90), _row(2, 12.0, 0.94, 0.95), _row(3, 6.0, 0.98, 0.97, exposed=5)]
    rows = trained_radii(history, "retain_holdout_acc", 0.96, 100, 12.0, 8.0, confirm_start=0.97)
    top = rows[0]
    assert (top.epoch, top.retain_cost, top.confirmed_cost, top.cost) == (1, 1.0, 7.0, 7.0)  # the rule's pick
    reported = {"train_gamma_target": 12.0, "retain_rule_reads": "retain_holdout_acc", "retain_rule_start_acc": 0.96,
                "retain_acc_drop_at_most": 0.01, "best_epoch": 1, "train_gamma_kept": 12.0, "interval_weight": 0.1,
                "retain_confirmed": _confirmed(0.90) | {"start_acc": 0.97, "cost": 0.07, "cost_upper": 0.09}}
    price = frontier(history, reported, 8.0, (), 6.5, {}, 100).to_json()
    (offer,) = price["overrides"]
    assert offer["override"] == "method.early_stopping.retain_acc_drop_at_most=0.07" and offer["cost"] == 7.0
    assert "7 pt confirmed" in offer["measured"]
    assert price["kept"]["confirmed_cost"] == 7.0 and price["kept"]["confirmed_cost_upper"] == 9.0
    text = format_frontier(price)
    assert "cost: rule / confirmed" in text and "1 / 7 pt" in text and "confirmed 7 pt on 1000" in text
    assert all(len(line) <= 100 for line in text.splitlines())
    unconfirmed = copy.deepcopy(reported)
    del unconfirmed["retain_confirmed"]
    assert "confirmed" not in format_frontier(frontier(history, unconfirmed, 8.0, (), 6.5, {}, 100).to_json())


def test_an_unsplit_holdout_bounds_the_kept_cost_over_every_epoch_compared(compose_cfg, tmp_path, monkeypatch):
    """The default job's budget (1 point) on tiny digits: the held-out images are too few to split, so the cost
    is read where the rule selected, and bounded by a union over every epoch the fit could compare: its
    accuracies are the rule's own reading, and the card states it as not confirmed. Robust Alg 1, whose radius
    rule reads those images to steer training, gets no such bound."""
    monkeypatch.setenv("TTP_CACHE_DIR", str(tmp_path / "cache"))
    plain = _job(compose_cfg, tmp_path, "plain", budget=0.01)
    metrics = plain["metrics"]["pareto"]
    assert "retain_confirmed" not in metrics
    selected = metrics["retain_selected"]
    assert selected["images"] == metrics["retain_holdout_size"] and selected["compared"] == 15  # TINY's epochs
    assert selected["kept_acc"] == pytest.approx(metrics["retain_holdout_acc"], abs=1e-6)
    assert selected["start_acc"] == pytest.approx(metrics["retain_rule_start_acc"], abs=1e-6)
    assert selected["cost"] == pytest.approx((selected["lost"] - selected["gained"]) / selected["images"], abs=1e-6)
    assert selected["cost"] < selected["cost_upper"] <= 1.0
    card = next(f for f in plain["out"].iterdir() if f.name.startswith("release")) / "README.md"
    assert f"- accuracy cost, not confirmed: {100 * selected['cost']:.2f} points" in card.read_text()
    robust = _job(compose_cfg, tmp_path, "robust", "method=pareto_robust", "method.epochs=3", budget=0.01)
    assert "retain_selected" not in robust["metrics"]["pareto_robust"]
