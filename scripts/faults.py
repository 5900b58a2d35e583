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
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ttp_lightning.core.errors import EXIT_NOT_PROTECTED

FINISHED = (0, EXIT_NOT_PROTECTED)  # a run that went to its end (4: its release gate failed)

REPO = Path(__file__).resolve().parents[1]
MNIST_RAW = REPO.parent / "shared" / "data" / "MNIST" / "raw"
BASE = ["logger=none", "trainer.enable_progress_bar=false", "data.forget.size=20", "attacks.enabled=false",
        "pretrain.epochs=150", "method.epochs=150", "method.early_stopping.patience=null"]
QUICK = ["logger=none", "trainer.enable_progress_bar=false", "data.forget.size=20", "attacks.enabled=false",
         "pretrain.epochs=4", "method.epochs=4"]
TIMING = ("wall", "per_s", "elapsed")


class Job:
    """One `python -m ttp_lightning` process with its own cache and run folder."""

    def __init__(self, work: Path, name: str, cache: Path, args: list[str], env: dict | None = None):
        self.out = work / name
        self.cache = cache
        environment = dict(os.environ, TTP_CACHE_DIR=str(cache), WANDB_MODE="disabled", OMP_NUM_THREADS="1",
                           **(env or {}))
        command = [sys.executable, "-m", "ttp_lightning", f"hydra.run.dir={self.out}", *args]  # args may move it
        self.proc = subprocess.Popen(command, cwd=REPO, env=environment, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.stdout = self.stderr = ""

    def wait_for(self, pattern: str, timeout: float = 180.0) -> Path:
        """The first file matching `pattern` under the cache (the process must still be running)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = sorted(self.cache.glob(pattern))
            if found:
                return found[0]
            if self.proc.poll() is not None:
                raise RuntimeError(f"the job ended before {pattern} appeared:\n{self.finish()[2][-2000:]}")
            time.sleep(0.02)
        raise RuntimeError(f"{pattern} did not appear within {timeout:.0f} s")

    def finish(self, timeout: float = 600.0) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        self.stdout, self.stderr = self.stdout + out, self.stderr + err
        return self.proc.returncode, self.stdout, self.stderr

    @property
    def results(self) -> dict | None:
        path = self.out / "results.json"
        return json.loads(path.read_text()) if path.exists() else None

    def last_line(self) -> str:
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else ""


def untimed(values: dict) -> dict:
    return {k: v for k, v in values.items() if not any(t in k for t in TIMING) and not k.endswith("cached")
            and k != "cache_file"}


def same_results(first: dict | None, second: dict | None) -> bool:
    if first is None or second is None:
        return False
    metrics = all(untimed(first["metrics"][s]) == untimed(second["metrics"].get(s, {})) for s in first["metrics"])
    history = all([untimed(r) for r in rows] == [untimed(r) for r in second["history"].get(m, [])]
                  for m, rows in first["history"].items())
    return metrics and history


def differences(first: Job, second: Job) -> list[str]:
    """What a stopped-and-rerun job's outputs do not share, bit for bit, with an uninterrupted one's: the metrics
    and history (timings and cache flags aside), the per-image table and the released weights' SHA-256. A
    certified run's release carries fresh secret noise, so there its certificate (the released files' hashes and
    the noised model's metrics aside) and the noise-free scores are compared instead of the method's weights and
    metrics."""
    from ttp_lightning.core.files import sha256_of

    a, b = first.results, second.results
    if a is None or b is None:
        return ["no results.json"]
    certified = "certificate" in a
    noised = {a["method"]} if certified else set()
    found = [f"metrics[{stage}]" for stage in a["metrics"] if stage not in noised
             and untimed(a["metrics"][stage]) != untimed(b["metrics"].get(stage, {}))]
    found += [f"history[{m}]" for m, rows in a["history"].items()
              if [untimed(r) for r in rows] != [untimed(r) for r in b["history"].get(m, [])]]
    if certified:
        def constants(cert):  # the released files' hashes and the release's measured metrics carry the noise
            return {k: v for k, v in cert.items() if k not in ("weights", "metrics")} | \
                {"files": [w["file"] for w in cert["weights"]]}
        found += [] if constants(a["certificate"]) == constants(b["certificate"]) else ["certificate"]
        found += [] if a["noise_free"] == b["noise_free"] else ["noise-free scores"]
        found += [f"forget_per_image[{stage}]" for stage in ("pretrain",)
                  if [row[stage] for row in a["forget_per_image"]] != [row[stage] for row in b["forget_per_image"]]]
    else:
        found += [] if a["forget_per_image"] == b["forget_per_image"] else ["forget_per_image"]
        found += [] if sha256_of(first.out / a["weights_file"]) == sha256_of(second.out / b["weights_file"]) else \
            ["released weights (SHA-256)"]
    return found


def wait_for_epoch(job: Job, pattern: str, epoch: int, timeout: float = 600.0) -> int:
    """Wait until the fit's checkpoint (`pattern` under the job's cache) holds `epoch` finished epochs or more;
    returns how many it holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = job.wait_for(pattern, timeout)
        try:
            done = int(torch.load(path, map_location="cpu", weights_only=True)["epoch"]) + 1
        except Exception:  # noqa: BLE001 -- being replaced (atomically) or not written yet: look again
            done = 0
        if done >= epoch:
            return done
        if job.proc.poll() is not None:
            raise RuntimeError(f"the job ended before epoch {epoch}:\n{job.finish()[2][-2000:]}")
        time.sleep(0.01)
    raise RuntimeError(f"epoch {epoch} did not finish within {timeout:.0f} s")


