"""Fault cases: a job killed or signalled mid-run (kill -9, SIGTERM, SIGINT, SLURM's requeue signal) and rerun:
the rerun must give the uninterrupted run's numbers."""

import os
import shutil
import signal
import time

from fault_cases.jobs import (
    BASE,
    CERTIFIED,
    ROBUST,
    Job,
    copy_cache,
    kill_and_rerun,
    reference_run,
    run,
    same_results,
)


def case_kill_pretraining(work, reference):
    return kill_and_rerun(work, reference, "checkpoints/*_fit/last.ckpt", "kill9_pretraining")


def case_kill_finetuning(work, reference):
    return kill_and_rerun(work, reference, "checkpoints/*_alg1/last.ckpt", "kill9_finetuning",
                          cache=copy_cache(work, reference, "kill9_finetuning"))


def kill_robust_at(epoch: int, args=ROBUST, label: str = "robust"):
    """Issue 36, case 4: robust Alg 1 on digits (its defaults, attacks on; `args`) killed after `epoch` epochs and
    rerun. With PROVABLE (issue 80), on an A(D) certified-pretrained here, whose bound term covers every unproven
    image from round 1 (`bound_from_start`)."""
    def case(work, reference):
        robust = reference_run(work, f"{label}_reference", args)
        cache = work / f"cache_{label}_{epoch}"
        shutil.copytree(robust.cache / "pretrain", cache / "pretrain")  # A(D) cached: the kill lands in Alg 1
        return kill_and_rerun(work, robust, "checkpoints/*_alg1/last.ckpt", f"kill9_{label}_{epoch}", cache=cache,
                              args=args, epoch=epoch)
    return case


def case_kill_certified(work, reference):
    """A certified run (digits LogReg, residual bound) killed during its pretraining and rerun: the certificate's
    constants and the noise-free model's scores are the uninterrupted run's; the release's noise is fresh."""
    certified = reference_run(work, "certified_reference", CERTIFIED)
    return kill_and_rerun(work, certified, "checkpoints/*_fit/last.ckpt", "kill9_certified", args=CERTIFIED,
                          epoch=40)


def case_sigterm(work, reference):
    return kill_and_rerun(work, reference, "checkpoints/*_alg1/last.ckpt", "sigterm", how=signal.SIGTERM,
                          cache=copy_cache(work, reference, "sigterm"))


def case_sigint(work, reference):
    return kill_and_rerun(work, reference, "checkpoints/*_alg1/last.ckpt", "sigint", how=signal.SIGINT,
                          cache=copy_cache(work, reference, "sigint"))


def case_slurm_requeue(work, reference):
    """Lightning's SLURM handler: SIGUSR1 -> hpc checkpoint in the checkpoint folder + `scontrol requeue`;
    SLURM then ends the job; the requeued job resumes from the hpc checkpoint (mid-epoch)."""
    cache = copy_cache(work, reference, "slurm")
    tools = work / "slurm_bin"
    tools.mkdir(exist_ok=True)
    calls = work / "scontrol_calls.txt"
    (tools / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    (tools / "scontrol").chmod(0o755)
    env = {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "ttp", "SLURM_JOB_ID": "4242", "SLURM_PROCID": "0",
           "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS_PER_NODE": "1",
           "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    job = Job(work, "slurm_stopped", cache, BASE, env=env)
    job.wait_for("checkpoints/*_alg1/last.ckpt")
    time.sleep(0.5)
    job.proc.send_signal(signal.SIGUSR1)
    hpc = job.wait_for("checkpoints/*_alg1/hpc_ckpt_*.ckpt")
    job.proc.send_signal(signal.SIGTERM)  # what SLURM sends once the job is requeued
    code, _, _ = job.finish()
    requeued = calls.exists() and "requeue 4242" in calls.read_text()
    again = run(work, "slurm_rerun", cache, BASE, env=env)
    output = again.stdout + again.stderr
    source = "hpc_ckpt" if "hpc_ckpt_" in output.split("resuming", 1)[-1][:400] else "last.ckpt"
    equal = same_results(reference.results, again.results)
    ok = code == 143 and requeued and bool(again.results and again.results["resumed"])
    return {"exit": code, "happened": f"{hpc.name} written and `scontrol requeue 4242` called: {requeued}; exit "
                                      f"{code}; the requeued job resumed from the newer checkpoint, {source}",
            "lost": "nothing: results equal the uninterrupted run" if equal else
                    "from hpc_ckpt (mid-epoch) the rest of that epoch's batches are not replayed in the same order; "
                    "the job completed",
            "ok": ok}
