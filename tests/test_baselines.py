"""Baselines trained from scratch: synthetic neighbours of the forget set, GaussianUniform, LabelDP."""

import math

import torch

from conftest import TINY_WITHOUT_METHOD, finished
from ttp_lightning.methods.baselines.labeldp import rr_with_prior
from ttp_lightning.methods.baselines.synthetic import uniform_ball_points


def test_ball_points_stay_within_the_radius_and_fill_the_ball():
    centres = torch.full((3, 1, 8, 8), 0.5)
    points = uniform_ball_points(centres, 400, 8 / 255, torch.Generator().manual_seed(0))
    offsets = (points - centres.repeat_interleave(400, dim=0)).flatten(1)
    assert points.shape == (1200, 1, 8, 8) and offsets.norm(dim=1).max() <= 8 / 255 + 1e-6
    # uniform in a 64-dimensional ball: almost all mass near the surface, directions spread evenly
    assert offsets.norm(dim=1).median() > 0.95 * 8 / 255 and offsets.mean(0).abs().max() < 0.1 * 8 / 255
    edge = uniform_ball_points(torch.zeros(1, 1, 2, 2), 50, 0.5, torch.Generator().manual_seed(1))
    assert edge.min() >= 0  # clipped to [0, 1] pixels


def test_synthetic_baseline_from_the_cli(run_job):
    proc, results = run_job("method=synthetic", "method.k=5", "attacks.enabled=false", *TINY_WITHOUT_METHOD,
                            tiny=False)
    finished(proc.returncode, results, proc.stderr)
    synthetic = results["metrics"]["synthetic"]
    assert synthetic["synthetic_points"] == 20 * 5 and synthetic["train_size"] == 1258 - 20 + 100
    assert synthetic["test_acc"] > 0.8 and synthetic["forget_conf_dist"] < results["metrics"]["pretrain"]["forget_conf_dist"] + 0.1


def test_gaussian_uniform_baseline_reports_noisy_accuracies(run_job):
    proc, results = run_job("method=gaussian_uniform", "attacks.enabled=false", *TINY_WITHOUT_METHOD, tiny=False)
    finished(proc.returncode, results, proc.stderr)
    baseline = results["metrics"]["gaussian_uniform"]
    assert baseline["train_size"] == 2 * 1258
    assert {"noisy_retain_acc", "noisy_forget_acc", "noisy_test_acc"} <= baseline.keys()
    assert baseline["noisy_retain_acc"] > 0.5 and baseline["test_acc"] < results["metrics"]["pretrain"]["test_acc"]


def test_rr_with_prior_keeps_labels_as_often_as_epsilon_allows():
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(10, (20000,), generator=generator)
    uniform = torch.full((20000, 10), 0.1)
    noisy = rr_with_prior(uniform, labels, 2.0, generator)  # uniform prior: k* = K, plain RR
    keep = math.exp(2) / (math.exp(2) + 9)
    assert abs((noisy == labels).float().mean().item() - keep) < 0.01
    assert noisy.bincount(minlength=10).min() > 1000  # flips spread over every class
    confident = torch.nn.functional.one_hot(torch.tensor([3, 3]), 10).float() * 0.99 + 0.001
    assert rr_with_prior(confident, torch.tensor([3, 5]), 2.0, generator).tolist() == [3, 3]  # k* = 1


def test_labeldp_baseline_from_the_cli(run_job):
    proc, results = run_job("method=labeldp", "attacks.enabled=false", *TINY_WITHOUT_METHOD, tiny=False)
    finished(proc.returncode, results, proc.stderr)
    labeldp = results["metrics"]["labeldp"]
    assert labeldp["stage_sizes"] == [629, 629]
    assert abs(labeldp["stage1_labels_kept"] - math.exp(2) / (math.exp(2) + 9)) < 0.06
    assert labeldp["stage2_labels_kept"] > labeldp["stage1_labels_kept"]  # the prior concentrates RR
    assert labeldp["test_acc"] > 0.5