def run(work: Path, name: str, cache: Path, args: list[str], **kwargs) -> Job:
    job = Job(work, name, cache, args, **kwargs)
    job.finish()
    return job


def refused(job: Job) -> dict:
    """Bad input: exit 2, one error line, nothing written."""
    line = job.last_line()
    nothing = not any((job.out / name).exists() for name in ("results.json", "release", "release_not_protected",
                                                             "model.pt"))
    ok = job.proc.returncode == 2 and line.startswith("error:") and nothing
    return {"exit": job.proc.returncode, "happened": line, "lost": "nothing written" if nothing else "WROTE FILES",
            "ok": ok}


# ----------------------------------------------------------------------------------------------- cases


def kill_and_rerun(work, reference, stage_pattern: str, name: str, how=signal.SIGKILL, cache=None, args=BASE,
                   epoch: int | None = None) -> dict:
    """Stop a job with `how` once its fit (`stage_pattern`) has a checkpoint (of `epoch` finished epochs, when
    given), rerun the same command, and compare it with the uninterrupted `reference` (differences())."""
    cache = cache or work / f"cache_{name}"
    job = Job(work, f"{name}_stopped", cache, args)
    if epoch is None:
        checkpoint = job.wait_for(stage_pattern)
        time.sleep(0.5)
    else:
        wait_for_epoch(job, stage_pattern, epoch)
        checkpoint = job.wait_for(stage_pattern)
    job.proc.send_signal(how)
    code, _, _ = job.finish()
    written = checkpoint.exists()
    again = run(work, f"{name}_rerun", cache, args)
    resumed = again.results["resumed"] if again.results else None
    differ = differences(reference, again)
    happened = f"exit {code}" + (f" ({job.last_line()})" if how != signal.SIGKILL else "") + \
        f"; rerun resumed {resumed}"
    expected_code = {signal.SIGKILL: -9, signal.SIGTERM: 143, signal.SIGINT: 130}[how]
    ok = code == expected_code and written and bool(resumed) and not differ
    compared = "certificate, noise-free scores" if "certificate" in (reference.results or {}) else \
        "per-image table, released weights' SHA-256"
    return {"exit": code, "happened": happened,
            "lost": f"nothing: metrics, history, {compared} equal the uninterrupted run" if not differ else
                    f"DIFFER: {', '.join(differ)}",
            "ok": ok}


def case_kill_pretraining(work, reference):
    return kill_and_rerun(work, reference, "checkpoints/*_fit/last.ckpt", "kill9_pretraining")


def case_kill_finetuning(work, reference):
    return kill_and_rerun(work, reference, "checkpoints/*_alg1/last.ckpt", "kill9_finetuning",
                          cache=copy_cache(work, reference, "kill9_finetuning"))


ROBUST = ["logger=none", "trainer.enable_progress_bar=false", "method=pareto_robust"]  # the default job's data
CERTIFIED = [*QUICK, "model=logreg", "pretrain.norm_bound=10", "method=certified_exact", "pretrain.epochs=150"]


