"""bounds.kind=auto (bounds/choice.py): the bound that proves the most within a time per image, by measuring."""

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from ttp_lightning.bounds import linear
from ttp_lightning.bounds.choice import CANDIDATES, Trial, _proves_more, choose_bound
from ttp_lightning.bounds.uniformity import Prover


def _deep_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 24), nn.ReLU(),
                         nn.Linear(24, 4)).eval()


def _images(n: int = 3) -> torch.Tensor:
    return torch.rand(n, 1, 4, 4, generator=torch.Generator().manual_seed(1))


def _flat_net() -> nn.Module:
    """Near-uniform outputs (an initialised network): intervals prove a radius of about 10/255, CROWN more."""
    return _deep_net()


def test_every_candidate_is_tried_and_the_one_chosen_proves_at_least_as_much_as_any_finished_one():
    net, images = _flat_net(), _images()
    choice = choose_bound(net, images, at_most=0.1, step=0.25, largest=16.0, seconds_per_image=60.0)
    # two ReLU layers, one feeding the other: alpha-CROWN is tried too, with the settings' slope steps
    assert [(t.bound, t.intermediate, t.slope_steps > 0) for t in choice.trials] == list(CANDIDATES)
    assert choice.trials[-1].slope_steps == 20
    assert all(t.finished and t.seconds_per_image > 0 for t in choice.trials)
    chosen = next(t for t in choice.trials if (t.bound, t.intermediate) == (choice.bound, choice.intermediate))
    assert all(chosen.radius_mean >= t.radius_mean for t in choice.trials)
    interval = choice.trials[0]
    assert chosen.radius_mean > interval.radius_mean  # on two ReLU layers CROWN proves more than intervals
    assert choice.probe_images == 2 and choice.to_json()["trials"][0]["bound"] == "interval"


def test_the_choice_bounds_no_probe_image_twice_at_one_radius(monkeypatch):
    """Each trial's proven CD at the grid's first radius is the one its radius search computed (the search starts
    there): on a CNN that bound costs seconds an image, and the rule's time per image pays for it once."""
    calls: list[tuple[int, int, float]] = []  # (prover, image, radius) per image bounded
    conf_dist, provers = Prover.conf_dist, itertools.count()

    def recording(self, images, gamma):
        radii = torch.as_tensor(gamma, dtype=torch.float64).expand(len(images))
        if not hasattr(self, "number"):  # id() is reused once a prover is collected
            self.number = next(provers)
        calls.extend((self.number, int(image.sum() * 1e6), float(r)) for image, r in zip(images, radii))
        return conf_dist(self, images, gamma)

    monkeypatch.setattr(Prover, "conf_dist", recording)
    choice = choose_bound(_flat_net(), _images(), at_most=0.1, step=0.25, largest=16.0, seconds_per_image=60.0)
    assert all(trial.finished for trial in choice.trials)
    timed = [call for call in calls if call[2] > 0]  # radius 0: the untimed warm-up's and the searches' clean CDs
    assert any(call[2] == 0.25 for call in timed) and len(timed) == len(set(timed))


def test_the_chosen_bound_is_sound_at_the_radius_it_proves():
    net, images = _flat_net(), _images()
    choice = choose_bound(net, images, at_most=0.1, step=0.25, largest=16.0, seconds_per_image=60.0)
    prover = Prover(net, choice.bound, intermediate=choice.intermediate or "ibp", slope_steps=choice.slope_steps)
    radius = prover.radius(images, 0.1)
    bound = prover.conf_dist(images, radius)
    generator = torch.Generator().manual_seed(2)
    for i in range(len(images)):
        gamma = float(radius[i]) / 255
        noise = (torch.rand(512, 1, 4, 4, generator=generator) * 2 - 1) * gamma
        points = (images[i] + noise).clamp(0, 1)
        probs = net(points).softmax(-1)
        measured = (probs.max(-1).values - 1 / 4).max()
        assert float(measured) <= float(bound[i]) + 1e-6


