"""The jobs fault cases run (`python -m ttp_lightning` processes with their own caches and run folders) and
how their results are compared."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from ttp_lightning.core.errors import EXIT_NOT_PROTECTED

FINISHED = (0, EXIT_NOT_PROTECTED)  # a run that went to its end (4: its release gate failed)


REPO = Path(__file__).resolve().parents[2]


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


ROBUST = ["logger=none", "trainer.enable_progress_bar=false", "method=pareto_robust"]  # the default job's data
PROVABLE = [*ROBUST, "pretrain.certified.gamma=12"]  # A(D) trained for the interval bound (docs/provable.md)


CERTIFIED = [*QUICK, "model=logreg", "pretrain.norm_bound=10", "method=certified_exact", "pretrain.epochs=150"]


_REFERENCES: dict[Path, Job] = {}


def reference_run(work: Path, name: str, args: list[str]) -> Job:
    """An uninterrupted run of `args` with its own cache (once per work folder)."""
    if work / name not in _REFERENCES:
        _REFERENCES[work / name] = run(work, name, work / f"cache_{name}", args)
    return _REFERENCES[work / name]


def copy_cache(work: Path, reference: Job, name: str) -> Path:
    target = work / f"cache_{name}"
    shutil.copytree(reference.cache, target, dirs_exist_ok=True)
    return target


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


def quick_refusal(*overrides: str):
    def case(work, reference):
        return refused(run(work, "refusal", work / "cache_quick", [*QUICK, *overrides]))
    return case