_REFERENCES: dict[Path, Job] = {}


def reference_run(work: Path, name: str, args: list[str]) -> Job:
    """An uninterrupted run of `args` with its own cache (once per work folder)."""
    if work / name not in _REFERENCES:
        _REFERENCES[work / name] = run(work, name, work / f"cache_{name}", args)
    return _REFERENCES[work / name]


def kill_robust_at(epoch: int):
    """Issue 36, case 4: robust Alg 1 on digits (its defaults, attacks on) killed after `epoch` epochs and rerun."""
    def case(work, reference):
        robust = reference_run(work, "robust_reference", ROBUST)
        cache = work / f"cache_robust_{epoch}"
        shutil.copytree(robust.cache / "pretrain", cache / "pretrain")  # A(D) cached: the kill lands in Alg 1
        return kill_and_rerun(work, robust, "checkpoints/*_alg1/last.ckpt", f"kill9_robust_{epoch}", cache=cache,
                              args=ROBUST, epoch=epoch)
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


def copy_cache(work: Path, reference: Job, name: str) -> Path:
    target = work / f"cache_{name}"
    shutil.copytree(reference.cache, target, dirs_exist_ok=True)
    return target


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


def _index_file(work: Path, name: str, content) -> Path:
    path = work / "inputs" / name
    path.parent.mkdir(exist_ok=True)
    if name.endswith(".json"):
        path.write_text(content)
    elif name.endswith(".npy"):
        np.save(path, content)
    else:
        torch.save(content, path)
    return path


def bad_index(name, content):
    def case(work, reference):
        path = _index_file(work, name, content)
        return refused(run(work, f"index_{name}", work / "cache_quick",
                           [*QUICK, f"data.forget.indices_file={path}"]))
    return case


def case_hostile_pickle(work, reference):
    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {work / 'pwned'}",))

    path = _index_file(work, "hostile.pt", Payload())
    result = refused(run(work, "index_hostile", work / "cache_quick", [*QUICK, f"data.forget.indices_file={path}"]))
    result["ok"] = result["ok"] and not (work / "pwned").exists()
    result["lost"] += "; the pickle's code did not run" if not (work / "pwned").exists() else "; CODE RAN"
    return result


def mnist_copy(work: Path, name: str, damage) -> Path:
    root = work / name
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for path in MNIST_RAW.glob("*-ubyte"):
        shutil.copy(path, raw / path.name)
    damage(raw)
    return root


def case_mnist_label(work, reference):
    def damage(raw):
        labels = bytearray((raw / "train-labels-idx1-ubyte").read_bytes())
        labels[20] = 200
        (raw / "train-labels-idx1-ubyte").write_bytes(bytes(labels))
    root = mnist_copy(work, "mnist_label", damage)
    return refused(run(work, "mnist_label", work / "cache_mnist", [*QUICK, "data=mnist", f"data.root={root}"]))


def case_mnist_truncated(work, reference):
    def damage(raw):
        path = raw / "train-images-idx3-ubyte"
        path.write_bytes(path.read_bytes()[:1000])
    root = mnist_copy(work, "mnist_truncated", damage)
    return refused(run(work, "mnist_truncated", work / "cache_mnist", [*QUICK, "data=mnist", f"data.root={root}"]))


def case_gpu_without_gpu(work, reference):
    return refused(run(work, "gpu", work / "cache_quick", [*QUICK, "trainer=gpu"]))


def case_unknown_key(work, reference):
    return refused(run(work, "unknown_key", work / "cache_quick", [*QUICK, "+pretrain.checkpoint=model.pt"]))


# ------------------------------------------------------------------ issue 26: reused files must carry a proof
def provider(work: Path) -> Path:
    """scripts/provider_example.py's digits image folder, MLP checkpoint and 5 forget PNGs (once)."""
    folder = work / "provider"
    if not (folder / "model.pt").exists():
        subprocess.run([sys.executable, str(REPO / "scripts" / "provider_example.py"), "--out", str(folder)],
                       check=True, capture_output=True)
    return folder


def protect_args(folder: Path, forget: Path, *extra: str) -> list[str]:
    return [*QUICK, "+workflow=protect", "model=mlp", "model.hidden_dim=128", f"model.checkpoint={folder / 'model.pt'}",
            "data=imagefolder", f"data.root={folder / 'digits'}", f"data.forget.images={forget}",
            "release_gate.require=[clean]", *extra]  # QUICK has no attacks to judge the workflow's ball by


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


