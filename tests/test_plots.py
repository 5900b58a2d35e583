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


def drawn_figures(monkeypatch, draw, *args):
    """Run a figure function and return the matplotlib figure it drew (its objects, not its pixels)."""
    import matplotlib.figure

    captured = []
    with monkeypatch.context() as patch:
        patch.setattr(matplotlib.figure.Figure, "savefig", lambda figure, *a, **k: captured.append(figure))
        assert draw(*args)
    return captured[0]


def legend_texts(figure) -> set[str]:
    texts = {t.get_text() for axis in figure.axes if axis.get_legend() for t in axis.get_legend().get_texts()}
    return texts | {t.get_text() for legend in figure.legends for t in legend.get_texts()}


def test_figures_label_their_axes_legends_and_settings(monkeypatch, tmp_path):
    from ttp_lightning.reporting import plots

    one = full_results(0.75, 0.03)
    one["metrics"]["pareto"]["best_epoch"] = 2
    dynamics = drawn_figures(monkeypatch, plots.dynamics, [one], tmp_path / "d.png")
    assert all(axis.get_ylabel() and axis.get_xlabel() for axis in dynamics.axes)
    assert "restored epoch 2 (the released weights)" in legend_texts(dynamics)
    assert any(line.get_xdata()[0] == 2 and line.get_linestyle() == ":" for line in dynamics.axes[0].lines)
    assert dynamics.axes[0].get_ylim()[0] == 0 and dynamics.axes[0].get_ylim()[1] >= 1  # fixed 0-100 %
    assert "theta = 0.75" in dynamics._suptitle.get_text()

    softmax = drawn_figures(monkeypatch, plots.softmax_bars, [one], tmp_path / "s.png")
    assert {"true class", "uniform 1/K (the target)"} <= legend_texts(softmax)
    ticks = [t.get_text() for t in softmax.axes[0].get_xticklabels()]
    assert ticks == ["0", "1", "2"]  # integer classes, not 0.0 / 2.5
    assert softmax.axes[-1].get_xlabel() == "class" and softmax.axes[0].get_ylabel() == "softmax probability"
    assert softmax.axes[len(softmax.axes) // 2].get_title().startswith("Alg 1:")

    attacks = drawn_figures(monkeypatch, plots.attack_curves, [one], tmp_path / "a.png")
    assert {"pretrained", "Alg 1"} <= legend_texts(attacks) and "pareto" not in legend_texts(attacks)

    sweep = [full_results(theta, 0.3 / theta) for theta in (0.25, 0.5, 0.75)]
    for index, results in enumerate(sweep):
        results["metrics"]["pretrain"] = {"retain_acc": 1.0, "test_acc": 0.98, "forget_conf_dist": 0.6}
        results["metrics"]["pareto"].update(retain_acc=1.0 - 0.0004 * index)
    frontier = drawn_figures(monkeypatch, plots.frontier, sweep, tmp_path / "f.png")
    assert frontier.axes[0].get_ylim()[0] == 0  # 1.0000 -> 0.9992 does not look like a cliff
    assert "pretrained model" in legend_texts(frontier) and "3 runs, every one shown" in frontier._suptitle.get_text()
    dynamics = drawn_figures(monkeypatch, plots.dynamics, sweep, tmp_path / "d2.png")
    assert {"theta = 0.25", "theta = 0.5", "theta = 0.75"} <= legend_texts(dynamics)  # every job
    softmax = drawn_figures(monkeypatch, plots.softmax_bars, sweep, tmp_path / "s2.png")
    assert "run 1 of 3 shown (theta = 0.25)" in softmax._suptitle.get_text()  # says which one


def test_a_certified_sweep_with_two_reductions_draws_the_worst_image_figure(monkeypatch, tmp_path):
    from test_tables import certified_results
    from ttp_lightning.reporting import plots

    runs = [certified_results(t, w, r) for r, points in (("mean", ((0.25, 0.58), (0.5, 0.3))),
                                                       ("smoothmax", ((0.25, 0.09), (0.5, 0.05))))
            for t, w in points]
    figure = drawn_figures(monkeypatch, plots.worst_image_curves, runs, tmp_path / "w.png")
    axis = figure.axes[0]
    assert legend_texts(figure) == {"forget reduction: mean", "forget reduction: smoothmax T=0.008",
                                    "pretrained model", "release gate: every image <= 0.1"}
    assert "worst forget image" in axis.get_xlabel() and "test set" in axis.get_ylabel()
    assert sorted(line.get_xdata()[0] for line in axis.get_lines()[:2]) == [0.09, 0.58]
    assert not plots.worst_image_curves(runs[:1], tmp_path / "none.png")  # one theta: no curve to draw
