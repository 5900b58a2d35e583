"""Fault cases: a release edited after it was written; `verify` must refuse each edit."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

from fault_cases.jobs import REPO, protect_args, provider, run


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


def case_release_modes(work, reference):
    release = released(work)
    modes = {path.name: oct(path.stat().st_mode & 0o777) for path in release.iterdir()}
    same = len(set(modes.values())) == 1
    return {"exit": 0, "happened": ", ".join(f"{name} {mode}" for name, mode in sorted(modes.items())),
            "lost": "nothing" if same else "MODES DIFFER", "ok": same}
