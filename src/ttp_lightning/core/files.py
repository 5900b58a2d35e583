"""Every file a run writes goes through one rename: written under a temporary name beside its target, then
moved over it, so a crash, a signal or a full disk never leaves half a file under the real name."""

import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ttp_lightning.core.errors import TTPUserError

RUN_LOCK = ".run.lock"  # held by the run writing into a run folder (one run folder, one run)


def sha256_of(path: str | Path) -> str:
    """The file's SHA-256, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def atomic_write(path: str | Path, write: Callable[[Path], object], mode: int | None = None) -> Path:
    """`write(tmp)` fills a temporary file beside `path` (permissions `mode` when given), which then
    replaces `path`; on any failure the temporary file is removed and `path` is untouched."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        if mode is not None:  # created with its permissions, never readable by others in between
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode))
        write(tmp)
        os.chmod(tmp, mode if mode is not None else _default_mode())  # safetensors creates its files 0600
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _default_mode() -> int:
    """What open() gives a new file under this process's umask (read and write for all, minus the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_text(path: str | Path, text: str, mode: int | None = None) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text), mode)


def atomic_tensors(path: str | Path, tensors: dict, mode: int | None = None, metadata: dict | None = None) -> Path:
    """Tensors as a safetensors file (host copies, contiguous: what safetensors stores), written atomically."""
    from safetensors.torch import save

    host = {name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()}
    data = save(host, metadata=metadata)  # in memory, so a failing write is the file system's OSError
    return atomic_write(path, lambda tmp: tmp.write_bytes(data), mode)


@contextmanager
def run_folder_lock(folder: str | Path, rank: int = 0) -> Iterator[None]:
    """Hold `folder`/RUN_LOCK while a run writes there (rank 0 only: a DDP run's other processes share the folder
    with it); a second run into a folder in use ends in one error line instead of resuming from, or
    overwriting, the first one's files. The lock is the operating system's (filelock), so a run that was killed
    leaves nothing that blocks the next one, and a run that ends removes the lock file (release_removing)."""
    if rank != 0:
        yield
        return
    from filelock import FileLock, Timeout

    Path(folder).mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(Path(folder) / RUN_LOCK))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise TTPUserError(f"run folder {str(folder)!r} is in use by another run (it holds {RUN_LOCK}); wait for "
                           "it to end, or give this run its own folder (hydra.run.dir=...)") from None
    try:
        yield
    finally:
        release_removing(lock)


def release_removing(lock) -> None:
    """Remove a held run-folder lock's file, then release it, so that no empty lock file is left behind. Safe
    because nobody waits on this lock (every taker tries once, timeout=0): a taker that opened the file before
    it was removed finds it still held and is refused, one after it makes a fresh file. Where an open file
    cannot be removed (Windows) it stays, empty and harmless."""
    try:
        Path(lock.lock_file).unlink(missing_ok=True)
    except OSError:
        pass
    lock.release()


SUPERSEDED = "superseded"  # where a run folder keeps an earlier run's outputs (supersede_outputs)


INCOMING = ".incoming-"  # a superseded/ folder still being filled (renamed to its time once every output is in)


def supersede_outputs(folder: str | Path, names: tuple[str, ...]) -> Path | None:
    """Move an earlier run's outputs (`names` present in `folder`, its results.json last) into
    `folder`/superseded/<time of its results.json, UTC>/, each by one rename in the same file system, so the
    folder's outputs are only ever those of the run writing there now: a release/ never stays beside a
    results.json that does not back it. Returns the new folder (None when there was nothing to move).
    The outputs go first into superseded/.incoming-<time>/, renamed to <time>/ once all are in: interrupted
    half-way, the next run moves what is left into that same folder, so a release stays beside its results.json.
    A rename that cannot be made (superseded a file, another file system) is one TTPUserError line; nothing is
    lost, for every move is a rename that either happened or did not."""
    from datetime import datetime, timezone

    folder = Path(folder)
    present = sorted((name for name in names if (folder / name).exists() or (folder / name).is_symlink()),
                     key=lambda name: (name.startswith("results"), name))  # the record that backs them last
    keep = folder / SUPERSEDED
    if keep.exists() and not keep.is_dir():
        raise TTPUserError(f"{str(keep)!r} is a file, not the folder where a run keeps an earlier run's outputs; "
                           "move it away (nothing in the run folder was changed)")
    pending = sorted(keep.glob(f"{INCOMING}*")) if keep.is_dir() else []
    if not present and not pending:
        return None
    if pending:  # an earlier move that stopped half-way: finish it in the same folder
        incoming = pending[0]
    else:
        record = folder / "results.json"
        when = record.stat().st_mtime if record.is_file() else datetime.now(timezone.utc).timestamp()
        incoming = keep / f"{INCOMING}{datetime.fromtimestamp(when, timezone.utc).strftime('%Y%m%dT%H%M%SZ')}"
    try:
        incoming.mkdir(parents=True, exist_ok=True)
        for name in present:
            os.replace(folder / name, incoming / name)
        stamp = incoming.name[len(INCOMING):]
        target, n = keep / stamp, 1
        while target.exists():
            target, n = keep / f"{stamp}-{n}", n + 1
        os.replace(incoming, target)
    except OSError as exc:
        raise TTPUserError(f"the earlier run's outputs in {str(folder)!r} cannot be moved into {str(keep)!r} "
                           f"({exc.strerror or type(exc).__name__}: {exc.filename or ''}); nothing was lost: move "
                           "them yourself, or give this run its own folder (hydra.run.dir=...)") from None
    return target
