"""PNG figures from results files: frontier over theta, dynamics, softmax bars, attack curves."""

import json

from test_tables import fake_results
from ttp_lightning.reporting.plots import main
from ttp_lightning.reporting.tables import main as tables_main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def full_results(theta: float, forget_cd: float) -> dict:
    results = fake_results(theta, forget_cd, "pareto")
    results["history"] = {"pareto": [{"epoch": e, "retain_acc": 0.9, "test_acc": 0.88, "forget_acc": 0.5,
                                      "forget_conf_dist": 0.5 / e, "test_conf_dist": 0.8} for e in (1, 2, 3)]}
    results["forget_softmax"] = {stage: [{"label": 1, "softmax": [0.1, 0.8, 0.1]}] * 5
                                 for stage in ("pretrain", "pareto")}
    results["attacks"] = {stage: {"none": {"0": {"forget_conf_dist": 0.1, "forget_acc": 0.2}},
                                  "worst": {g: {"forget_conf_dist": 0.1 * float(g), "forget_acc": 0.2} for g in ("2", "8")},
                                  "apgd": {g: {"forget_conf_dist": 0.1 * float(g), "forget_acc": 0.2} for g in ("2", "8")}}
                          for stage in ("pretrain", "pareto")}
    return results


def test_sweep_folder_gives_all_four_figures(tmp_path, capsys):
    for job, theta in enumerate((0.25, 0.5, 0.75)):
        (tmp_path / "sweep" / str(job)).mkdir(parents=True)
        (tmp_path / "sweep" / str(job) / "results.json").write_text(json.dumps(full_results(theta, 0.3 / theta)))
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "png")]) == 0
    for name in ("frontier", "dynamics", "softmax", "attacks"):
        assert (tmp_path / "png" / f"{name}.png").read_bytes()[:8] == PNG_MAGIC, name
    assert "frontier.png" in capsys.readouterr().out


def test_forget_size_sweep_gives_its_figure_and_no_frontier(tmp_path, capsys):
    for size in (100, 1000, 5000):
        results = full_results(0.75, 0.03)
        results["data"] = {"forget_size": size, "forget_from_test": 0}
        (tmp_path / str(size)).mkdir()
        (tmp_path / str(size) / "results.json").write_text(json.dumps(results))
    assert main([str(tmp_path), "--out", str(tmp_path / "png")]) == 0
    assert (tmp_path / "png" / "forget_size.png").read_bytes()[:8] == PNG_MAGIC
    assert not (tmp_path / "png" / "frontier.png").exists()  # one theta only


def test_single_result_has_no_frontier(tmp_path, capsys):
    (tmp_path / "results.json").write_text(json.dumps(full_results(0.75, 0.03)))
    assert main([str(tmp_path / "results.json"), "--out", str(tmp_path / "png")]) == 0
    assert not (tmp_path / "png" / "frontier.png").exists() and (tmp_path / "png" / "softmax.png").exists()
    assert main([str(tmp_path / "missing"), "--out", str(tmp_path / "png")]) == 2


def test_wandb_flag_logs_figures_and_tables_to_an_offline_summary_run(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    for job, theta in enumerate((0.25, 0.75)):
        (tmp_path / "sweep" / str(job)).mkdir(parents=True)
        (tmp_path / "sweep" / str(job) / "results.json").write_text(json.dumps(full_results(theta, 0.1)))
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "png"), "--wandb"]) == 0
    (run,) = (tmp_path / "png" / "wandb").glob("offline-run-*")
    images = {p.name.split("_")[0] for p in (run / "files" / "media" / "images" / "figures").glob("*.png")}
    assert images == {"frontier", "dynamics", "softmax", "attacks"}
    assert tables_main([str(tmp_path / "sweep"), "--out", str(tmp_path / "md" / "t.md"), "--wandb"]) == 0
    (run,) = (tmp_path / "md" / "wandb").glob("offline-run-*")
    assert list((run / "files" / "media" / "table" / "tables").glob("*.table.json"))
