"""`method.theta=auto` (issue 39): the rule that picks the certified learners' theta (certified/maths/theta_rule.py)
against synthetic frontiers and a dense scan, and on a real certified run: the release is solved at the chosen
theta, the certificate and the release state it, verify passes, and what the rule cannot protect is named."""

import itertools
import json
import math
import subprocess
import sys

import pytest
import torch

from conftest import release_of
from ttp_lightning.certified.maths.linear_head import SolverSettings, solve_on_ball
from ttp_lightning.certified.maths.residual_step import objective_at
from ttp_lightning.certified.maths.theta_rule import Probe, check_ladder, choose_theta
from ttp_lightning.certified.theta import head_scores

LADDER = [0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875]


def frontier(gate_at: float, retain_breaks_at: float, images: int = 4, calls: list | None = None):
    """A synthetic M_theta(D): every image's CD falls linearly to 0.1 at `gate_at`; retain accuracy 0.9 until
    `retain_breaks_at`, then 0.5."""
    def probe(theta: float) -> Probe:
        if calls is not None:
            calls.append(theta)
        cds = tuple(0.1 * (1 + (gate_at - theta) * (1 + i / images)) for i in range(images))
        return Probe(theta, 0.9 if theta < retain_breaks_at else 0.5, cds)
    return probe


def test_the_smallest_qualifying_theta_is_found_to_the_bisection_s_precision():
    calls = []
    choice = choose_theta(frontier(0.56, 0.95, calls=calls), LADDER, 3, threshold=0.1, retain_floor=0.89)
    assert choice.met and choice.exposed == ()
    assert 0.56 <= choice.theta <= 0.56 + 0.125 / 8  # bracket [0.5, 0.625] halved three times
    assert calls[:5] == LADDER[:5] and len(calls) == 5 + 3  # the ladder stops at the first qualifying theta
    assert choice.record()["probes"][-1]["theta"] in calls


def test_the_first_ladder_theta_qualifying_is_refined_down_towards_zero():
    choice = choose_theta(frontier(0.02, 0.95), LADDER, 2, threshold=0.1, retain_floor=0.89)
    assert choice.met and choice.theta == pytest.approx(0.03125)  # 0.125 -> 0.0625 -> 0.03125


def test_when_the_retain_rule_breaks_first_the_largest_kept_theta_names_its_images():
    choice = choose_theta(frontier(0.8, 0.45), LADDER, 3, threshold=0.1, retain_floor=0.89)
    assert not choice.met and choice.theta == 0.375  # 0.5 broke the retain rule
    assert choice.exposed == (0, 1, 2, 3)
    assert [p["theta"] for p in choice.record()["probes"]] == LADDER[:4]


def test_when_no_theta_keeps_the_retain_rule_the_smallest_probe_is_the_verdict():
    choice = choose_theta(frontier(0.8, 0.01), LADDER, 3, threshold=0.1, retain_floor=0.89)
    assert not choice.met and choice.theta == 0.125 and len(choice.probes) == 1


@pytest.mark.parametrize("bad", ["cd", "retain"])
def test_nan_never_qualifies(bad):
    def probe(theta):
        return Probe(theta, math.nan if bad == "retain" else 0.95, (0.0, math.nan if bad == "cd" else 0.0))
    choice = choose_theta(probe, LADDER, 3, threshold=0.1, retain_floor=0.5)
    assert not choice.met
    assert choice.exposed == ((1,) if bad == "cd" else ())  # a NaN retain accuracy: no probe kept the rule
    if bad == "cd":  # wherever the NaN stands, it is the worst image's value
        assert all(math.isnan(Probe(0.5, 0.9, order).worst) for order in [(0.0, math.nan), (math.nan, 0.0)])


def test_a_frontier_that_is_not_monotone_never_yields_an_unmeasured_or_failing_theta():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        table = {}

        def probe(theta, table=table):
            table.setdefault(theta, Probe(theta, float(torch.rand(1, generator=g)) * 0.2 + 0.8,
                                          tuple((torch.rand(3, generator=g) * 0.2).tolist())))
            return table[theta]
        choice = choose_theta(probe, LADDER, 4, threshold=0.1, retain_floor=0.85)
        chosen = table[choice.theta]
        assert choice.met == (chosen.keeps_retain(0.85) and not chosen.exposed(0.1))
        assert choice.exposed == chosen.exposed(0.1)


@pytest.mark.parametrize("ladder, steps", [([], 3), ([0.5, 0.25], 3), ([0.0, 0.5], 3), ([0.5, 1.0], 3),
                                           ([0.5], -1), ([0.5], 21)])
def test_a_bad_ladder_is_refused(ladder, steps):
    assert check_ladder(ladder, steps)
    with pytest.raises(ValueError):
        choose_theta(frontier(0.5, 0.9), ladder, steps, 0.1, 0.5)


