"""results.json writing (atomic) and the terminal table."""

import io
import json
import math
from pathlib import Path

import torch

from ttp_lightning.assess.protection import KINDS, bound_name, masking_note, unrequired_note
from ttp_lightning.attacks.suite import WORST
from ttp_lightning.certified.certificate.arithmetic import is_vacuous
from ttp_lightning.core.console import table, wrapped
from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.core.files import atomic_text, atomic_write

COLUMNS = [("retain_acc", "retain acc", "{:.2%}"), ("test_acc", "test acc", "{:.2%}"),
           ("forget_acc", "forget acc", "{:.2%}"), ("forget_conf_dist", "forget CD", "{:.4f}"),
           ("forget_robust_conf_dist", "robust CD", "{:.4f}"),
           ("test_conf_dist", "test CD", "{:.4f}"), ("forget_l2_dist", "forget l2", "{:.4f}"),
           ("forget_nn_conf_dist", "NN CD", "{:.4f}"),
           ("wall_s", "wall s", "{:.1f}")]


WEIGHTS_FILE = "model.pt"


def write_weights(net, output_dir: str | Path) -> Path:
    """The released model's state_dict as model.pt in `output_dir` (created; via a temporary file)."""
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()  # serialised in memory, so a failing write is the file system's OSError
    torch.save(net.state_dict(), buffer)
    return atomic_write(Path(output_dir) / WEIGHTS_FILE, lambda tmp: tmp.write_bytes(buffer.getvalue()))


def non_finite_keys(value, path: str = "") -> list[str]:
    """Dotted paths of every NaN or infinite number inside `value` (dicts, lists, numbers)."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [path or "<top>"]
    if isinstance(value, dict):
        return [bad for key, item in value.items() for bad in non_finite_keys(item, f"{path}.{key}" if path else key)]
    if isinstance(value, (list, tuple)):
        return [bad for i, item in enumerate(value) for bad in non_finite_keys(item, f"{path}[{i}]")]
    return []


def write_results(results: dict, output_dir: str | Path) -> Path:
    """Write results.json via a temporary file and rename, so a crash never leaves half a file. Strict
    JSON: a NaN or infinite value is an error naming where it is, and nothing is written."""
    bad = non_finite_keys(results)
    if bad:
        raise TTPUserError(f"non-finite values in the results ({', '.join(bad[:5])}); nothing was written")
    return atomic_text(Path(output_dir) / "results.json", json.dumps(results, indent=2, allow_nan=False))


def metric_rows(metrics: dict[str, dict]) -> list[list[str]]:
    """Header, then one row per stage (pretrain, method): the paper's columns plus wall time."""
    rows = [["stage"] + [title for _, title, _ in COLUMNS]]
    for stage, values in metrics.items():
        row = [stage]
        for key, _, fmt in COLUMNS:
            value = values.get(key)
            row.append("-" if value is None else fmt.format(value))
        rows.append(row)
    return rows


def format_table(metrics: dict[str, dict]) -> str:
    return table(metric_rows(metrics))


def attack_scores(attacks: dict[str, dict], proven: dict[str, dict] | None = None) -> list[tuple]:
    """The attack table's content, walked once for the console's text table and wandb's numeric one: (attack, its
    radius as results.json keys it (None for the clean images), each stage's forget CD and accuracy in turn) per
    (attack, radius), then with `proven` ({stage: {gamma: summary}}) a `proven` row per radius every stage has:
    the mean of each image's proven bound, which no attack in that ball can exceed (its accuracy None)."""
    stages = list(attacks)
    rows = [(attack, None if attack == "none" else gamma,
             [value for stage in stages for value in (attacks[stage][attack][gamma]["forget_conf_dist"],
                                                      attacks[stage][attack][gamma]["forget_acc"])])
            for attack, by_gamma in attacks[stages[0]].items() for gamma in by_gamma]
    for gamma in attacks[stages[0]].get(WORST, {}) if proven else ():
        if all(gamma in proven.get(stage, {}) for stage in stages):
            rows.append(("proven", gamma, [value for stage in stages for value in
                                           (proven[stage][gamma]["forget_proven_conf_dist"], None)]))
    return rows


def format_certificate_line(certificate: dict, vacuous_above: float) -> str:
    """One line under the tables of a certified run: the budget, and whether it means anything."""
    steps = certificate["steps"]
    line = (f"certificate: epsilon={certificate['epsilon']:.4g}, delta={certificate['delta']:.3g}, "
            f"sigma={certificate['sigma']:.4g}, Delta={certificate['sensitivity']:.4g}")
    if certificate["bound"] == "residual":
        line += (f" (residual bound: mu={certificate['mu']:.4g}, ||r||={max(s['stationarity'] for s in steps):.3g}, "
                 f"nu={steps[-1]['multiplier']:.4g}; release = M_theta(D) + noise)")
    else:
        line += (f" (the paper's bound {certificate['sensitivity_formula']:.4g}, capped at 2C; lambda_min(H) "
                 f"measured {min(s['lam_min_measured'] for s in steps):.4g}, ||H||={certificate['hessian_norm']:.4g})")
    if is_vacuous(certificate["epsilon"], vacuous_above):
        line += f"\n  VACUOUS: epsilon > {vacuous_above:g}, so this certificate guarantees nothing meaningful"
    return line


def format_noise_free_line(noise_free: dict) -> str:
    """The noise-free model's scores for the provider's console and results.json only: they are computed from
    private weights without noise, so they never go into release/ (model card, certificate)."""
    return (f"  noise-free model (private, for comparison; not published): test acc {noise_free['test_acc']:.2%}, "
            f"test CD {noise_free['test_conf_dist']:.4f}, forget CD {noise_free['forget_conf_dist']:.4f}")


