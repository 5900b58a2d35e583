"""Issue 59, minor cases around the run folder: each ends in one line with nothing lost. hydra.run.dir a file (or a
file on its way), `superseded` a file, a rename across file systems, a move of an earlier run's outputs stopped
half-way (its release and its results.json stay together), and a second run into a folder in use (the first run's
.hydra/config.yaml is never overwritten)."""

import errno
import os
import subprocess
import sys
import time

import pytest

from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.core.files import INCOMING, RUN_LOCK, SUPERSEDED, supersede_outputs

OUTPUTS = ("release", "results.json", "wandb")


def _earlier_run(folder):
    (folder / "release").mkdir(parents=True)
    (folder / "release" / "model.safetensors").write_bytes(b"weights")
    (folder / "results.json").write_text('{"method": "pareto"}')


def test_superseded_being_a_file_is_one_line_and_nothing_moves(tmp_path):
    _earlier_run(tmp_path)
    (tmp_path / SUPERSEDED).write_text("mine")
    with pytest.raises(TTPUserError, match="is a file, not the folder"):
        supersede_outputs(tmp_path, OUTPUTS)
    assert (tmp_path / "release" / "model.safetensors").read_bytes() == b"weights"
    assert (tmp_path / "results.json").is_file() and (tmp_path / SUPERSEDED).read_text() == "mine"


def test_a_rename_across_file_systems_is_one_line_and_nothing_is_lost(tmp_path, monkeypatch):
    """superseded/ a mount point of another file system: os.replace fails with EXDEV."""
    _earlier_run(tmp_path)

    def cross_device(source, target):
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(source))

    monkeypatch.setattr(os, "replace", cross_device)
    with pytest.raises(TTPUserError, match="cannot be moved into .*Invalid cross-device link.*nothing was lost"):
        supersede_outputs(tmp_path, OUTPUTS)
    assert (tmp_path / "release" / "model.safetensors").is_file() and (tmp_path / "results.json").is_file()


def test_a_move_stopped_half_way_is_finished_into_the_same_folder(tmp_path, monkeypatch):
    """Killed after release/ moved and before results.json did: the next run moves results.json beside it (it
    went to <t>-1/ while its release was in <t>/)."""
    _earlier_run(tmp_path)
    real, calls = os.replace, []

    def killed_on_second(source, target):
        calls.append(source)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(source, target)

    monkeypatch.setattr(os, "replace", killed_on_second)
    with pytest.raises(KeyboardInterrupt):
        supersede_outputs(tmp_path, OUTPUTS)
    monkeypatch.setattr(os, "replace", real)
    assert not (tmp_path / "release").exists() and (tmp_path / "results.json").is_file()
    moved = supersede_outputs(tmp_path, OUTPUTS)
    assert (moved / "release" / "model.safetensors").is_file() and (moved / "results.json").is_file()
    assert [p.name for p in (tmp_path / SUPERSEDED).iterdir()] == [moved.name]
    assert not moved.name.startswith(INCOMING)
    _earlier_run(tmp_path)  # a later run's outputs get a folder of their own
    again = supersede_outputs(tmp_path, OUTPUTS)
    assert again != moved and (again / "results.json").is_file() and len(list((tmp_path / SUPERSEDED).iterdir())) == 2


@pytest.mark.parametrize("where", ["file", "under a file"])
def test_a_run_folder_that_is_a_file_is_one_line(run_main, tmp_path, where):
    blocker = tmp_path / "blocker"
    blocker.write_text("mine")
    target = blocker if where == "file" else blocker / "run"
    code, _, err, _ = run_main(f"hydra.run.dir={target}")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "is a file, not a folder" in errors[0], err
    assert "Traceback" not in err and blocker.read_text() == "mine"


def test_a_second_run_into_a_busy_folder_leaves_the_first_runs_files_alone(tmp_path):
    """The lock was taken after Hydra had written .hydra/config.yaml: the second run overwrote the first's."""
    from conftest import REPO, TINY

    out = tmp_path / "out"
    (out / ".hydra").mkdir(parents=True)
    (out / ".hydra" / "config.yaml").write_text("the first run's settings\n")
    holder = subprocess.Popen([sys.executable, "-c", f"""
import time
from filelock import FileLock
lock = FileLock({str(out / RUN_LOCK)!r})
lock.acquire()
print("held", flush=True)
time.sleep(120)
"""], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.time()
        proc = subprocess.run([sys.executable, "-m", "ttp_lightning", *TINY, f"hydra.run.dir={out}"], cwd=REPO,
                              capture_output=True, text=True, timeout=300, check=False,
                              env=dict(os.environ, WANDB_MODE="disabled"))
    finally:
        holder.kill()
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "is in use by another run" in errors[0], proc.stderr
    assert (out / ".hydra" / "config.yaml").read_text() == "the first run's settings\n"
    assert time.time() - started < 60  # refused before anything is imported or trained


def test_the_run_folder_lock_leaves_no_file_and_a_killed_runs_file_is_cleared(tmp_path):
    """Issue 63: every run folder kept an empty .run.lock. The lock is removed while still held (nobody waits on
    it), and a stale one a killed run left is removed by the next run's check."""
    from filelock import FileLock, Timeout

    from ttp_lightning.config.choices import check_not_busy
    from ttp_lightning.core.files import run_folder_lock

    with run_folder_lock(tmp_path / "run"):
        assert (tmp_path / "run" / RUN_LOCK).exists()
        with pytest.raises(Timeout):
            FileLock(str(tmp_path / "run" / RUN_LOCK)).acquire(timeout=0)
    assert not (tmp_path / "run" / RUN_LOCK).exists()
    (tmp_path / "run" / RUN_LOCK).write_text("")  # a killed run's file, held by nobody
    check_not_busy(tmp_path / "run")
    assert not (tmp_path / "run" / RUN_LOCK).exists()
