"""The price of a refused robust release (issue 61, assess/frontier.py): per training radius its best epoch, the
kept weights at each radius, and the overrides that would release with their measured cost."""

import math
from pathlib import Path

import pytest

from ttp_lightning.assess.frontier import (
    JudgedRadius,
    budget_override,
    format_frontier,
    frontier,
    radius_override,
    trained_radii,
)


def _row(epoch, gamma, acc, exposed, unproven=None):
    row = {"epoch": epoch, "train_gamma": gamma, "retain_acc": acc, "forget_robust_exposed": exposed}
    return row if unproven is None else {**row, "forget_unproven": unproven}


HISTORY = [_row(1, 12.0, 0.90, 40, 60), _row(2, 6.0, 0.93, 20, 50), _row(3, 12.0, 0.95, 0, 0),
           _row(4, 12.0, 0.97, 3, 10), _row(5, 6.0, 0.985, 1, 5), _row(6, 6.0, 0.99, 1, 5)]
REPORTED = {"train_gamma_target": 12.0, "retain_rule_reads": "retain_acc", "retain_rule_start_acc": 0.99,
            "retain_acc_drop_at_most": 0.01, "best_epoch": 6, "train_gamma_kept": 6.0, "interval_weight": 0.1}


def test_each_training_radius_keeps_its_epoch_with_fewest_exposed_then_unproven_then_least_cost():
    rows = trained_radii(HISTORY, "retain_acc", 0.99, 100)
    assert [row.train_gamma for row in rows] == [12.0, 6.0]  # largest first
    top, low = rows
    assert (top.epochs, top.epoch, top.exposed, top.proven, top.retain_cost) == (3, 3, 0, 100, 4.0)
    assert (low.epochs, low.epoch, low.exposed, low.proven) == (3, 6, 1, 95)  # ties on exposed, unproven: cheaper
    assert low.retain_cost == 0.0


def test_nan_and_unmeasured_counts_rank_last_and_report_as_unmeasured():
    history = [_row(1, 8.0, 0.99, math.nan), _row(2, 8.0, 0.80, 2)]
    (row,) = trained_radii(history, "retain_acc", 0.99, 10)
    assert row.epoch == 2  # a NaN count is never the best
    (alone,) = trained_radii([_row(1, 8.0, 0.99, math.nan)], "retain_acc", 0.99, 10)
    assert alone.exposed is None and alone.proven is None


def test_a_larger_budget_is_offered_only_for_a_measured_clear_epoch_at_the_radius_and_rounded_up():
    rows = trained_radii(HISTORY, "retain_acc", 0.99, 100)
    offer, why = budget_override(rows, 8.0, 0.01, True, 100)
    assert why is None and offer.override == "method.early_stopping.retain_acc_drop_at_most=0.04"
    assert offer.cost == 4.0 and "epoch 3" in offer.measured
    # 4.01 points rounds up to 4.5, never down
    rows = trained_radii([_row(1, 12.0, 0.9499, 0, 0)], "retain_acc", 0.99, 100)
    assert budget_override(rows, 8.0, 0.01, True, 100)[0].override.endswith("=0.045")
    # the bound term on: an epoch with an unproven image is not clear
    rows = trained_radii([_row(1, 12.0, 0.95, 0, 1)], "retain_acc", 0.99, 100)
    offer, why = budget_override(rows, 8.0, 0.01, True, 100)
    assert offer is None and "unexposed" in why or "no budget" in why
    assert budget_override(rows, 8.0, 0.01, False, 100)[0] is not None  # the bound term off: attack alone
    # nothing trained at the promised radius, and nothing proven below it: no budget measured
    rows = trained_radii([_row(1, 6.0, 0.99, 0, 1)], "retain_acc", 0.99, 100)
    offer, why = budget_override(rows, 8.0, 0.01, True, 100)
    assert offer is None and "no epoch trained at 8/255" in why
    # a clear epoch within the budget: the budget is not what refused
    rows = trained_radii([_row(1, 12.0, 0.985, 0, 0)], "retain_acc", 0.99, 100)
    offer, why = budget_override(rows, 8.0, 0.01, True, 100)
    assert offer is None and "within the budget" in why


