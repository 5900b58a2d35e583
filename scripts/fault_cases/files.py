"""Fault cases: damaged or swapped caches and checkpoints, concurrent jobs, folders that cannot be written or are
in use, and files that must not be readable by others (issue 26: reused files must carry a proof)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from fault_cases.jobs import (
    BASE,
    FINISHED,
    QUICK,
    REPO,
    Job,
    copy_cache,
    protect_args,
    provider,
    refused,
    run,
    same_results,
)
from ttp_lightning.core.errors import EXIT_NOT_PROTECTED


def damaged_cache_entry(name: str, damage):
    """A copy of the reference cache whose pretraining entry `damage(entry)` changed: warned once, retrained, and
    the results equal the reference's."""
    def case(work, reference):
        cache = copy_cache(work, reference, name)
        entry = next((cache / "pretrain").glob("*.safetensors"))
        damage(entry)
        job = run(work, f"{name}_cache", cache, BASE)
        warned = "carries no valid proof" in job.stdout + job.stderr
        equal = same_results(reference.results, job.results)
        cached = (job.results or {}).get("metrics", {}).get("pretrain", {}).get("cached")
        return {"exit": job.proc.returncode,
                "happened": f"warning naming {entry.name}: {warned}; retrained (cached {cached})",
                "lost": "nothing: results equal the reference" if equal else "RESULTS DIFFER",
                "ok": job.proc.returncode in FINISHED and warned and equal and cached is False}
    return case


def _truncate_entry(entry: Path) -> None:
    entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])


def _swap_entry(entry: Path) -> None:
    """Other weights in the entry, its JSON record's SHA-256 rewritten to match."""
    import hashlib

    from safetensors.torch import load_file, save_file

    save_file({k: torch.zeros_like(v) for k, v in load_file(str(entry)).items()}, str(entry))
    record = entry.with_suffix(".json")
    text = json.loads(record.read_text())
    record.write_text(json.dumps({**text, "sha256": hashlib.sha256(entry.read_bytes()).hexdigest()}))


def damaged_checkpoint(name: str, damage):
    """Alg 1 killed after a checkpoint, which `damage(path)` then changes: the rerun warns once, starts Alg 1
    afresh (resumes nothing) and its results equal the reference's."""
    def case(work, reference):
        cache = copy_cache(work, reference, name)
        job = Job(work, f"{name}_stopped", cache, BASE)
        checkpoint = job.wait_for("checkpoints/*_alg1/last.ckpt")
        time.sleep(0.5)
        job.proc.kill()
        job.finish()
        damage(checkpoint)
        again = run(work, f"{name}_rerun", cache, BASE)
        warned = "carries no valid proof" in again.stdout + again.stderr
        equal = same_results(reference.results, again.results)
        resumed = (again.results or {}).get("resumed")
        return {"exit": again.proc.returncode, "happened": f"warning naming last.ckpt: {warned}; resumed {resumed}",
                "lost": "the finished epochs (retrained); results equal the reference" if equal else "RESULTS DIFFER",
                "ok": again.proc.returncode in FINISHED and warned and equal and not resumed}
    return case


def _truncate_checkpoint(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:1000])


def _edit_checkpoint(path: Path) -> None:
    """A valid checkpoint with one weight changed (as someone planting a model in a shared cache would)."""
    state = torch.load(path, weights_only=True)
    name = next(iter(state["state_dict"]))
    state["state_dict"][name] = state["state_dict"][name] + 0.5
    torch.save(state, path)


def case_concurrent(work, reference):
    cache = work / "cache_concurrent"
    jobs = [Job(work, f"concurrent_{i}", cache, BASE) for i in range(2)]
    for job in jobs:
        job.finish()
    cached = sorted(bool(job.results and job.results["metrics"]["pretrain"]["cached"]) for job in jobs)
    equal = all(same_results(reference.results, job.results) for job in jobs)
    return {"exit": max(job.proc.returncode for job in jobs),
            "happened": f"pretrained once: {cached == [False, True]} (one trained, the other waited and reused)",
            "lost": "nothing: both results equal the reference" if equal else "RESULTS DIFFER",
            "ok": cached == [False, True] and equal}


def case_read_only_output(work, reference):
    if os.geteuid() == 0:  # root writes through permission bits: use a read-only file system instead
        target = Path("/proc/sys/kernel/ttp_run")
        if os.access(target.parent, os.W_OK):
            return {"exit": "-", "happened": "skipped: running as root and no read-only folder found", "lost": "-",
                    "ok": True}
    else:
        folder = work / "read_only"
        folder.mkdir()
        folder.chmod(0o555)
        target = folder / "run"
    job = Job(work, "read_only_job", work / "cache_quick", [*QUICK, f"hydra.run.dir={target}"])
    job.finish()
    return refused(job)