def test_a_tie_goes_to_the_cheaper_bound():
    """One ReLU layer: CROWN's own pre-activation bounds are the interval ones, so CROWN-IBP proves the same."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 4)).eval()
    with torch.no_grad():
        net[1].weight.mul_(0.3)
        net[3].weight.mul_(0.3)
    choice = choose_bound(net, _images(), at_most=0.1, step=0.25, largest=16.0, seconds_per_image=60.0)
    assert (choice.bound, choice.intermediate) == ("linear", "ibp")
    assert choice.trials[1].radius_mean == choice.trials[2].radius_mean
    assert len(choice.trials) == 3  # no ReLU feeds another: alpha-CROWN is full CROWN and is not tried twice


def test_a_bound_past_its_time_is_stopped_and_not_used():
    choice = choose_bound(_flat_net(), _images(), at_most=0.1, step=0.25, largest=16.0, seconds_per_image=1e-9)
    assert not any(t.finished for t in choice.trials)
    assert all("s per image" in t.note for t in choice.trials)
    assert (choice.bound, choice.intermediate) == ("interval", None)  # nothing finished: the cheapest, sound


def test_the_deadline_stops_a_linear_bound_between_its_backward_passes():
    net, images = _deep_net(), _images()
    lower, upper = (images - 0.1).clamp(0, 1), (images + 0.1).clamp(0, 1)
    with pytest.raises(linear.OverBudget), linear.deadline(0.0):
        linear.logit_difference_lower_bounds(net.double(), lower.double(), upper.double(), intermediate="crown")
    with linear.deadline(None):  # no limit
        linear.logit_difference_lower_bounds(net.double(), lower.double(), upper.double(), intermediate="crown")


def test_nan_never_proves_more():
    finite = Trial("interval", None, 0, 0.01, 1.0, 0.05)
    nan = Trial("linear", "crown", 0, 0.1, 4.0, math.nan)
    assert not _proves_more(nan, finite)
    assert _proves_more(finite, nan)
    assert _proves_more(Trial("linear", "ibp", 0, 0.02, 1.0, 0.04), finite)
    assert not _proves_more(Trial("linear", "ibp", 0, 0.02, 1.0, 0.05 - 1e-12), finite)  # rounding is a tie


def test_no_image_means_intervals():
    choice = choose_bound(_flat_net(), _images()[:0], 0.1, 0.25, 16.0, 2.0)
    assert (choice.bound, choice.trials) == ("interval", ())


def test_a_network_no_bound_has_a_rule_for_gets_no_proven_cd_not_a_crash():
    """GELU (a ViT's activation): no bound has a rule for it. With kind=linear the stage got "no proven CD" and a
    note; the rule must end the same way (its probe raised out of proven_bounds)."""
    from ttp_lightning.assess.protection import proven_bounds
    from ttp_lightning.config.schema import BoundsSchema

    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.GELU(), nn.Linear(8, 4)).eval()
    proven = proven_bounds(net, _images(), [1.0, 8.0], "cpu", BoundsSchema(), 0.1)
    assert proven.by_gamma is None and proven.radius is None and "GELU" in proven.note
    assert proven.rule["bound"] == "interval" and all("GELU" in t["note"] for t in proven.rule["trials"])
    assert len(proven.rule["trials"]) == 3  # alpha-CROWN is not tried where nothing could be counted


def _speed(run_job, tmp_path):
    """A finished tiny run and the arguments of scripts/bench_bound_speed.py on it."""
    proc, results = run_job("attacks.enabled=false", "release_gate.require=[clean]")
    assert results is not None, proc.stderr[-2000:]
    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_bound_speed.py"
    run = tmp_path / "out"
    return script, run, [sys.executable, str(script), str(run), "--images", "3", "--batch", "2", "--threads", "1"]


def _bench(args, out):
    done = subprocess.run(args + ["--out", str(out)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done, json.loads(out.read_text())["runs"]


def test_the_bound_speed_benchmark_times_two_bounds_and_a_zero_budget_claims_nothing(run_job, tmp_path):
    """scripts/bench_bound_speed.py on a finished tiny run: a row per bound asked for, each in its own process;
    with a budget of 0 s a bound stops before its first batch and claims no image; a folder without a run is
    one error line."""
    script, run, args = _speed(run_job, tmp_path)
    done, runs = _bench(args + ["--bounds", "intervals", "full CROWN"], tmp_path / "speed.json")
    rows = runs[str(run)]
    assert [row["bound"] for row in rows] == ["intervals", "full CROWN"]
    assert all(row["bounded"] == 3 and row["s_per_image"] > 0 and row["note"] is None for row in rows)
    assert all(0 <= row["worst"] <= 0.9 and row["peak_mib"] > 0 for row in rows)
    assert rows[1]["proven"] >= rows[0]["proven"]  # full CROWN is never looser than intervals
    assert done.stdout.count("| out |") >= 2
    _, runs = _bench(args + ["--budget", "0", "--bounds", "intervals"], tmp_path / "zero.json")
    assert all(row["bounded"] == 0 and "budget" in row["note"] for row in runs[str(run)])
    missing = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                             check=False)
    assert missing.returncode == 2 and missing.stderr.startswith("error:")


@pytest.mark.slow
def test_the_bound_speed_benchmark_times_every_candidate_and_searches_radii(run_job, tmp_path):
    """Every candidate bound (dense windows change the cost, not the bound), the zero budget on all of them,
    and the radius search from the interval radius up."""
    _, run, args = _speed(run_job, tmp_path)
    every = ["intervals", "CROWN-IBP", "full CROWN", "alpha-CROWN", "full CROWN, dense"]
    done, runs = _bench(args + ["--bounds", *every], tmp_path / "speed.json")
    rows = runs[str(run)]
    assert [row["bound"] for row in rows] == every
    assert rows[4]["worst"] == pytest.approx(rows[2]["worst"], abs=1e-9)  # windows change the cost, not the bound
    assert all(row["bounded"] == 3 and row["s_per_image"] > 0 and row["note"] is None for row in rows)
    assert rows[2]["proven"] >= rows[0]["proven"] and done.stdout.count("| out |") >= 5
    searched, runs = _bench(args + ["--search", "--bounds", "intervals", "full CROWN"], tmp_path / "search.json")
    intervals, crown = runs[str(run)]
    assert intervals["search"] and crown["bounded"] == 3 and crown["median_radius"] >= intervals["median_radius"]
    assert crown["worst"] >= intervals["worst"] and "radius search" in searched.stdout  # from the interval radius up
    _, runs = _bench(args + ["--budget", "0"], tmp_path / "zero.json")
    assert all(row["bounded"] == 0 and "budget" in row["note"] for row in runs[str(run)])