def test_an_epoch_below_the_radius_with_every_image_proven_is_offered_as_at_it():
    """A proof holds whatever radius trained (the gate skips its radius fallback there): a fully proven, unexposed
    epoch below the promise is a measured budget; one unproven image, or an unmeasured count, and it is not."""
    history = [_row(1, 12.0, 0.90, 0, 0), _row(2, 3.0, 0.97, 0, 0), _row(3, 3.0, 0.985, 0, 1)]
    offer, why = budget_override(trained_radii(history, "retain_acc", 0.99, 100), 8.0, 0.01, True, 100)
    assert why is None and offer.override.endswith("=0.02") and offer.cost == 2.0
    assert "epoch 2" in offer.measured and "trained at 3/255" in offer.measured and "all 100" in offer.measured
    for bad in (1, math.nan):
        history = [_row(1, 12.0, 0.90, 0, 0), _row(2, 3.0, 0.97, 0, bad)]
        offer, _ = budget_override(trained_radii(history, "retain_acc", 0.99, 100), 8.0, 0.01, True, 100)
        assert offer.cost == 9.0 and "epoch 1" in offer.measured, bad  # the epoch at the radius, dearer
    exposed = [_row(1, 3.0, 0.97, 1, 0)]
    offer, why = budget_override(trained_radii(exposed, "retain_acc", 0.99, 100), 8.0, 0.01, True, 100)
    assert offer is None and "no epoch trained at 8/255" in why


def test_a_smaller_radius_is_the_largest_below_the_promise_at_which_the_gate_passes_these_weights():
    judged = (JudgedRadius(1.0, 0, 100, True), JudgedRadius(2.0, 0, 90, True), JudgedRadius(5.0, 3, 10, False),
              JudgedRadius(8.0, 30, 0, False))
    offer, why = radius_override(judged, 8.0, 1.25)
    assert why is None and offer.override == "attacks.robust_gamma=2" and offer.cost == 1.25
    offer, why = radius_override(judged[2:], 8.0, 1.25)
    assert offer is None and "every radius" in why
    # a radius above the promise that passes is no smaller promise
    offer, _ = radius_override((JudgedRadius(8.0, 1, None, False), JudgedRadius(10.0, 0, None, True)), 8.0, 1.0)
    assert offer is None


def test_the_frontier_reads_the_kept_epoch_and_prints_within_100_columns():
    judged = (JudgedRadius(2.0, 0, 100, True), JudgedRadius(8.0, 1, 95, False))
    price = frontier(HISTORY, REPORTED, 8.0, judged, 0.85, {"forget_proven_radius_min": 2.5,
                                                             "forget_proven_radius_median": 7.0}, 100)
    record = price.to_json()
    assert record["kept"] == {"epoch": 6, "train_gamma": 6.0, "retain_cost": 0.0, "test_cost": 0.85,
                              "proven_radius_min": 2.5, "proven_radius_median": 7.0, "confirmed_cost": None,
                              "confirmed_cost_upper": None, "confirm_images": None}  # nothing confirmed here
    assert [offer["override"] for offer in record["overrides"]] == [
        "method.early_stopping.retain_acc_drop_at_most=0.04", "attacks.robust_gamma=2"]
    assert record["unmeasured"] == [] and record["reads"] == "the retain images trained on"
    text = format_frontier(record)
    assert all(len(line) <= 100 for line in text.splitlines())
    assert "12/255" in text and "would release: attacks.robust_gamma=2 (cost 0.85 pt" in text
    assert "0 of 100" in text and "refuses" in text and "passes" in text


@pytest.mark.parametrize("test_cost", [None, math.nan])
def test_an_unknown_test_cost_prints_as_a_dash_never_as_a_number(test_cost):
    judged = (JudgedRadius(2.0, 0, None, True), JudgedRadius(8.0, 1, None, False))
    record = frontier(HISTORY, {**REPORTED, "interval_weight": 0.0}, 8.0, judged, test_cost, {}, 100).to_json()
    text = format_frontier(record)
    assert "test cost -" in text and "(cost -: these very weights" in text and "nan" not in text.lower()


def _robust_run(compose_cfg, tmp_path, name: str, *overrides: str) -> tuple[dict, Path]:
    from omegaconf import open_dict

    from ttp_lightning.run.pipeline import run

    out = tmp_path / name
    out.mkdir()
    cfg = compose_cfg("method=pareto_robust", f"paths.output_dir={out}", "method.epochs=4", "attacks.gammas=[1,8]",
                      "attacks.apgd_steps=20", "attacks.restarts=1", "attacks.relearn.enabled=false",
                      "data.forget.size=10", "pretrain.epochs=8", "method.early_stopping.conf_dist_below=1",
                      "method.early_stopping.retain_acc_drop_at_most=0.5",
                      *overrides)
    with open_dict(cfg):
        del cfg["hydra"]  # what Hydra's main hands a job
    return run(cfg, str(out)).to_json(), out