def _forget_copy(work: Path, name: str, write) -> Path:
    """A forget folder holding one image written by `write(folder, training image pixels, its class)`."""
    from PIL import Image

    folder = provider(work)
    source = min((folder / "digits" / "train").glob("*/*.png"))
    target = work / f"forget_{name}"
    shutil.rmtree(target, ignore_errors=True)
    (target / source.parent.name).mkdir(parents=True)
    write(target / source.parent.name, np.asarray(Image.open(source)), source)
    return target


def forget_image_case(name: str, write, expect: str):
    """`expect`: matched (the training image is protected), refused (one error line) or a text in the line."""
    def case(work, reference):
        forget = _forget_copy(work, name, write)
        job = run(work, f"forget_{name}", work / "cache_provider", protect_args(provider(work), forget))
        if expect == "matched":
            images = (job.results or {}).get("data", {}).get("forget_images", [])
            matched = bool(images) and all(image["training_indices"] and not image["outside"] for image in images)
            notes = [note for image in images for note in image.get("decoded", [])]
            return {"exit": job.proc.returncode, "happened": f"matched to its training image: {matched}; decoded: "
                    f"{', '.join(notes) or 'as is'}", "lost": "nothing: the training copy is protected",
                    "ok": job.proc.returncode in FINISHED and matched}
        row = refused(job)
        row["ok"] = row["ok"] and all(text in row["happened"] for text in ([expect] if isinstance(expect, str)
                                                                             else expect))
        return row
    return case


def _sixteen_bit(folder, pixels, source):
    from PIL import Image

    Image.fromarray(pixels.astype(np.uint16) * 257).save(folder / "sixteen.png")


def _exif(suffix: str):
    def write(folder, pixels, source):
        from PIL import Image

        exif = Image.Exif()
        exif[0x0112] = 6
        Image.fromarray(np.rot90(pixels, k=1).copy()).save(folder / f"rotated{suffix}", exif=exif.tobytes(),
                                                            **({"quality": 95} if suffix == ".jpg" else {}))
    return write


def _palette(folder, pixels, source):
    from PIL import Image

    Image.fromarray(pixels).convert("P").save(folder / "palette.png")


def _transparent(folder, pixels, source):
    from PIL import Image

    image = Image.fromarray(pixels).convert("LA")
    image.putpixel((0, 0), (0, 10))
    image.save(folder / "alpha.png")


def _cmyk(folder, pixels, source):
    from PIL import Image

    colour = np.dstack([pixels, np.zeros_like(pixels), pixels])  # magenta: colour content
    Image.fromarray(colour).convert("CMYK").save(folder / "cmyk.jpg", quality=95)


def _linked(folder, pixels, source):
    folder.rmdir()
    folder.symlink_to(source.parent, target_is_directory=True)  # "forget every image of this class"


def case_labels_csv(name: str, text: str, expect: str):
    def case(work, reference):
        folder = provider(work)
        forget = work / f"forget_labels_{name}"
        shutil.rmtree(forget, ignore_errors=True)
        forget.mkdir()
        source = min((folder / "forget").glob("*/*.png"))
        shutil.copy(source, forget / "face.png")
        (forget / "labels.csv").write_text(text.format(label=source.parent.name), encoding="utf-8")
        job = run(work, f"labels_{name}", work / "cache_provider", protect_args(folder, forget))
        if expect == "read":
            lines = len((job.stdout + job.stderr).splitlines())
            ok = job.proc.returncode in FINISHED and job.results is not None
            return {"exit": job.proc.returncode, "happened": f"read; {lines} lines of output",
                    "lost": "nothing", "ok": ok and lines < 200}
        row = refused(job)
        row["ok"] = row["ok"] and expect in row["happened"]
        return row
    return case


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


def case_two_runs_one_folder(work, reference):
    first = Job(work, "shared_folder", work / "cache_shared", BASE)
    first.wait_for("checkpoints/*/last.ckpt")
    second = Job(work, "shared_folder", work / "cache_shared", BASE)
    second.finish()
    first.proc.kill()
    first.finish()
    return refused(second) | {"lost": "nothing: the first run's folder untouched by the second"}


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


