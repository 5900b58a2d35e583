"""Fault injection: runs `python -m ttp_lightning` on the embedded digits data through kills, signals,
divergence, corrupt caches and checkpoints, concurrent jobs and hostile or broken input files, and reports
for each case what happened and whether anything was lost.

    python scripts/faults.py [--out bench/faults.json] [--markdown] [--only NAME ...]

"Lost" compares a stopped-and-rerun job with an uninterrupted one of the same command: the final metrics
and the per-epoch history, timings and cache flags aside. Exits 1 when any case does not end as expected.
The fault table of docs/faults.md is this script's --markdown output.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fault_cases.files import (
    _edit_checkpoint,
    _swap_entry,
    _truncate_checkpoint,
    _truncate_entry,
    case_concurrent,
    case_edited_decoded_cache,
    case_no_room,
    case_read_only_output,
    case_rerun_into_a_release,
    case_two_runs_one_folder,
    case_world_readable_key,
    damaged_cache_entry,
    damaged_checkpoint,
)
from fault_cases.inputs import (
    _cmyk,
    _exif,
    _linked,
    _palette,
    _sixteen_bit,
    _transparent,
    bad_index,
    case_hostile_pickle,
    case_labels_csv,
    case_mnist_label,
    case_mnist_truncated,
    forget_image_case,
)
from fault_cases.interruptions import (
    case_kill_certified,
    case_kill_finetuning,
    case_kill_pretraining,
    case_sigint,
    case_sigterm,
    case_slurm_requeue,
    kill_robust_at,
)
from fault_cases.jobs import BASE, FINISHED, MNIST_RAW, PROVABLE, quick_refusal, run
from fault_cases.releases import (
    _confident_with_claims,
    _corrupt_header,
    _huge_integer,
    _huge_layer,
    _input,
    _nan_weights,
    _nested,
    _not_protected,
    case_release_modes,
    tampered_release,
)
from fault_cases.training import (
    case_collapse,
    case_devices_1000,
    case_divergence,
    case_gpu_without_gpu,
    case_nan_checkpoint,
    case_nan_lr,
    case_permuted_checkpoint,
    case_unknown_key,
)

CASES = {
    "kill -9 during pretraining, rerun": case_kill_pretraining,
    "kill -9 during Alg 1, rerun": case_kill_finetuning,
    "SIGTERM during Alg 1, rerun": case_sigterm,
    "SIGINT (Ctrl-C) during Alg 1, rerun": case_sigint,
    "SLURM requeue signal (SIGUSR1), requeued job": case_slurm_requeue,
    "method.lr=nan": case_nan_lr,
    "method.lr=1e30 (diverges)": case_divergence,
    "method.lr=1e9 (finite collapse)": case_collapse,
    "truncated pretraining cache entry": damaged_cache_entry("truncated", _truncate_entry),
    "truncated checkpoint": damaged_checkpoint("truncated_ckpt", _truncate_checkpoint),
    "two jobs on an empty cache": case_concurrent,
    "read-only output folder": case_read_only_output,
    "forget indices [1.9, 2.9] (.json)": bad_index("floats.json", "[1.9, 2.9]"),
    "forget indices [true, false] (.npy)": bad_index("bools.npy", np.array([True, False])),
    "forget indices: a dict in a .pt": bad_index("dict.pt", {"indices": torch.tensor([1, 2])}),
    "forget indices: a hostile pickle (.pt)": case_hostile_pickle,
    "MNIST label byte 200": case_mnist_label,
    "truncated MNIST image file": case_mnist_truncated,
    "trainer=gpu without a GPU": case_gpu_without_gpu,
    "unknown key +pretrain.checkpoint": case_unknown_key,
    "resume checkpoint with one weight edited": damaged_checkpoint("edited_ckpt", _edit_checkpoint),
    "pretraining cache entry swapped, its SHA-256 record rewritten": damaged_cache_entry("swapped", _swap_entry),
    "decoded-images cache entry edited": case_edited_decoded_cache,
    "16-bit PNG of a training image": forget_image_case("sixteen", _sixteen_bit, "matched"),
    "EXIF-rotated PNG of a training image": forget_image_case("exif_png", _exif(".png"), "matched"),
    "EXIF-rotated JPEG of a training image": forget_image_case("exif_jpg", _exif(".jpg"),
                                                               ["near_copies=match", "training image 'train/"]),
    "grey palette PNG of a training image": forget_image_case("palette", _palette, "matched"),
    "PNG with a transparent pixel": forget_image_case("alpha", _transparent, "transparent pixels"),
    "colour CMYK JPEG for grey data": forget_image_case("cmyk", _cmyk, "is a colour image"),
    "forget class folder linked to a training class": forget_image_case("linked", _linked, "links to"),
    "labels.csv with a byte-order mark": case_labels_csv("bom", "\ufefffile,label\nface.png,{label}\n", "read"),
    "labels.csv row without a label": case_labels_csv("nolabel", "file,label\nface.png\n", "has no label"),
    "labels.csv naming a file with a newline": case_labels_csv("newline", 'file,label\n"fa\nce.png",{label}\n',
                                                               "not a file inside"),
    "labels.csv with 200,000 rows of one file": case_labels_csv("rows", "file,label\n" + "face.png,{label}\n" * 200_000,
                                                                "twice"),
    "checkpoint with NaN weights": case_nan_checkpoint,
    "checkpoint with its classes in another order": case_permuted_checkpoint,
    "trainer.devices=1000": case_devices_1000,
    "trainer.devices=0": quick_refusal("trainer.devices=0"),
    "seed=-1": quick_refusal("seed=-1"),
    "seed=10^20": quick_refusal("seed=100000000000000000000"),
    "+trainer.foo=1": quick_refusal("+trainer.foo=1"),
    "300-character run folder": quick_refusal("hydra.run.dir=" + "r" * 300),
    "hydra.run.dir=/": quick_refusal("hydra.run.dir=/"),
    "cache folder that cannot be written": quick_refusal("paths.cache_dir=/proc/sys/kernel/ttp_cache"),
    "a second run into a run folder in use": case_two_runs_one_folder,
    "release: NaN weights, SHA-256 rewritten": tampered_release("nan", _nan_weights),
    "release: std [0] in config.json": tampered_release("std", _input(std=[0.0])),
    "release: a 4-value mean for 1 channel": tampered_release("mean", _input(mean=[0.0] * 4)),
    "release: hidden_dim 10^12": tampered_release("huge", _huge_layer),
    "release: config.json nested 100,000 deep": tampered_release("nested", _nested),
    "release: corrupt safetensors header, SHA-256 rewritten": tampered_release("header", _corrupt_header),
    "release files' permissions": case_release_modes,
    "kill -9 robust Alg 1 after epoch 10, rerun": kill_robust_at(10),
    "kill -9 robust Alg 1 after epoch 35, rerun": kill_robust_at(35),
    "kill -9 robust Alg 1 after epoch 70, rerun": kill_robust_at(70),
    "kill -9 robust Alg 1 on an A(D) trained for the bound after epoch 35, rerun": kill_robust_at(35, PROVABLE,
                                                                                                 "provable"),
    "kill -9 a certified run (pretraining epoch 40), rerun": case_kill_certified,
    "release: std [1e-300], mean [0.5] in config.json": tampered_release("std_tiny", _input(std=[1e-300], mean=[0.5])),
    "release: image_size of 5000 digits": tampered_release("digits", _huge_integer),
    "release: pixel_range [0, 255]": tampered_release("pixel_range", _input(pixel_range=[0, 255])),
    "release: bias +50, hash, gate threshold 0.95 and claims rewritten": tampered_release(
        "confident", _confident_with_claims, expect=1, says="is not <= 0.1"),
    'release: config.json "protected": false': tampered_release("unprotected", _not_protected, expect=1,
                                                                says="NOT a protected release"),
    "a rerun into a folder holding a release (method=retrain)": case_rerun_into_a_release,
    "method=pareto_robust with attacks.enabled=false": quick_refusal("method=pareto_robust"),
    "certified digits LogReg with method.delta=0.5": quick_refusal("model=logreg", "pretrain.norm_bound=10",
                                                                   "method=certified_exact", "method.delta=0.5"),
    "a cache key file every user can read": case_world_readable_key,
    "no room for the outputs (file size limit)": case_no_room,
}


NEEDS_MNIST = {"MNIST label byte 200", "truncated MNIST image file"}


def markdown(rows: list[dict], work: Path) -> str:
    """docs/faults.md's table: temporary paths shortened to <tmp>, long library messages cut."""
    lines = ["| case | exit | what happened | lost | ok |", "|---|---|---|---|---|"]
    for row in rows:
        happened = row["happened"].replace(str(work), "<tmp>").replace("|", "/")
        happened = happened if len(happened) <= 230 else happened[:227] + "..."
        lines.append(f"| {row['case']} | {row['exit']} | {happened} | {row['lost']} | {'yes' if row['ok'] else 'NO'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/faults.json")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown (docs/faults.md's)")
    parser.add_argument("--only", nargs="*", help="case names containing any of these words")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ttp_faults_"))
    os.chmod(work, 0o755)
    started = time.perf_counter()
    rows = []
    try:
        reference = run(work, "reference", work / "cache_reference", BASE)
        if reference.proc.returncode not in FINISHED:
            print(reference.stderr[-3000:], file=sys.stderr)
            return 1
        for name, case in CASES.items():
            if args.only and not any(word.lower() in name.lower() for word in args.only):
                continue
            if name in NEEDS_MNIST and not MNIST_RAW.is_dir():
                rows.append({"case": name, "exit": "-", "happened": "skipped: no MNIST files", "lost": "-",
                             "ok": True})
                continue
            if name == "trainer=gpu without a GPU" and torch.cuda.is_available():
                continue
            t0 = time.perf_counter()
            try:
                row = case(work, reference)
            except Exception as exc:  # noqa: BLE001 -- a case that breaks is reported as failed, the rest still run
                row = {"exit": "-", "happened": f"the case broke: {type(exc).__name__}: {exc}"[:300], "lost": "?",
                       "ok": False}
            rows.append({"case": name, **row, "seconds": round(time.perf_counter() - t0, 1)})
            print(f"{'ok ' if row['ok'] else 'NO '} {name}: {row['happened']} | {row['lost']}", flush=True)
    finally:
        if not args.keep:
            for path in work.rglob("*"):
                if path.is_dir():
                    path.chmod(0o755)
            shutil.rmtree(work, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"cases": rows, "seconds": round(time.perf_counter() - started, 1)},
                                         indent=2))
    if args.markdown:
        print(markdown(rows, work))
    failed = [row["case"] for row in rows if not row["ok"]]
    print(f"{len(rows) - len(failed)}/{len(rows)} cases as expected in {time.perf_counter() - started:.0f} s"
          + (f"; not as expected: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
