"""The real command line on tiny data: results contract, methods, sweeps, help and bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import REPO, TINY, TINY_WITHOUT_METHOD, finished
from ttp_lightning.assess.evaluation import evaluate
from ttp_lightning.data import build_datamodule
from ttp_lightning.release import load_released
from ttp_lightning.reporting.tables import main as tables_main

METRIC_KEYS = {"retain_acc", "test_acc", "forget_acc", "forget_conf_dist", "retain_conf_dist", "test_conf_dist",
               "forget_l2_dist", "forget_nn_acc", "forget_nn_conf_dist", "wall_s"}


def test_default_job_writes_the_results_contract(run_cli, tmp_path):
    proc, results = run_cli("method.early_stopping.retain_holdout=auto")  # the default (TINY pins the paper's)
    finished(proc.returncode, results, proc.stderr)
    assert results["experiment"] == "digits_mlp" and results["method"] == "pareto"
    assert results["config"]["method"]["theta"] == 0.75
    pre, alg1 = results["metrics"]["pretrain"], results["metrics"]["pareto"]
    assert METRIC_KEYS <= pre.keys() and METRIC_KEYS <= alg1.keys()
    assert {"best_epoch", "constraint_met", "train_steps_per_s", "wall_to_best_s"} <= alg1.keys()
    assert all(0.0 <= alg1[k] <= 1.0 for k in METRIC_KEYS - {"wall_s"})
    history = results["history"]["pareto"]
    assert [row["epoch"] for row in history] == list(range(1, 16))
    assert {"retain_acc", "test_acc", "forget_conf_dist", "elapsed_s"} <= history[0].keys()
    assert alg1["forget_conf_dist"] * 3 < pre["forget_conf_dist"]
    reads = alg1["retain_rule_reads"]  # the held-out slice's accuracy by default (retain_holdout: auto)
    assert reads == "retain_holdout_acc" and alg1["retain_holdout_size"] > 0
    qualifying = [r for r in history if r["forget_worst_conf_dist"] < 0.1 and r[reads] >= alg1["retain_acc_threshold"]]
    if alg1["constraint_met"]:  # the paper's rule, per image: the lowest mean CD among epochs whose worst image is < 0.1
        assert alg1["forget_conf_dist"] == pytest.approx(min(r["forget_conf_dist"] for r in qualifying), abs=1e-4)
    else:  # none qualified: the Pareto fallback, highest retain accuracy minus forget CD
        assert not qualifying and alg1["best_epoch"] == max(history, key=lambda r: r[reads] - r["forget_conf_dist"])["epoch"]
    assert "pretrain" in proc.stdout and "forget CD" in proc.stdout
    attacks = results["attacks"]
    assert set(attacks) == {"pretrain", "pareto"} and set(attacks["pareto"]) == {"none", "worst", "gaussian", "apgd"}
    assert attacks["pareto"]["none"]["0"]["forget_conf_dist"] == pytest.approx(alg1["forget_conf_dist"], abs=1e-5)
    assert set(attacks["pareto"]["apgd"]) == {"1", "2", "5", "8"}
    assert attacks["pareto"]["apgd"]["8"]["forget_conf_dist"] > attacks["pareto"]["none"]["0"]["forget_conf_dist"]
    assert alg1["forget_robust_conf_dist"] == attacks["pareto"]["worst"]["8"]["forget_conf_dist"]
    checks = results["attack_checks"]["pareto"]
    assert {"zero_gradient_share", "monotone_in_gamma", "unbounded", "randomised"} <= checks.keys()
    assert checks["monotone_in_gamma"] is True and 0 <= checks["zero_gradient_share"] <= 1
    assert "attacks on the forget set" in proc.stdout and "8/255" in proc.stdout and "robust CD" in proc.stdout
    # bounds.kind=auto: the method's bound chosen by measuring, with its trials and time; A(D), the same
    # architecture, bounded the same way without trials of its own
    bounds = results["proof_bound"]
    record, rule = bounds["pareto"], bounds["pareto"]["rule"]
    assert (record["bound"], record["intermediate"]) == (rule["bound"], rule["intermediate"])
    assert [t["bound"] for t in rule["trials"]] == ["interval", "linear", "linear"]
    assert record["seconds"] >= rule["seconds"] > 0
    assert bounds["pretrain"]["rule"] is None and bounds["pretrain"]["same_as"] == "pareto"
    assert (bounds["pretrain"]["bound"], bounds["pretrain"]["intermediate"]) == (rule["bound"], rule["intermediate"])
    assert "(by rule: " in proc.stdout
    card = (tmp_path / "out" / results["release"]["folder"] / "README.md").read_text()
    assert "chosen by bounds.kind=auto" in card
    softmax = results["forget_softmax"]["pareto"]
    assert len(softmax) == 5 and all(abs(sum(row["softmax"]) - 1) < 1e-4 for row in softmax)
    # the released weights are the evaluated model
    datamodule = build_datamodule(OmegaConf.create(results["config"]["data"]))
    folder = results["release"]["folder"]  # release/, or release_not_protected/ when the tiny run's gate fails
    assert results["weights_file"] == f"{folder}/model.safetensors" and "state_dict_file" not in results
    assert not list((tmp_path / "out").rglob("model.pt"))  # the weights are written once, as the release
    assert not list((tmp_path / "out").glob(".run.lock"))  # the run folder's lock leaves no empty file behind
    net = load_released(tmp_path / "out" / folder)
    assert evaluate(net, datamodule)["forget_conf_dist"] == pytest.approx(alg1["forget_conf_dist"], abs=1e-6)
    # results.json names the forget instances: an auditor recomputes the fingerprint from the indices alone
    from ttp_lightning.data.forget import fingerprint

    indices = torch.as_tensor(results["data"]["forget_indices"])
    assert len(indices) == 20 and results["data"]["forget_test_indices"] == []
    assert fingerprint(datamodule.train_images[indices], datamodule.train_labels[indices]) == \
        results["data"]["forget_fingerprint"]


def test_retrain_baseline_trains_on_the_retain_set(run_job):
    defaults = ("attacks.relearn.steps=[1,10,100,1000]", "attacks.relearn.lrs=[0.0001,0.001,0.01]",
                "attacks.relearn.data=[test,retain]")  # the relearning attack's defaults, which TINY lightens
    proc, results = run_job("method=retrain", *TINY_WITHOUT_METHOD, *defaults, tiny=False)
    assert proc.returncode == 4 and not results["release_gate"]["passed"]  # retraining makes no image uncertain
    retrain = results["metrics"]["retrain"]
    assert METRIC_KEYS <= retrain.keys() and retrain["test_acc"] > 0.8
    assert results["history"]["retrain"] == []
    # the relearning attack at its defaults: 2 sources x 3 rates up to 1,000 steps, the worst case reported
    runs = results["relearn_runs"]["retrain"]
    assert sorted(runs) == sorted(f"{source} lr {lr}" for source in ("test", "retain 1000")
                                  for lr in ("0.0001", "0.001", "0.01"))
    for steps in ("1", "10", "100", "1000"):
        worst = results["relearn"]["retrain"][steps]
        assert worst["forget_conf_dist"] == max(run[steps]["forget_conf_dist"] for run in runs.values())
        assert runs[worst["run"]][steps]["forget_conf_dist"] == worst["forget_conf_dist"]


def test_forget_instances_from_the_test_set_are_absorbed_then_protected(run_cli, tmp_path, capsys):
    proc, _ = run_cli("+experiment=mnist_mlp_test_instances", "data=digits", "data.forget.test_fraction=0,0.5",
                      "pretrain.absorb_epochs=3", "attacks.enabled=false", multirun=True)
    inside, mixed = (json.loads((tmp_path / "out" / str(i) / "results.json").read_text()) for i in (0, 1))
    assert proc.returncode == (0 if inside["release_gate"]["passed"] and mixed["release_gate"]["passed"] else 4)
    assert list(inside["metrics"]) == ["pretrain", "pareto"] and inside["data"]["forget_from_test"] == 0
    metrics = mixed["metrics"]
    assert list(metrics) == ["pretrain_original", "pretrain", "pareto"]
    assert mixed["data"]["forget_from_test"] == 10 and mixed["data"]["test_size"] == 539 - 10
    assert len(mixed["data"]["forget_indices"]) == 10 and len(set(mixed["data"]["forget_test_indices"])) == 10
    assert metrics["pretrain"]["absorb_epochs"] == 3 and metrics["pretrain"]["absorb_cached"] is False
    # A(D) never saw half the forget images; after absorbing them it fits them at least as well
    assert metrics["pretrain"]["forget_acc"] >= metrics["pretrain_original"]["forget_acc"]
    assert metrics["pareto"]["forget_conf_dist"] < 0.5 * metrics["pretrain"]["forget_conf_dist"]
    assert tables_main([str(tmp_path / "out"), "--layout", "forget"]) == 0
    rows = [line.split(" | ")[:3] for line in capsys.readouterr().out.splitlines() if line.startswith("| 20 ")]
    assert rows == [["| 20", "0", "Pretrain"], ["| 20", "0", "Alg 1"], ["| 20", "10", "Pretrain (D_f unseen)"],
                    ["| 20", "10", "Pretrain"], ["| 20", "10", "Alg 1"]]


def test_fullbatch_mode_with_surgery_and_temperature(run_job):
    proc, results = run_job("method.mode=fullbatch", "method.gradient_surgery=true", "method.forget_temperature=2",
                            "method.epochs=40", "method.early_stopping.enabled=false")
    finished(proc.returncode, results, proc.stderr)
    alg1 = results["metrics"]["pareto"]
    assert alg1["train_steps"] == 40 and alg1["best_epoch"] == 40 and alg1["constraint_met"] is None
    assert alg1["forget_conf_dist"] * 2 < results["metrics"]["pretrain"]["forget_conf_dist"]


def test_wandb_logs_offline_and_finishes(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    env["TTP_CACHE_DIR"] = str(tmp_path / "cache")
    overrides = [o for o in TINY if not o.startswith("logger=")] + ["method.epochs=2", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run([sys.executable, "-m", "ttp_lightning", *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    finished(proc.returncode, json.loads((tmp_path / "results.json").read_text()), proc.stderr)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, "no offline wandb run written"
    media = runs[0] / "files" / "media"
    assert {p.name.split("_")[0] for p in (media / "images" / "figures").glob("*.png")} == {"dynamics", "softmax", "attacks"}
    tables = {p.name.rsplit("_", 2)[0] for p in (media / "table" / "tables").glob("*.table.json")}
    assert tables == {"metrics", "attacks", "per_image", "forget_images", "relearn"}, tables  # the floor: off in TINY
    assert (tmp_path / "figures" / "softmax.png").is_file()


BAD_INPUT = [
    ("method.theta=1.5", "method.theta=1.5 is not allowed; choose a value in [0, 1]"),
    ("method.theta=-0.1", "method.theta=-0.1 is not allowed"),
    ("data=imagenet22k", "unknown data 'imagenet22k'; choose one of:"),
    ("model=resnet1000", "unknown model 'resnet1000'"),
    ("method=magic", "unknown method 'magic'"),
    ("+experiment=nope", "unknown experiment 'nope'"),
    ("data.forget.size=5000", "data.forget.size=5000 is not allowed; choose 1..1257"),
    ("pretrain.epochs=-3", "pretrain.epochs=-3 is not allowed; choose a positive integer"),
    ("method.lr=-0.01", "method.lr=-0.01 is not allowed; choose a finite value > 0"),
    ("method.mode=sometimes", "method.mode=sometimes Invalid value 'sometimes', expected one of [minibatch, fullbatch]"),
    ("+attacks/suite@attacks.suite.magic=magic", "unknown attack 'magic'; choose one of: apgd, fgsm, gaussian, pgd"),
    ("+attack@attacks.suite.magic=magic", "unknown attack 'magic'; choose one of: apgd, fgsm, gaussian, pgd"),  # earlier spelling
    ("attacks.suite.gaussian=null attacks.suite.apgd=null", "attacks.suite has no attack"),
    ("attacks.names=[gaussian]", "attacks.names is no longer a setting; use attacks.suite (each attack a conf/attack"),
    ("attacks.gammas=[2,-1]", "attacks.gammas=-1.0 is not allowed; choose a finite value > 0"),
    ("method.thetta=0.5", ("Could not override 'method.thetta'. Key 'thetta' not in 'ParetoSchema'; did you mean "
                           "'method.theta'?")),
    ("mehtod.early_stoping.patience=3", "did you mean 'method.early_stoping.patience'?"),  # the first wrong part
    ("method.early_stoping.patience=3", "did you mean 'method.early_stopping.patience'?"),
    ("method.zzzzzz=1", "Key 'zzzzzz' not in 'ParetoSchema' (see `--cfg job` for every setting)"),  # nothing close
    ("threads=0", "threads=0 is not allowed; choose auto or a positive integer"),
    ("license=MIT/../x", "license=MIT/../x is not allowed; choose a licence id of lower-case letters"),
    ("attacks=strongest", "unknown attacks 'strongest'; choose one of: adaptive, paper"),
    ("attacks.robust_gamma=3", "attacks.robust_gamma=3 is not allowed; choose one of attacks.gammas: 1, 2, 5, 8"),
    ("method=pareto_robust method.adversarial.clean_weight=1",
     "method.adversarial.clean_weight=1 is not allowed; choose a value in [0, 1)"),
    ("data.split=random", "data.split=random Invalid value 'random', expected one of [official, paper]"),
    ("data.forget.source=holdout", "Invalid value 'holdout', expected one of [train, test, mixed]"),
    ("data.forget.source=test pretrain.absorb_epochs=0", "pretrain.absorb_epochs=0 is not allowed"),
    ("trainer.devices=1000", "trainer.devices=1000 is not allowed; choose 1.."),  # before any process starts
    ("trainer.devices=0", "trainer.devices=0 is not allowed; choose 1.."),
    ("trainer.devices=[0,0]", "trainer.devices=[0, 0] is not allowed; list distinct device indices"),
    ("seed=-1", "seed=-1 is not allowed; choose an integer in [0, 4294967295]"),
    ("seed=100000000000000000000", "seed=100000000000000000000 is not allowed"),
    ("data.forget.near_copies=maybe", "Invalid value 'maybe', expected one of [refuse, match, outside]"),
    ("+trainer.foo=1", "trainer.foo is not a setting of Lightning's Trainer; allowed: accelerator,"),
    ("hydra.run.dir=/", "output folder '/' is the file system's root"),
    ("hydra.run.dir=" + "x" * 300, "has a name longer than the file system allows"),
    ("paths.cache_dir=/etc/hostname/cache", ("paths.cache_dir='/etc/hostname/cache' cannot be written "
                                             "('/etc/hostname' is not a folder)")),
]


@pytest.mark.parametrize("override,message", BAD_INPUT)
def test_bad_input_fails_in_one_line_without_results(run_main, tmp_path, override, message):
    code, out, err, results = run_main(*override.split())
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err[-2000:]
    assert "Traceback" not in out + err and results is None
    assert not list((tmp_path / "out").glob("*.log"))  # no log file either


def test_a_second_run_into_a_run_folder_in_use_ends_in_one_line(run_main, tmp_path):
    from filelock import FileLock

    from ttp_lightning.core.files import RUN_LOCK

    (tmp_path / "out").mkdir(exist_ok=True)
    with FileLock(str(tmp_path / "out" / RUN_LOCK)):  # the first run, still writing there
        code, _, err, results = run_main()
        assert (tmp_path / "out" / RUN_LOCK).exists()  # the refused run leaves the holder's lock file alone
    assert code == 2 and results is None
    expected = (f"error: run folder {str(tmp_path / 'out')!r} is in use by another run (it holds {RUN_LOCK}); wait "
                "for it to end, or give this run its own folder (hydra.run.dir=...)")
    assert err.strip().splitlines() == [expected]


def test_bad_input_through_a_real_process_is_one_line_and_exit_2(run_cli, tmp_path):
    proc, results = run_cli("method.theta=1.5")
    assert proc.returncode == 2 and results is None
    assert proc.stderr.strip().splitlines() == ["error: method.theta=1.5 is not allowed; choose a value in [0, 1]"]


def test_out_of_range_forget_index_and_missing_data(run_main, tmp_path):
    index_file = tmp_path / "forget.txt"
    index_file.write_text("1 2 99999")
    code, _, err, results = run_main(f"data.forget.indices_file={index_file}")
    assert code == 2 and "forget index 99999 out of range; allowed 0..1257" in err
    code, _, err, results = run_main("data=mnist", f"data.root={tmp_path / 'empty'}")
    assert code == 2 and results is None
    assert f"data set 'mnist' not found under {tmp_path / 'empty'}" in err


def test_help_and_cfg_job():
    env = dict(os.environ, WANDB_MODE="disabled")
    helped = subprocess.run([sys.executable, "-m", "ttp_lightning", "--help"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: python -m ttp_lightning")
    # usage and examples first, the groups, no composed config (--cfg job shows it), one screen or so
    lines = helped.stdout.splitlines()
    assert len(lines) <= 80 and "Composed config" not in helped.stdout and "experiment_name:" not in helped.stdout
    examples = next(i for i, line in enumerate(lines) if line.startswith("Examples"))
    assert examples < next(i for i, line in enumerate(lines) if line.startswith("method: "))
    assert max(len(line) for line in lines) <= 100  # a 100-column terminal, Hydra's group lines folded
    unfolded = " ".join(line.strip() for line in lines)
    for word in ("experiment:", "mnist_mlp", "method:", "pareto, pareto_robust, retrain", "ddp_sim",
                 "attacks: adaptive, paper"):
        assert word in unfolded
    job = subprocess.run([sys.executable, "-m", "ttp_lightning", "+experiment=mnist_mlp", "--cfg", "job"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert job.returncode == 0 and "experiment_name: mnist_mlp" in job.stdout and "patience: 20" in job.stdout
    assert Path(REPO, "conf").resolve() == Path(REPO, "src", "ttp_lightning", "conf").resolve()


def test_a_method_is_one_module_plus_one_yaml(run_main, tmp_path, monkeypatch):
    """A toy method outside the package: its class in one module, its YAML in a config folder on Hydra's
    search path; `method=toy` picks it up with no other file touched, and its own check runs."""
    (tmp_path / "toy_method.py").write_text(
        "import copy\n"
        "import torch\n"
        "from ttp_lightning.core.errors import TTPUserError\n"
        "from ttp_lightning.methods import Method, MethodOutput\n\n"
        "class Shrink(Method):\n"
        "    def check(self, cfg):\n"
        "        if not 0 < self.settings.factor <= 1:\n"
        "            raise TTPUserError(f'method.factor={self.settings.factor} is not allowed; choose a value in (0, 1]')\n\n"
        "    def run(self, ctx, pretrained, datamodule, make_net):\n"
        "        net = copy.deepcopy(pretrained)\n"
        "        with torch.no_grad():\n"
        "            for param in net.parameters():\n"
        "                param.mul_(self.settings.factor)\n"
        "        return MethodOutput(net, {'factor': self.settings.factor})\n")
    (tmp_path / "conf" / "method").mkdir(parents=True)
    (tmp_path / "conf" / "method" / "toy.yaml").write_text(
        "_target_: toy_method.Shrink\nname: toy\nfactor: 0.1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    search = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    code, _, err, results = run_main("method=toy", search, "attacks.enabled=false", *TINY_WITHOUT_METHOD, tiny=False)
    assert code == 0, err[-2000:]
    assert results["method"] == "toy" and results["metrics"]["toy"]["factor"] == 0.1
    assert results["metrics"]["toy"]["forget_conf_dist"] < results["metrics"]["pretrain"]["forget_conf_dist"]
    code, _, err, results = run_main("method=toy", search, "method.factor=2", *TINY_WITHOUT_METHOD, tiny=False)
    assert code == 2 and err.strip().splitlines()[-1] == "error: method.factor=2 is not allowed; choose a value in (0, 1]"
