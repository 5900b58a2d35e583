"""Fault cases: training that diverges or collapses, and settings or checkpoints a run must refuse."""

import os
import subprocess
import time

import torch

from fault_cases.jobs import QUICK, protect_args, provider, refused, run
from ttp_lightning.core.errors import EXIT_NOT_PROTECTED


def case_nan_lr(work, reference):
    return refused(run(work, "nan_lr", work / "cache_quick", [*QUICK, "method.lr=nan"]))


def case_divergence(work, reference):
    return refused(run(work, "lr_1e30", work / "cache_quick", [*QUICK, "method.lr=1e30"]))


def case_collapse(work, reference):
    """A finite but absurd learning rate: no epoch keeps retain accuracy, the fallback picks one."""
    job = run(work, "lr_1e9", work / "cache_quick", [*QUICK, "method.lr=1e9"])
    results = job.results or {}
    metrics = results.get("metrics", {}).get("pareto", {})
    happened = (f"exit {job.proc.returncode}; constraint_met {metrics.get('constraint_met')}, kept epoch "
                f"{metrics.get('best_epoch')} by '{metrics.get('selection_rule', '')[:40]}...', retain "
                f"{metrics.get('retain_acc', float('nan')):.3f}") if metrics else job.last_line()
    ok = job.proc.returncode == EXIT_NOT_PROTECTED and metrics.get("constraint_met") is False  # the gate refuses it
    return {"exit": job.proc.returncode, "happened": happened,
            "lost": "nothing: results.json says no epoch met the thresholds; not released as protected", "ok": ok}


def case_gpu_without_gpu(work, reference):
    return refused(run(work, "gpu", work / "cache_quick", [*QUICK, "trainer=gpu"]))


def case_unknown_key(work, reference):
    return refused(run(work, "unknown_key", work / "cache_quick", [*QUICK, "+pretrain.checkpoint=model.pt"]))


def case_devices_1000(work, reference):
    """Refused before any process starts: one line, quickly, nothing left running."""
    marker = f"ttp_devices_{os.getpid()}"
    started = time.perf_counter()
    job = run(work, marker, work / "cache_quick", [*QUICK, "trainer=ddp_sim", "trainer.devices=1000"])
    seconds = time.perf_counter() - started
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True, check=False).stdout.split()
    row = refused(job)
    row["happened"] += f" ({seconds:.1f} s; {len(left)} processes left)"
    row["ok"] = row["ok"] and not left and seconds < 15
    return row


def case_nan_checkpoint(work, reference):
    folder = provider(work)
    state = torch.load(folder / "model.pt", weights_only=True)
    path = work / "nan.pt"
    torch.save({k: v * float("nan") if k.endswith("bias") else v for k, v in state.items()}, path)
    args = [a if not a.startswith("model.checkpoint=") else f"model.checkpoint={path}"
            for a in protect_args(folder, folder / "forget")]
    return refused(run(work, "nan_checkpoint", work / "cache_provider", args))


def case_permuted_checkpoint(work, reference):
    folder = provider(work)
    state = torch.load(folder / "model.pt", weights_only=True)
    order = torch.roll(torch.arange(10), 3)
    path = work / "permuted.pt"
    torch.save({**state, "3.weight": state["3.weight"][order], "3.bias": state["3.bias"][order]}, path)
    args = [a if not a.startswith("model.checkpoint=") else f"model.checkpoint={path}"
            for a in protect_args(folder, folder / "forget")]
    job = run(work, "permuted_checkpoint", work / "cache_provider", args)
    warning = next((line for line in (job.stdout + job.stderr).splitlines() if "near chance" in line), "")
    return {"exit": job.proc.returncode, "happened": warning.split("] - ")[-1] or "no warning",
            "lost": "nothing: the run goes on, the line says what to check", "ok": bool(warning)}
