"""results.json writing (atomic) and the terminal table."""

import json
import math
from pathlib import Path

import torch

from ttp_lightning.certify.certificate import is_vacuous
from ttp_lightning.errors import TTPUserError
from ttp_lightning.files import atomic_text, atomic_write

COLUMNS = [("retain_acc", "retain acc", "{:.2%}"), ("test_acc", "test acc", "{:.2%}"),
           ("forget_acc", "forget acc", "{:.2%}"), ("forget_conf_dist", "forget CD", "{:.4f}"),
           ("forget_robust_conf_dist", "robust CD", "{:.4f}"),
           ("test_conf_dist", "test CD", "{:.4f}"), ("forget_l2_dist", "forget l2", "{:.4f}"),
           ("forget_nn_conf_dist", "NN CD", "{:.4f}"),
           ("wall_s", "wall s", "{:.1f}")]


WEIGHTS_FILE = "model.pt"


def write_weights(net, output_dir: str | Path) -> Path:
    """The released model's state_dict as model.pt (via a temporary file): what a provider publishes."""
    return atomic_write(Path(output_dir) / WEIGHTS_FILE, lambda tmp: torch.save(net.state_dict(), tmp))


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
    return _aligned(metric_rows(metrics))


def attack_rows(attacks: dict[str, dict]) -> list[list[str]]:
    """Header, then one row per (attack, gamma): forget CD and accuracy per stage, as the paper's attack
    tables."""
    stages = list(attacks)
    header = ["attack", "gamma"] + [f"{stage} {what}" for stage in stages for what in ("CD", "acc")]
    rows = [header]
    for attack, by_gamma in attacks[stages[0]].items():
        for gamma in by_gamma:
            row = [attack, "-" if attack == "none" else f"{gamma}/255"]
            for stage in stages:
                scores = attacks[stage][attack][gamma]
                row += [f"{scores['forget_conf_dist']:.4f}", f"{scores['forget_acc']:.2%}"]
            rows.append(row)
    return rows


def format_certificate_line(certificate: dict, vacuous_above: float) -> str:
    """One line under the tables of a certified run: the budget, and whether it means anything."""
    line = (f"certificate: epsilon={certificate['epsilon']:.4g}, delta={certificate['delta']:.3g}, "
            f"sigma={certificate['sigma']:.4g}, Delta={certificate['sensitivity']:.4g}, lambda_min(H) measured "
            f"{min(s['lam_min_measured'] for s in certificate['steps']):.4g}, ||H||={certificate['hessian_norm']:.4g}")
    if is_vacuous(certificate["epsilon"], vacuous_above):
        line += f"\n  VACUOUS: epsilon > {vacuous_above:g}, so this certificate guarantees nothing meaningful"
    return line


def format_attack_table(attacks: dict[str, dict]) -> str:
    return _aligned(attack_rows(attacks))


def _aligned(rows: list[list[str]]) -> str:
    header = rows[0]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