def test_a_refused_robust_release_states_its_price_and_the_smaller_radius_it_names_releases_the_same_weights(
        compose_cfg, tmp_path, monkeypatch, capsys):
    """Issue 61: 4 epochs of robust Alg 1 leave images exposed at 8/255 (refused) and none at 1/255. The refusal
    carries the frontier (results.json, console, card); rerunning with the override it names releases the very
    weights it judged, at the cost it stated."""
    monkeypatch.setenv("TTP_CACHE_DIR", str(tmp_path / "cache"))
    refused, out = _robust_run(compose_cfg, tmp_path, "refused")
    assert not refused["release_gate"]["passed"]
    price = refused["frontier"]
    history = refused["history"]["pareto_robust"]
    # every radius trained at has its row, and its best epoch trained there
    assert {row["train_gamma"] for row in price["trained"]} == {round(row["train_gamma"], 4) for row in history}
    for row in price["trained"]:
        assert history[row["epoch"] - 1]["train_gamma"] == pytest.approx(row["train_gamma"])
    # the judged row at the promised radius is the gate's own verdict, recomputed
    judged = {row["gamma"]: row for row in price["judged"]}
    assert judged[8.0]["passes"] is False
    attacked = [image["pareto_robust"]["attacked"] for image in refused["forget_per_image"]]
    assert judged[8.0]["exposed"] == sum(not value <= 0.1 for value in attacked)
    metrics = refused["metrics"]
    test_cost = round(100 * (metrics["pretrain"]["test_acc"] - metrics["pareto_robust"]["test_acc"]), 2)
    assert price["kept"]["test_cost"] == test_cost
    printed = capsys.readouterr().out
    assert "the price of 8/255" in printed
    card = (out / "release_not_protected" / "README.md").read_text()
    assert "## What the promise would cost" in card and "the price of 8/255" in card
    smaller = [offer for offer in price["overrides"] if "attacks.robust_gamma=" in offer["override"]]
    assert judged[1.0]["passes"], "the tiny run should pass at 1/255 (else this test checks nothing)"
    (offer,) = smaller
    best = max((row for row in price["judged"] if row["passes"] and row["gamma"] < 8), key=lambda row: row["gamma"])
    assert offer["override"].endswith(f"attacks.robust_gamma={best['gamma']:g}") and offer["cost"] == test_cost
    if best["by"] == "bound":  # every image proven within it: the least proven radius, added to the grid
        assert best["gamma"] == metrics["pareto_robust"]["forget_proven_radius_min"] and 1 < best["gamma"] < 8
    released, again = _robust_run(compose_cfg, tmp_path, "again", *offer["override"].split())
    assert released["release_gate"]["passed"], released["release_gate"]["reasons"]
    assert "frontier" not in released
    weights = "model.safetensors"
    assert (again / "release" / weights).read_bytes() == (out / "release_not_protected" / weights).read_bytes()


def test_a_held_radius_ramp_is_two_rows_around_the_promise_and_the_rungs_are_the_rules():
    """The epochs of a held radius's ramp (Rounds) each train at their own radius; the frontier groups them into one
    row below the promised radius and one at or above it (each with its best epoch), beside the rule's rungs."""
    from ttp_lightning.alg1.schema import RADIUS_RUNGS
    from ttp_lightning.assess.frontier import RUNG_FRACTIONS, format_frontier

    assert RUNG_FRACTIONS == RADIUS_RUNGS
    history = [_row(1, 6.0, 0.90, 100, 100), _row(2, 0.0, 0.98, 100, 100), _row(3, 2.4, 0.95, 90, 100),
               _row(4, 4.8, 0.93, 60, 90), _row(5, 9.6, 0.91, 5, 7), _row(6, 12.0, 0.94, 0, 0),
               _row(7, 12.0, 0.96, 0, 0), _row(8, 7.2, 0.92, 40, 60)]
    rows = trained_radii(history, "retain_acc", 0.99, 100, target=12.0, gamma=8.0)
    assert [(r.train_gamma, r.ramp_from, r.epochs, r.epoch) for r in rows] == [
        (12.0, None, 2, 7), (9.6, None, 1, 5), (7.2, 2.4, 3, 8), (6.0, None, 1, 1), (0.0, None, 1, 2)]
    assert budget_override(rows, 8.0, 0.01, True, 100)[0].override.endswith("=0.03")  # epoch 7: 3 points
    two = trained_radii([*history, _row(9, 10.8, 0.9, 3, 3)], "retain_acc", 0.99, 100, target=12.0, gamma=8.0)
    ramp = next(r for r in two if r.ramp_from is not None and r.train_gamma >= 8.0)
    assert (ramp.ramp_from, ramp.train_gamma, ramp.epochs) == (9.6, 10.8, 2)
    record = {"gamma": 8.0, "budget": 0.01, "reads": "the validation images (val/)", "forget_size": 100,
              "kept": {"epoch": 7, "train_gamma": 12.0, "retain_cost": 3.0, "test_cost": 3.5,
                       "proven_radius_min": 8, "proven_radius_median": 10}, "trained": [r.to_json() for r in two],
              "judged": [], "overrides": [], "unmeasured": []}
    assert "ramp 9.6-10.8/255" in format_frontier(record) and "ramp 2.4-7.2/255" in format_frontier(record)
