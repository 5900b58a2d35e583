"""requirements.lock: the exact version of every package `make install` puts in .venv (issue 81).

pyproject.toml keeps ranges for users who install the package elsewhere; `make install` and .ci/run install
through this lock (pip's --constraint), so that a fresh clone resolves the same packages today and next month
and prints the same numbers.

  python scripts/lock.py check [--python .venv/bin/python]   # exit 1 unless .venv holds exactly the lock
  python scripts/lock.py write                                # `make lock`: resolve the ranges in a scratch venv

`write` builds a venv under the system's temporary folder, installs what `make install` installs without the
lock (the newest versions the ranges admit), and writes its `pip freeze`. Review the change in git diff and
rerun the suite and `scripts/same_numbers.py` before committing a refreshed lock.
"""

import argparse
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
TORCH = ("torch==2.14.1", "torchvision==0.29.1")  # the Makefile's; pip here is capped at these
EXTRAS = ".[dev,plots,slurm,docs]"
NO_DEPS = ("torchattacks>=3.5,<4",)  # pins requests~=2.25 it never imports (pyproject.toml's crosscheck extra)
HEADER = ("# Exact versions of every package `make install` installs (pip --constraint; issue 81).\n"
          "# Refresh with `make lock` (scripts/lock.py write), then rerun make test and scripts/same_numbers.py.\n")


def read_lock(path: Path = LOCK) -> dict[str, str]:
    """{normalised name: version} of a lock file."""
    return pins_of(path.read_text(encoding="utf-8"), str(path))


def pins_of(text: str, where: str) -> dict[str, str]:
    """{normalised name: version} from a lock or `pip freeze` text; comments and editable lines skipped."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-e"):
            continue
        name, sep, version = line.partition("==")
        if not sep:
            raise ValueError(f"{where}: {line!r} is not name==version")
        pins[normalise(name)] = version.strip()
    return pins


def normalise(name: str) -> str:
    """PEP 503's form of a distribution name (Foo_Bar and foo-bar are one package)."""
    return "-".join(name.replace("_", "-").replace(".", "-").lower().split("-"))


def frozen(python: str) -> dict[str, str]:
    """What the environment of `python` holds ({name: version}), the editable project left out."""
    text = subprocess.run([python, "-m", "pip", "freeze", "--all", "--exclude-editable"], check=True,
                          capture_output=True, text=True).stdout
    return pins_of(text, f"pip freeze of {python}")


def differences(installed: dict[str, str], lock: dict[str, str]) -> list[str]:
    """One line per package whose installed version is not the lock's, or that only one side has."""
    lines = [f"{name}: installed {installed[name]}, locked {lock[name]}"
             for name in sorted(installed.keys() & lock.keys()) if installed[name] != lock[name]]
    lines += [f"{name}: installed {installed[name]}, not in the lock" for name in sorted(installed.keys() - lock.keys())]
    lines += [f"{name}: locked {lock[name]}, not installed" for name in sorted(lock.keys() - installed.keys())]
    return lines


def check(python: str) -> int:
    found = differences(frozen(python), read_lock())
    for line in found:
        print(f"error: {line} (make install installs requirements.lock; refresh it with `make lock`)",
              file=sys.stderr)
    return 1 if found else 0


def write() -> int:
    with tempfile.TemporaryDirectory(prefix="ttp_lock_") as scratch:
        venv.create(scratch, with_pip=True)
        python = str(Path(scratch) / "bin" / "python")
        pip = [python, "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        subprocess.run([*pip, *TORCH], check=True)
        subprocess.run([*pip, "-e", EXTRAS], check=True, cwd=ROOT)
        subprocess.run([*pip, "--no-deps", *NO_DEPS], check=True)
        pins = frozen(python)
    LOCK.write_text(HEADER + "".join(f"{name}=={pins[name]}\n" for name in sorted(pins)), encoding="utf-8")
    print(f"{LOCK.relative_to(ROOT)}: {len(pins)} packages")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    checking = sub.add_parser("check", help="exit 1 unless the environment holds exactly requirements.lock")
    checking.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    sub.add_parser("write", help="resolve pyproject.toml's ranges in a scratch venv and write requirements.lock")
    args = parser.parse_args(argv)
    return check(args.python) if args.command == "check" else write()


if __name__ == "__main__":
    sys.exit(main())
