"""Issue 14: sweeps through Hydra's submitit launcher. The SLURM config turns the trainer's layout into the
job's resources (rendered by submitit itself into the sbatch script, with a stand-in `srun` on PATH since
there is no cluster here); the local config runs a real theta sweep as parallel submitit jobs, which share
one pretraining through the cache's file lock."""

import json
import os

import pytest

from conftest import CONF_DIR


def sbatch_text(cfg, tmp_path, monkeypatch) -> str:
    import submitit
    from hydra.utils import instantiate
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nexit 0\n")
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    params = dict(instantiate(cfg.hydra.launcher).params)  # the plugin's SlurmLauncher, as Hydra builds it
    assert type(instantiate(cfg.hydra.launcher)).__name__ == "SlurmLauncher"
    # what SlurmLauncher.launch passes to submitit (its own mapping of plugin keys to executor keys)
    executor = submitit.AutoExecutor(cluster="slurm", folder=params.pop("submitit_folder"),
                                     slurm_max_num_timeout=params.pop("max_num_timeout"))
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
    return executor._executor._make_submission_file_text("python -m ttp_lightning", "0")


def test_slurm_launcher_takes_gpus_tasks_and_nodes_from_the_trainer(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir

    monkeypatch.setenv("TTP_SLURM_PARTITION", "gpu")
    monkeypatch.setenv("TTP_SLURM_TIMEOUT_MIN", "600")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="main", return_hydra_config=True, overrides=[
            "hydra/launcher=submitit_slurm", "experiment=cifar100_resnet50", "trainer=ddp", "trainer.devices=4",
            "trainer.num_nodes=2", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.job.name=ttp",
            "hydra.launcher.account=lab"])
    text = sbatch_text(cfg, tmp_path, monkeypatch)
    for line in ("--gpus-per-node=4", "--ntasks-per-node=4", "--nodes=2", "--partition=gpu", "--time=600",
                 "--account=lab", "--cpus-per-task=8", "--job-name=ttp"):
        assert f"#SBATCH {line}\n" in text, line


@pytest.mark.parametrize("launcher", ["submitit_local", "submitit_slurm"])
def test_launcher_configs_name_the_plugin_classes(launcher):
    from hydra_plugins.hydra_submitit_launcher import submitit_launcher
    from omegaconf import OmegaConf

    target = OmegaConf.load(CONF_DIR / "hydra" / "launcher" / f"{launcher}.yaml")._target_
    module, _, name = target.rpartition(".")
    assert module == submitit_launcher.__name__ and hasattr(submitit_launcher, name)


def test_submitit_local_theta_sweep_runs_both_jobs_and_pretrains_once(run_cli, tmp_path):
    proc, _ = run_cli("hydra/launcher=submitit_local", "method.theta=0.25,0.75", "attacks.enabled=false",
                      multirun=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [json.loads((tmp_path / "out" / str(i) / "results.json").read_text()) for i in (0, 1)]
    assert sorted(r["config"]["method"]["theta"] for r in runs) == [0.25, 0.75]
    assert sorted(r["metrics"]["pretrain"]["cached"] for r in runs) == [False, True]  # ran together, trained once
    assert len(list((tmp_path / "out" / ".submitit").glob("*/*_result.pkl"))) == 2  # both went through submitit
    assert runs[0]["metrics"]["pareto"]["forget_conf_dist"] != runs[1]["metrics"]["pareto"]["forget_conf_dist"]


def test_a_submitit_launcher_without_the_plugin_is_one_error_line(monkeypatch):
    import builtins

    from ttp_lightning.config.choices import check_launcher
    from ttp_lightning.core.errors import TTPUserError

    real_import = builtins.__import__

    def no_plugin(name, *args, **kwargs):
        if name.startswith("hydra_plugins.hydra_submitit_launcher"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_plugin)
    with pytest.raises(TTPUserError, match=r"pip install -e '\.\[slurm\]'"):
        check_launcher(["-m", "hydra/launcher=submitit_slurm", "method.theta=0.25,0.75"])
    check_launcher(["-m", "method.theta=0.25,0.75"])  # the basic launcher needs nothing