def case_edited_decoded_cache(work, reference):
    """data.decoded_cache: one training image's pixels inverted in the entry (a valid safetensors file)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    folder = provider(work)
    decoded, cache = work / "decoded", work / "cache_decoded"
    args = protect_args(folder, folder / "forget", f"data.decoded_cache={decoded}")
    first = run(work, "decoded_first", cache, args)
    entry = next(decoded.glob("*.safetensors"))
    with safe_open(str(entry), framework="pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(str(entry))
    tensors["train_images"][0] = 255 - tensors["train_images"][0]
    save_file(tensors, str(entry), metadata=metadata)
    again = run(work, "decoded_again", cache, args)
    warned = "carries no valid proof" in again.stdout + again.stderr
    equal = same_results(first.results, again.results)
    return {"exit": again.proc.returncode, "happened": f"warning naming the entry: {warned}; decoded again",
            "lost": "nothing: results equal the first run's" if equal else "RESULTS DIFFER",
            "ok": again.proc.returncode in FINISHED and warned and equal}


def case_two_runs_one_folder(work, reference):
    first = Job(work, "shared_folder", work / "cache_shared", BASE)
    first.wait_for("checkpoints/*/last.ckpt")
    second = Job(work, "shared_folder", work / "cache_shared", BASE)
    second.finish()
    first.proc.kill()
    first.finish()
    return refused(second) | {"lost": "nothing: the first run's folder untouched by the second"}


def case_no_room(work, reference):
    """The outputs cannot be written (a file size limit of 20 kB, as a nearly full disk: writes fail with EFBIG
    once a file would pass it; caches and checkpoints off, so the first large write is the run's weights)."""
    import resource

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of the process dying
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    out = work / "no_room"
    command = [sys.executable, "-m", "ttp_lightning", f"hydra.run.dir={out}", *QUICK, "pretrain.use_cache=false",
               "checkpoint_every_n_epochs=0"]
    env = dict(os.environ, TTP_CACHE_DIR=str(work / "cache_no_room"), WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
                          preexec_fn=limit)
    lines = proc.stderr.strip().splitlines()
    left = sorted(path.name for path in out.iterdir() if path.name in ("model.pt", "release", "release_not_protected",
                                                                         "results.json")) if out.exists() else []
    ok = proc.returncode == 2 and len(lines) >= 1 and lines[-1].startswith("error: writing the run's outputs") and not left
    return {"exit": proc.returncode, "happened": lines[-1] if lines else "", "ok": ok,
            "lost": "nothing of this run's outputs left" if not left else f"LEFT {left}"}


def case_rerun_into_a_release(work, reference):
    """Issue 36, case 3: a run folder holding a release, then `method=retrain` into it (exit 4)."""
    from ttp_lightning.release import load_released

    folder = work / "rerun_folder"
    shutil.copytree(reference.out, folder)
    before = json.loads((folder / "results.json").read_text())["release_gate"]["folder"]
    job = Job(work, "rerun_folder", work / "cache_quick", [*QUICK, "method=retrain", "method.epochs=4"])
    code, out, err = job.finish()
    moved = sorted((folder / "superseded").glob(f"*/{before}"))
    try:
        load_released(folder / "release")
        stale = "load_released(release/) LOADED a release"
    except Exception as exc:  # noqa: BLE001 -- what a user of the folder would meet
        stale = f"load_released(release/): {str(exc)[:60]}..."
    now = json.loads((folder / "results.json").read_text())
    ok = code == EXIT_NOT_PROTECTED and bool(moved) and not (folder / "release").exists() and \
        now["method"] == "retrain" and "moved them to" in out + err
    return {"exit": code, "happened": f"the earlier {before}/ and results.json moved to superseded/"
                                      f"{moved[0].parent.name if moved else '?'}/; {stale}",
            "lost": "nothing: the earlier outputs are kept under superseded/", "ok": ok}


def case_world_readable_key(work, reference):
    key = work / "shared.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o644)
    job = run(work, "world_key", work / "cache_world_key", QUICK, env={"TTP_KEY_FILE": str(key)})
    warning = next((line for line in (job.stdout + job.stderr).splitlines() if "cache key" in line), "")
    return {"exit": job.proc.returncode, "happened": warning.split("] - ")[-1][:200] or "no warning",
            "lost": "nothing: the run goes on, the line says what to change",
            "ok": job.proc.returncode in FINISHED and "chmod 600" in warning}