def format_attack_table(attacks: dict[str, dict], proven: dict[str, dict] | None = None,
                        relearn: dict[str, dict] | None = None, floor: dict | None = None) -> str:
    """The attack table; with `proven` ({stage: {gamma: summary}}), a `proven` row per radius: the mean of
    each image's proven bound, which no attack in that ball can exceed (accuracy: -); with `relearn`
    ({stage: {steps: scores}}, the worst case over the relearning runs), a `relearn` row per number of finetuning
    steps; with `floor` (results.json relearn_floor), a line under the table: the same finetuning of A(D_r)."""
    stages = list(attacks)
    rows = [["attack", "gamma"] + [f"{stage} {what}" for stage in stages for what in ("CD", "acc")]]
    for attack, gamma, values in attack_scores(attacks, proven):
        rows.append([attack, "-" if gamma is None else f"{gamma}/255"] + [
            "-" if value is None else f"{value:.4f}" if i % 2 == 0 else f"{value:.2%}" for i, value in enumerate(values)])
    for steps in (next(iter(relearn.values())) if relearn else {}):
        rows.append(["relearn", f"{steps} step{'s' if steps != '1' else ''}"] + [
            cell for stage in stages for cell in (f"{relearn[stage][steps]['forget_conf_dist']:.4f}",
                                                  f"{relearn[stage][steps]['forget_acc']:.2%}")])
    text = table(rows)
    if floor:
        worst = floor["worst"]
        reached = " / ".join(f"{scores['forget_conf_dist']:.4f}" for scores in worst.values())
        text += "\n" + wrapped(f"relearn floor: A(D_r), retrained without the forget images, reaches forget CD "
                               f"{reached} after {' / '.join(worst)} steps of the same finetuning (a release that "
                               "relearns to it is no better protected than a model that never saw the images)")
    return text


PER_IMAGE_COLUMNS = [("forget_worst_conf_dist", "worst CD", "{:.4f}"), ("forget_exposed", "CD > {t}", "{:d}"),
                     ("forget_robust_worst_conf_dist", "worst attacked", "{:.4f}"),
                     ("forget_robust_exposed", "attacked > {t}", "{:d}"),
                     ("forget_proven_worst_conf_dist", "worst proven", "{:.4f}"),
                     ("forget_proven_share_05", "proven <= 0.05", "{:.0%}"),
                     ("forget_proven_share_10", "proven <= 0.1", "{:.0%}"),
                     ("forget_proven_radius_min", "radius min", "{:g}"),
                     ("forget_proven_radius_median", "radius median", "{:g}")]


def per_image_title(results: dict) -> str:
    """The per-image table's title line, and what its words mean, wrapped within the console's width."""
    gate = results["release_gate"]
    used = bound_words(results.get("proof_bound") or {})
    return wrapped(f"forget images one by one ({results['data']['forget_size']} images, attacked and proven within "
                   f"{gate['gamma']:g}/255)\n  proven: a bound no attack can exceed"
                   + (f" ({used})" if used else "") + "; radius: the largest L-inf radius, in 1/255, "
                   f"proven at CD <= {gate['conf_dist_at_most']:g}")


def bound_words(proof_bound: dict) -> str:
    """Which bound gave each stage's proven values: one name when every stage used it, else stage by stage;
    "by rule" when bounds.kind=auto chose them ("" when no stage has a bound)."""
    names = {stage: name for stage, record in proof_bound.items() if (name := bound_name(record))}
    if not names:
        return ""
    ruled = "by rule: " if any(record.get("rule") for record in proof_bound.values()) else ""
    if len(set(names.values())) == 1:
        return f"{ruled}{next(iter(names.values()))}"
    return ruled + ", ".join(f"{stage} {name}" for stage, name in names.items())


def per_image_summary_rows(metrics: dict[str, dict], gate: dict) -> list[list[str]]:
    """Header, then per stage: the worst forget image's clean, attacked and proven CD, how many images
    exceed the gate's threshold, and the shares proven at most 0.05 and 0.1."""
    threshold = f"{gate['conf_dist_at_most']:g}"
    rows = [["stage"] + [title.format(t=threshold) for _, title, _ in PER_IMAGE_COLUMNS]]
    for stage, values in metrics.items():
        rows.append([stage] + ["-" if values.get(key) is None else fmt.format(values[key])
                               for key, _, fmt in PER_IMAGE_COLUMNS])
    return rows


def forget_image_rows(per_image: list[dict]) -> list[list]:
    """Header, then one row per forget image: its id and, per stage, its clean / attacked / proven CD."""
    stages = [key for key in per_image[0] if key != "id"] if per_image else []
    header = ["image"] + [f"{stage} {kind}" for stage in stages for kind in KINDS]
    return [header] + [[row["id"]] + [row[stage][kind] for stage in stages for kind in KINDS] for row in per_image]


def format_per_image_table(metrics: dict[str, dict], gate: dict) -> str:
    return table(per_image_summary_rows(metrics, gate))


def gate_summary(gate: dict, forget_size: int, checks: dict | None = None) -> str:
    """The release gate's verdict under the tables, and notes on what it does not cover (`checks`: the method's
    attack sanity checks)."""
    masking = masking_note(checks, forget_size)
    masking = f"\n  note: {masking}" if masking else ""
    if gate["passed"]:
        rule = f"every forget image's {' / '.join(gate['require'])} CD <= {gate['conf_dist_at_most']:g}"
        note = unrequired_note(gate, forget_size)
        return wrapped(f"release gate: passed ({rule}) -> {gate['folder']}/" + (f"\n  {note}" if note else "")
                       + masking)
    return wrapped(f"release gate: NOT PROTECTED: {'; '.join(gate['reasons'])} -> {gate['folder']}/" + masking)
