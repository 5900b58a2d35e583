"""Where a run's time goes (issue 79): one `python -m ttp_lightning` job in this process, with a timer on each
phase of robust Alg 1 (and of the pipeline around it), printed as a table and written as JSON.

  python scripts/profile_robust.py [--out bench/profile.json] -- OVERRIDE [OVERRIDE ...]

e.g. `python scripts/profile_robust.py --out bench/profile_mnist.json -- +experiment=mnist_mlp
data.root=../shared/data method=pareto_robust`. Phases (seconds are inclusive; a phase inside another is
indented under it, and "rest" is the parent's time its listed children do not cover):

  pretraining           A(D) (0 when it was cached)
  Alg 1 fit             the whole finetuning (Lightning's loop, callbacks, checkpoints)
    training steps      every training step: the retain term, the forget term and the optimiser's step
      retain term       the retain batch's loss
      inner attack      robust Alg 1's inner maximisation on each forget batch
      bound term        B(x), the bound over each image's training ball
    validation          the parts' accuracy and CD, early stopping's attacks and proofs
      screening attack  early stopping's APGD on the forget set (every validation epoch)
      judge attack      the release judge's APGD on an epoch that could be kept
      interval proof    the interval bound at gamma on the forget set
  assessment            the attack table, the relearning attack and the per-image bounds after the fit

Run it alone on the machine: it reports wall-clock seconds. Nothing of the project's code changes; the timers
wrap its functions for this process only.
"""

import argparse
import functools
import json
import platform
import sys
import time
from pathlib import Path

import torch


class Timers:
    """Seconds and calls per phase name; a phase may run inside another."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def wrap(self, owner, attribute: str, name) -> None:
        """Time `owner.attribute` (a function or method) under `name` (a string, or a function of the call's
        arguments that returns one)."""
        original = getattr(owner, attribute)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            label = name(*args, **kwargs) if callable(name) else name
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - start
                self.calls[label] = self.calls.get(label, 0) + 1

        setattr(owner, attribute, timed)


# (phase, parent) in the order they are printed
PHASES = [("pretraining", None), ("Alg 1 fit", None), ("training steps", "Alg 1 fit"),
          ("retain term", "training steps"), ("inner attack", "training steps"), ("bound term", "training steps"),
          ("validation", "Alg 1 fit"), ("screening attack", "validation"), ("judge attack", "validation"),
          ("interval proof", "validation"), ("assessment", None)]


def install(timers: Timers) -> None:
    """The timers on the project's functions, where their callers look them up."""
    from ttp_lightning.alg1 import method, module
    from ttp_lightning.alg1.module import ParetoFinetuneModule
    from ttp_lightning.run import pipeline

    timers.wrap(pipeline, "pretrained_model", "pretraining")
    timers.wrap(method, "fit", "Alg 1 fit")
    timers.wrap(ParetoFinetuneModule, "training_step", "training steps")
    timers.wrap(ParetoFinetuneModule, "_retain_loss", "retain term")
    timers.wrap(module, "worst_forget_images", "inner attack")
    timers.wrap(ParetoFinetuneModule, "_interval_bound", "bound term")
    timers.wrap(ParetoFinetuneModule, "validation_step", "validation")
    timers.wrap(ParetoFinetuneModule, "on_validation_epoch_end", "validation")
    # early stopping's attack, then (on an epoch that could be kept) the judge's: the settings tell them apart
    timers.wrap(module, "robust_conf_dist",
                lambda net, forget, targets, settings, device, *rest, **kw:
                "judge attack" if settings.judge_steps and settings.eval_steps == settings.judge_steps
                and settings.eval_objectives == settings.judge_objectives else "screening attack")
    timers.wrap(ParetoFinetuneModule, "_proven_conf_dist", "interval proof")
    timers.wrap(pipeline, "assess", "assessment")


def report(timers: Timers, wall: float) -> tuple[list[dict], str]:
    """The phases as rows (seconds, calls, share of the wall time) and as a printed table; "validation" adds
    its two hooks (the per-batch steps and the epoch's end, where the attacks and the proof run)."""
    rows, lines = [], [f"{'phase':<24}{'seconds':>10}{'calls':>9}{'share':>8}", "-" * 51]
    for phase, parent in PHASES:
        if phase not in timers.seconds:
            continue
        depth = 0 if parent is None else 1 + (dict(PHASES)[parent] is not None)
        seconds, calls = timers.seconds[phase], timers.calls[phase]
        rows.append({"phase": phase, "parent": parent, "seconds": round(seconds, 2), "calls": calls,
                     "share": round(seconds / wall, 4)})
        lines.append(f"{'  ' * depth + phase:<24}{seconds:>10.1f}{calls:>9}{seconds / wall:>8.1%}")
        children = [child for child, up in PHASES if up == phase and child in timers.seconds]
        if children:
            rest = seconds - sum(timers.seconds[child] for child in children)
            lines.append(f"{'  ' * (depth + 1) + 'rest':<24}{rest:>10.1f}{'':>9}{rest / wall:>8.1%}")
    lines += ["-" * 51, f"{'the whole run':<24}{wall:>10.1f}"]
    return rows, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/profile.json"))
    parser.add_argument("overrides", nargs="*", help="the job's overrides, after --")
    args = parser.parse_args(argv)
    timers = Timers()
    install(timers)
    from ttp_lightning.__main__ import main as run_job

    sys.argv = ["ttp_lightning", *args.overrides]
    start, code = time.perf_counter(), 0
    try:
        run_job()
    except SystemExit as exc:  # exit 4 (not protected) is a run like any other here
        code = exc.code if isinstance(exc.code, int) else 1
    wall = time.perf_counter() - start
    rows, table = report(timers, wall)
    print(f"\nwhere the time went ({' '.join(args.overrides) or 'the default job'}; exit {code})\n{table}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"overrides": args.overrides, "exit": code, "wall_s": round(wall, 2),
                                    "machine": platform.platform(), "torch_threads": torch.get_num_threads(),
                                    "phases": rows}, indent=2) + "\n")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