def test_on_a_real_objective_the_choice_agrees_with_a_dense_scan():
    """A small linear head (reverse KL forget term, cross-entropy retain term): the rule's theta is within the
    bisection's precision above the smallest theta of a dense scan that qualifies."""

    g = torch.Generator().manual_seed(1)
    feats = lambda rows: torch.cat([torch.randn(rows, 4, generator=g, dtype=torch.float64) * 2,
                                    torch.ones(rows, 1, dtype=torch.float64)], 1)
    retain_labels = torch.randint(3, (80,), generator=g)
    features, labels = [feats(6), feats(80)], [torch.randint(3, (6,), generator=g), retain_labels]

    class Cfg:
        uniformity, forget_temperature, forget_reduction = "reverse_kl", 1.0, "mean"

    settings = SolverSettings(tolerance=1e-12)

    def probe(theta):
        objective = objective_at(features, labels, Cfg, theta, 1e-3, 3)
        weights = solve_on_ball(objective, torch.zeros(objective.size, dtype=torch.float64), 50.0, settings).weights
        return Probe(theta, *head_scores(objective.matrix(weights), features, labels))

    first = probe(1 / 64)
    floor = first.retain_acc - 0.2
    # up to the first that qualifies: the smallest theta of a dense scan
    scan = itertools.chain([first], (probe(t / 64) for t in range(2, 64)))
    smallest = next((p.theta for p in scan if p.keeps_retain(floor) and not p.exposed(0.1)), None)
    choice = choose_theta(probe, LADDER, 3, threshold=0.1, retain_floor=floor)
    assert smallest is not None and choice.met
    assert smallest - 1e-12 <= choice.theta <= smallest + 0.125 / 8 + 1e-12


# ------------------------------------------------------------------ on a certified run
AUTO = ["model=logreg", "pretrain.norm_bound=10", "attacks.enabled=false", "method=certified_exact",
        "method.bound=residual", "method.epsilon=1", "method.theta=auto"]


def test_theta_auto_releases_at_the_chosen_theta_and_states_it(run_job, tmp_path):
    proc, results = run_job(*AUTO, "method.theta_retain_drop_at_most=0.5")
    assert results is not None, proc.stderr[-2000:]
    metrics = results["metrics"]["certified_exact"]
    rule = metrics["theta_rule"]
    chosen = metrics["theta"]
    assert rule["met"] and rule["theta"] == chosen and 0 < chosen < 1
    assert results["config"]["method"]["theta"] == "auto"
    release = release_of(tmp_path / "out")
    cert = json.loads((release / "certificate.json").read_text())
    assert cert["theta"] == chosen
    assert json.loads((release / "config.json").read_text())["protection"]["theta"] == chosen
    assert "chosen by the theta rule" in (release / "README.md").read_text()
    for public in release.iterdir():  # the probes score private, noise-free optima: never in the release
        assert b"probes" not in public.read_bytes() and b"theta_rule" not in public.read_bytes(), public
    assert "theta rule: theta" in proc.stderr + proc.stdout
    # what the rule measured at its theta is what the release scores (epsilon 1: the noise is ~1e-6)
    last = [p for p in rule["probes"] if p["theta"] == chosen][-1]
    assert last["worst_forget_conf_dist"] == pytest.approx(metrics["forget_worst_conf_dist"], abs=1e-3)
    private = tmp_path / "out" / "private" / "audit.json"  # the audit re-solves at the certificate's theta
    verify = subprocess.run([sys.executable, "-m", "ttp_lightning.verify", str(release), "--recompute", "--audit",
                             str(private)], capture_output=True, text=True, check=False)
    assert verify.returncode == (0 if results["release_gate"]["passed"] else 1), verify.stdout + verify.stderr
    assert "release reproduced from the audit record" in verify.stdout or not results["release_gate"]["passed"]


def test_theta_auto_that_cannot_protect_names_the_images_and_the_gate_refuses(run_job):
    proc, results = run_job(*AUTO, "method.theta_retain_drop_at_most=0", "method.theta_ladder=[0.01,0.02]",
                            "method.theta_refine_steps=0")
    assert results is not None, proc.stderr[-2000:]
    rule = results["metrics"]["certified_exact"]["theta_rule"]
    assert not rule["met"] and rule["exposed"] > 0
    assert "no probed theta puts every forget image" in proc.stderr + proc.stdout
    assert proc.returncode == 4 and not results["release_gate"]["passed"]


@pytest.mark.parametrize("override, named", [
    (["method.bound=paper"], "method.theta=auto is not allowed with method.bound=paper"),
    (["method.theta_ladder=[0.5,0.25]"], "method.theta_ladder=[0.5, 0.25]"),
    (["method.theta_refine_steps=-1"], "method.theta_refine_steps=-1"),
    (["method.theta_retain_drop_at_most=2"], "method.theta_retain_drop_at_most=2"),
    (["method.warmup_epochs=2"], "method.warmup_epochs=2 is not allowed with method.theta=auto"),
])
def test_theta_auto_settings_that_cannot_work_are_refused_in_one_line(run_job, override, named):
    proc, results = run_job(*AUTO, *override)
    assert results is None and proc.returncode == 2
    assert named in proc.stderr