def quick_refusal(*overrides: str):
    def case(work, reference):
        return refused(run(work, "refusal", work / "cache_quick", [*QUICK, *overrides]))
    return case


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


def released(work: Path) -> Path:
    """The release folder of the provider example protected with QUICK settings (once)."""
    folder = provider(work)
    out = work / "released"
    if not (out / "results.json").exists():
        run(work, "released", work / "cache_provider", protect_args(folder, folder / "forget"))
    return out / json.loads((out / "results.json").read_text())["release_gate"]["folder"]  # 4 epochs: maybe refused


def tampered_release(name: str, tamper, expect: int = 2, says: str = "error:"):
    """`tamper(folder, config, weights)` edits a copy of a release, whose SHA-256 in config.json is then rewritten
    to match (a hash is no signature); `verify robust` (which loads it with load_released) must refuse it in one
    line with exit 2 before building anything, or (`expect`=1) fail it, its output holding `says`."""
    def case(work, reference):
        from safetensors.torch import load_file

        from ttp_lightning.core.files import sha256_of

        source = released(work)
        folder = work / f"tampered_{name}"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(source, folder)
        config = json.loads((folder / "config.json").read_text())
        text = tamper(folder, config, load_file(str(folder / "model.safetensors")))
        if text is None:
            config["weights"]["sha256"] = sha256_of(folder / "model.safetensors")
            text = json.dumps(config)
        (folder / "config.json").write_text(text)
        command = [sys.executable, "-m", "ttp_lightning.verify", "robust", str(folder),
                   str(provider(work) / "forget"), "--gamma", "1"]
        proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
        lines = proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines()
        last = lines[-1] if lines else ""
        if expect == 2:
            ok = proc.returncode == 2 and last.startswith(says) and "Traceback" not in proc.stderr
            return {"exit": proc.returncode, "happened": last, "lost": "nothing built or run", "ok": ok}
        shown = next((line for line in lines if says in line), last)
        ok = proc.returncode == expect and says in proc.stdout and "verified:" not in proc.stdout
        return {"exit": proc.returncode, "happened": shown, "lost": "nothing: not verified", "ok": ok}
    return case


def _nan_weights(folder, config, weights):
    from safetensors.torch import save_file

    save_file({k: v * float("nan") for k, v in weights.items()}, str(folder / "model.safetensors"))


def _input(**change):
    def tamper(folder, config, weights):
        config["input"].update(change)
    return tamper


def _huge_layer(folder, config, weights):
    config["architecture"]["hidden_dim"] = 10**12


def _nested(folder, config, weights):
    return "[" * 100_000 + "]" * 100_000


def _corrupt_header(folder, config, weights):
    (folder / "model.safetensors").write_bytes(b"\xff" * 64)


def _huge_integer(folder, config, weights):
    config["input"]["image_size"] = 0
    return json.dumps(config).replace('"image_size": 0', '"image_size": ' + "9" * 5000)


def _confident_with_claims(folder, config, weights):
    """Issue 36, case 2: one class's bias +50 (every image fully confident), the hash rewritten, and config.json's
    gate threshold, verdict and per-image claims edited to match."""
    from safetensors.torch import save_file

    bias = [name for name in weights if name.endswith("bias")][-1]
    weights[bias][3] += 50.0
    save_file(weights, str(folder / "model.safetensors"))
    protection = config["protection"]
    protection["protected"] = True
    protection["release_gate"].update(conf_dist_at_most=0.95, reasons=[])
    protection["per_image"].update(forget_worst_conf_dist=0.9, forget_exposed=0, forget_proven_worst_conf_dist=0.9)
    card = (folder / "MODEL_CARD.md").read_text().replace(": NOT PROTECTED", "", 1)
    (folder / "MODEL_CARD.md").write_text(card)


def _not_protected(folder, config, weights):
    config["protection"]["protected"] = False


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


def case_release_modes(work, reference):
    release = released(work)
    modes = {path.name: oct(path.stat().st_mode & 0o777) for path in release.iterdir()}
    same = len(set(modes.values())) == 1
    return {"exit": 0, "happened": ", ".join(f"{name} {mode}" for name, mode in sorted(modes.items())),
            "lost": "nothing" if same else "MODES DIFFER", "ok": same}


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
