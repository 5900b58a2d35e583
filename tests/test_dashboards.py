"""Issue 15: what a wandb dashboard (and the CSV logger) gets from a run and from a sweep, read back from
the offline files with wandb's own reader (`wandb leet inspect`), as the wandb app would read them."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import REPO, TINY, finished

WANDB = Path(sys.executable).with_name("wandb")


def inspect_run(wandb_file: Path) -> dict:
    """The run record (name, group, job type) and the --summary view (config, summary, state) of one run."""
    records = subprocess.run([str(WANDB), "leet", "inspect", "--json", str(wandb_file)], capture_output=True,
                             text=True, check=True, timeout=120).stdout
    run = next(json.loads(line)["run"] for line in records.splitlines() if json.loads(line)["type"] == "run")
    summary = json.loads(subprocess.run([str(WANDB), "leet", "inspect", "--summary", "--json", str(wandb_file)],
                                        capture_output=True, text=True, check=True, timeout=120).stdout)
    history = [json.loads(line) for line in records.splitlines() if json.loads(line)["type"] == "history"]
    return {"run": run, "view": summary, "history": history}


def test_a_theta_sweep_gives_wandb_runs_a_dashboard_can_slice(tmp_path):
    """Also the sweep's own contract: every job runs, A(D) is trained once, exit 4 names unprotected jobs."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    env.update(WANDB_MODE="offline", TTP_CACHE_DIR=str(tmp_path / "cache"))
    overrides = [o for o in TINY if not o.startswith("logger=")] + ["method.epochs=3", "attacks.enabled=false"]
    sweep = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "-m", "ttp_lightning", "-m", *overrides, "method.theta=0.25,0.75",
                           f"hydra.sweep.dir={sweep}"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    jobs = [json.loads((sweep / job / "results.json").read_text()) for job in ("0", "1")]
    failed = [str(sweep / job) for job, r in zip(("0", "1"), jobs, strict=True) if not r["release_gate"]["passed"]]
    assert proc.returncode == (4 if failed else 0), proc.stderr[-3000:]  # a sweep runs every job first
    if failed:  # then names the jobs whose release gate failed, in one line
        assert proc.stderr.strip().splitlines()[-1] == (f"error: {len(failed)} job(s) of the sweep are not protected: "
                                                        + ", ".join(failed))
    # the sweep trains A(D) once: the second job reads it from the cache
    assert [r["config"]["method"]["theta"] for r in jobs] == [0.25, 0.75]
    assert [r["metrics"]["pretrain"]["cached"] for r in jobs] == [False, True]
    assert jobs[0]["metrics"]["pretrain"]["forget_conf_dist"] == jobs[1]["metrics"]["pretrain"]["forget_conf_dist"]
    runs = {}
    for job in ("0", "1"):
        (wandb_file,) = (sweep / job / "wandb").glob("offline-run-*/run-*.wandb")
        results = json.loads((sweep / job / "results.json").read_text())
        runs[job] = (inspect_run(wandb_file), results)
    thetas = set()
    for run, results in runs.values():
        config, summary = run["view"]["config"], run["view"]["summary"]
        theta = config["method.theta"]
        thetas.add(theta)
        assert config["data.forget.size"] == 20 and config["data.name"] == "digits" and config["method.name"] == "pareto"
        assert run["run"]["display_name"] == f"digits_mlp-pareto-theta={theta:g}" == results["run"]["name"]
        assert run["run"]["job_type"] == "pareto" and run["view"]["state"] == "finished"
        # final metrics are the summary, equal to results.json, and never a one-point chart
        for key in ("forget_conf_dist", "test_acc", "retain_acc"):
            assert summary[f"final/pareto/{key}"] == results["metrics"]["pareto"][key]
        assert not any(key.startswith("final/") for row in run["history"] for key in _history_keys(row))
        assert results["run"]["swept"] == {"method.theta": theta}
    assert thetas == {0.25, 0.75}
    groups = {run["run"]["run_group"] for run, _ in runs.values()}
    assert groups == {str(sweep)} and {r["run"]["group"] for _, r in runs.values()} == groups
    # the sweep-level summary run joins the same group
    tables = subprocess.run([sys.executable, "-m", "ttp_lightning.tables", str(sweep), "--wandb", "--out",
                             str(tmp_path / "frontier.md")], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300, check=False)
    assert tables.returncode == 0, tables.stderr[-2000:]
    (summary_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    summary_run = inspect_run(summary_file)["run"]
    assert summary_run["run_group"] == str(sweep) and summary_run["job_type"] == "summary"


def _history_keys(row: dict) -> list[str]:
    return list(row["history"].get("item", {}))


def test_the_csv_logger_writes_the_flat_config_as_hyperparameters(run_job, tmp_path):
    proc, results = run_job("logger=csv", "method.epochs=2", "attacks.enabled=false")
    finished(proc.returncode, results, proc.stderr)
    (hparams,) = (tmp_path / "out" / "csv").glob("*/hparams.yaml")
    values = yaml.safe_load(hparams.read_text())
    assert values["method.theta"] == 0.75 and values["data.forget.size"] == 20 and values["model.hidden_dim"] == 100
    assert results["run"] == {"name": "digits_mlp-pareto-theta=0.75", "group": "digits_mlp", "job_type": "pareto",
                              "swept": {}}  # a single run's group: its experiment


def _table(run_dir: Path, name: str) -> dict:
    """A logged wandb table as written into the offline run's files (columns, data)."""
    (path,) = [p for p in (run_dir / "files" / "media" / "table" / "tables").glob(f"{name}_*.table.json")
               if re.fullmatch(rf"{name}_\d+_[0-9a-f]+\.table\.json", p.name)]
    return json.loads(path.read_text())


def test_a_default_job_gives_a_dashboard_numbers_phases_the_released_epoch_the_gate_and_the_release(tmp_path):
    """Issue 63: decoded from the offline files as the wandb app reads them. Tables hold numbers (not "98.14%"),
    pretraining and the floor's retraining have their own step axes instead of one restarting train/loss, the
    summary holds the released epoch's values and the gate's verdict, and the release folder is an artifact."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    env.update(WANDB_MODE="offline", TTP_CACHE_DIR=str(tmp_path / "cache"))
    overrides = [o for o in TINY if not o.startswith(("logger=", "attacks.relearn.floor"))]
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "ttp_lightning", *overrides, "method.epochs=30",
                           "attacks.relearn.floor=true", "attacks.gammas=[2]", "attacks.robust_gamma=2",
                           f"hydra.run.dir={out}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    results = json.loads((out / "results.json").read_text())
    finished(proc.returncode, results, proc.stderr)
    (run_dir,) = (out / "wandb").glob("offline-run-*")
    (wandb_file,) = run_dir.glob("run-*.wandb")
    run = inspect_run(wandb_file)
    assert run["run"]["run_group"] == results["experiment"]  # a single run is grouped by its experiment
    for name in ("metrics", "per_image", "forget_images", "attacks", "relearn", "relearn_floor"):
        table = _table(run_dir, name)
        cells = [cell for row in table["data"] for cell in row[1:]]
        assert cells and all(cell is None or isinstance(cell, (int, float)) for cell in cells
                             if not (name == "relearn" or name == "relearn_floor") or not isinstance(cell, str)), name
    metrics = _table(run_dir, "metrics")
    row = dict(zip(metrics["columns"], metrics["data"][1], strict=True))
    assert row["stage"] == "pareto" and row["test_acc"] == results["metrics"]["pareto"]["test_acc"]
    # one step axis per phase: pretraining and the floor's retraining no longer share train/loss
    keys = {key for item in run["history"] for key in _history_keys(item)}
    assert {"pretrain/train/loss", "pretrain/step", "floor/train/loss", "floor/step", "alg1/step"} <= keys
    assert "train/loss" not in keys
    # the summary: the released epoch, not the last one logged
    summary, method = run["view"]["summary"], results["metrics"]["pareto"]
    kept = results["history"]["pareto"][method["best_epoch"] - 1]
    assert summary["epoch"] == method["best_epoch"] and summary["val/forget_conf_dist"] == kept["forget_conf_dist"]
    assert summary["gate/passed"] is results["release_gate"]["passed"]
    assert summary["gate/folder"] == results["release_gate"]["folder"]
    assert summary["gate/failing_images"] == [str(i) for i in results["release_gate"]["failing_images"]]
    # the release folder, as a model artifact
    records = subprocess.run([str(WANDB), "leet", "inspect", "--json", str(wandb_file)], capture_output=True,
                             text=True, check=True, timeout=120).stdout
    artifacts = [json.loads(line)["artifact"] for line in records.splitlines() if json.loads(line)["type"] == "artifact"]
    model = [a for a in artifacts if a.get("type") == "model"]
    assert len(model) == 1 and model[0]["name"] == f"{results['run']['name'].replace('=', '_')}-{results['release_gate']['folder']}"
    files = {entry["path"] for entry in model[0]["manifest"]["contents"]}
    assert {"model.safetensors", "config.json", "README.md"} <= files


def test_the_summary_holds_the_released_epoch_not_the_last_one_and_the_gate_in_full():
    from ttp_lightning.reporting.wandb_charts import released_summary

    history = [{"epoch": n, "elapsed_s": n, "forget_conf_dist": cd, "test_acc": 0.9} for n, cd in
               ((1, 0.5), (2, 0.0076), (3, 0.026))]
    results = {"method": "pareto", "metrics": {"pareto": {"best_epoch": 2}}, "history": {"pareto": history},
               "release_gate": {"passed": False, "folder": "release_not_protected", "failing_images": ["train:3", 7],
                                "reasons": ["2 of 20 images above 0.1", "below the radius"]}}
    summary = released_summary(results)
    assert summary["epoch"] == 2 and summary["val/forget_conf_dist"] == 0.0076 and "val/elapsed_s" not in summary
    assert summary["gate/passed"] is False and summary["gate/failing_images"] == ["train:3", "7"]
    assert summary["gate/reasons"] == "2 of 20 images above 0.1; below the radius"
    results["metrics"]["pareto"]["best_epoch"] = None  # a method without epochs: no epoch claimed
    assert "epoch" not in released_summary(results)
