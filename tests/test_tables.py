"""Markdown frontier tables from results files (the layout of the paper's Pareto-frontier tables)."""

import json

from omegaconf import OmegaConf

from conftest import CONF_DIR
from ttp_lightning.reporting.tables import main, method_label

LABELS = {path.stem: OmegaConf.load(path).get("label") for path in (CONF_DIR / "method").glob("*.yaml")}


def fake_results(theta: float, forget_cd: float, method: str = "certified_exact") -> dict:
    metrics = {"retain_acc": 0.9, "test_acc": 0.88, "forget_conf_dist": forget_cd}
    return {"method": method, "metrics": {"pretrain": {"retain_acc": 0.93, "test_acc": 0.92, "forget_conf_dist": 0.7},
                                          method: metrics},
            "config": {"data": {"name": "mnist"}, "model": {"_target_": "ttp_lightning.models.components.linear.LogReg"},
                       "method": {"name": method, "label": LABELS.get(method), "theta": theta}}}


def test_a_method_is_labelled_by_its_yaml_and_else_by_its_name():
    assert method_label(fake_results(0.5, 0.1, "certified_exact")) == "Cert. (Alg 2)"
    assert method_label(fake_results(0.5, 0.1, "pareto"), "pretrain") == "pretrain"
    unlabelled = fake_results(0.5, 0.1, "my_method")
    assert method_label(unlabelled) == "my_method"


def test_sweep_folder_becomes_one_table_sorted_by_theta(tmp_path, capsys):
    for job, (theta, cd) in enumerate([(0.75, 0.28), (0.125, 0.57), (0.5, 0.3)]):
        (tmp_path / "sweep" / str(job)).mkdir(parents=True)
        (tmp_path / "sweep" / str(job) / "results.json").write_text(json.dumps(fake_results(theta, cd)))
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "table.md")]) == 0
    lines = (tmp_path / "table.md").read_text().splitlines()
    assert lines[0] == "### mnist: Cert. (Alg 2) LogReg"
    assert lines[4] == "| pretrained LogReg | - | 93.0% | 92.0% | 0.700 |"
    assert [line.split(" | ")[1] for line in lines[5:]] == ["0.125", "0.500", "0.750"]
    assert lines[-1] == "| Cert. (Alg 2) LogReg | 0.750 | 90.0% | 88.0% | 0.280 |"
    assert capsys.readouterr().out.splitlines() == lines


def test_methods_get_their_own_tables_and_missing_input_is_an_error(tmp_path, capsys):
    (tmp_path / "a.json").write_text(json.dumps(fake_results(0.75, 0.03, "pareto")))
    (tmp_path / "b.json").write_text(json.dumps(fake_results(0.75, 0.2)))
    assert main([str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "### mnist: Alg 1 LogReg" in out and "### mnist: Cert. (Alg 2) LogReg" in out
    assert main([str(tmp_path / "empty")]) == 2 and "neither a results.json nor a folder" in capsys.readouterr().err


def test_main_layout_has_one_row_per_method_in_the_paper_order(tmp_path, capsys):
    for method, cd in (("pareto", 0.03), ("retrain", 0.88), ("synthetic", 0.01)):
        results = fake_results(0.75, cd, method)
        results["metrics"][method].update(retain_conf_dist=0.8, test_conf_dist=0.79)
        if method == "pareto":
            results["metrics"][method]["forget_robust_conf_dist"] = 0.61
        results["metrics"]["pretrain"].update(retain_conf_dist=0.9, test_conf_dist=0.88)
        (tmp_path / f"{method}.json").write_text(json.dumps(results))
    assert main([str(tmp_path / f"{m}.json") for m in ("pareto", "retrain", "synthetic")] + ["--layout", "main"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "### mnist, LogReg"
    assert [line.split(" | ")[0] for line in lines[4:]] == ["| Pretrain", "| Retrain", "| Synthetic", "| Alg 1"]
    assert lines[-1] == "| Alg 1 | 90.0% | 88.0% | 0.030 | 0.610 | 0.800 | 0.790 |"  # robust CD after forget CD
    assert lines[-2].split(" | ")[4] == "-"  # no attacks run for that method


def test_forget_layout_groups_rows_by_forget_set(tmp_path, capsys):
    for name, size, from_test, cd in (("big", 5000, 0, 0.4), ("small", 100, 0, 0.03), ("outside", 100, 20, 0.15)):
        results = fake_results(0.75, cd, "pareto")
        results["data"] = {"forget_size": size, "forget_from_test": from_test}
        if from_test:
            results["metrics"] = {"pretrain_original": {"retain_acc": 0.93, "test_acc": 0.92, "forget_conf_dist": 0.6},
                                  **results["metrics"]}
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(results))
    assert main([str(tmp_path), "--layout", "forget"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "### mnist: Alg 1 LogReg, by forget set"
    assert [line.split(" | ")[:3] for line in lines[4:]] == [
        ["| 100", "0", "Pretrain"], ["| 100", "0", "Alg 1"], ["| 5000", "0", "Pretrain"], ["| 5000", "0", "Alg 1"],
        ["| 100", "20", "Pretrain (D_f unseen)"], ["| 100", "20", "Pretrain"], ["| 100", "20", "Alg 1"]]
    assert lines[-1] == "| 100 | 20 | Alg 1 | 90.0% | 88.0% | 0.150 |"


def test_frontier_rows_can_follow_another_swept_key(tmp_path, capsys):
    for k in (500, 5, 25):
        results = fake_results(0.75, 1.0 / k, "synthetic")
        results["config"]["method"]["k"] = k
        (tmp_path / str(k)).mkdir()
        (tmp_path / str(k) / "results.json").write_text(json.dumps(results))
    assert main([str(tmp_path), "--by", "method.k"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| Model | k | Retain Acc. | Test Acc. | Conf. Dist. (lower better) |"
    assert [line.split(" | ")[1] for line in lines[5:]] == ["5", "25", "500"]


def certified_results(theta: float, worst: float, reduction: str = "mean", exposed: int = 0) -> dict:
    results = fake_results(theta, worst / 2)
    results["metrics"]["certified_exact"].update(test_conf_dist=0.6, forget_worst_conf_dist=worst,
                                                 forget_exposed=exposed, sensitivity=5.8e-7, sigma=2.2e-6, epsilon=1.0)
    results["metrics"]["pretrain"].update(test_conf_dist=0.7, forget_worst_conf_dist=0.9, forget_exposed=100)
    results["config"]["method"].update(forget_reduction=reduction, forget_cvar_fraction=0.2,
                                       forget_reduction_temperature=None if reduction == "mean" else 0.008)
    results["release_gate"] = {"passed": exposed == 0, "conf_dist_at_most": 0.1,
                               "failing_images": [f"train:{i}" for i in range(exposed)]}
    return results


def test_certified_layout_has_a_row_per_reduction_and_theta_with_the_gate(tmp_path, capsys):
    runs = [certified_results(0.5, 0.3, exposed=40), certified_results(0.25, 0.58, exposed=90),
            certified_results(0.25, 0.09, "smoothmax"), certified_results(0.5, 0.05, "smoothmax")]
    for job, results in enumerate(runs):
        (tmp_path / str(job)).mkdir()
        (tmp_path / str(job) / "results.json").write_text(json.dumps(results))
    assert main([str(tmp_path), "--layout", "certified"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "### mnist: Cert. (Alg 2) LogReg" and "Forget CD (worst)" in lines[2]
    rows = [line.split(" | ") for line in lines[4:]]
    assert [(r[0].lstrip("| "), r[1]) for r in rows] == [("pretrained", "-"), ("mean", "0.25"), ("mean", "0.5"),
                                                         ("smoothmax T=0.008", "0.25"), ("smoothmax T=0.008", "0.5")]
    assert rows[1][5:8] == ["0.580", "90", "refused (90 images)"] and rows[3][5:8] == ["0.090", "0", "released"]
    assert rows[3][8:] == ["5.8e-07", "2.2e-06", "1 |"]


def test_a_reduction_is_named_as_its_certificate_states_it_with_auto_resolved():
    from ttp_lightning.reporting.tables import reduction_of

    results = certified_results(0.25, 0.39, "smoothmax")
    results["config"]["method"]["forget_reduction_temperature"] = "auto"
    assert reduction_of(results) == "smoothmax T=auto"
    results["certificate"] = {"forget_reduction": {"name": "smoothmax", "temperature": 0.0079671, "fraction": None}}
    assert reduction_of(results) == "smoothmax T=0.008"


def test_results_of_the_earlier_format_are_read_in_the_current_words_and_said(tmp_path, capsys):
    """Issue 60: results.json /1 (no format key) said certified for the bound-based proof; the tables read it as
    proven and say on stderr that they did. A file naming one value by both words is refused."""
    from ttp_lightning.core.words import BothWords
    from ttp_lightning.reporting.tables import load_results

    old = fake_results(0.5, 0.1, "pareto_robust")
    old["metrics"]["pareto_robust"].update(forget_certified_worst_conf_dist=0.02, forget_certified_share_05=1.0)
    old["certified"] = {"pareto_robust": {"8": {"forget_certified_conf_dist": 0.01}}}
    old["release_gate"] = {"require": ["clean", "certified"], "min_certified_radius": None,
                           "unrequired_above": {"certified": 3}}
    old["config"]["method"]["early_stopping"] = {"select": "certified"}
    new = {**fake_results(0.25, 0.2, "pareto_robust"), "format": "ttp_lightning.results/2"}
    for name, document in (("old", old), ("new", new)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(document))
    read = load_results([tmp_path])
    assert "read 1 results.json of the earlier format ttp_lightning.results/1" in capsys.readouterr().err
    upgraded = next(r for r in read if r["format"] == "ttp_lightning.results/1")
    assert upgraded["metrics"]["pareto_robust"]["forget_proven_worst_conf_dist"] == 0.02
    assert upgraded["proven"]["pareto_robust"]["8"] == {"forget_proven_conf_dist": 0.01}
    assert upgraded["release_gate"] == {"require": ["clean", "proven"], "min_proven_radius": None,
                                        "unrequired_above": {"proven": 3}}
    assert upgraded["config"]["method"]["early_stopping"]["select"] == "proven"
    assert upgraded["method"] == "pareto_robust" and "certified_exact" not in json.dumps(upgraded)
    old["metrics"]["pareto_robust"]["forget_proven_worst_conf_dist"] = 0.5
    (tmp_path / "old" / "results.json").write_text(json.dumps(old))
    try:
        load_results([tmp_path / "old"])
    except BothWords as exc:
        assert "stated twice" in str(exc)
    else:
        raise AssertionError("a value named by both words was read")
