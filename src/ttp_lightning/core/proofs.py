"""Proofs for the files a run reuses: pretraining cache entries, decoded-image caches and resume checkpoints.

A file written for reuse gets a keyed MAC (HMAC-SHA256) under a key that never enters the cache: 32 random
bytes in `$TTP_KEY_FILE`, by default ~/.config/ttp_lightning/cache.key, created (0600) on first use. Before a
reused file is used its MAC is recomputed; a file without one, or whose MAC differs, is reported in one
warning line, deleted and recomputed. So someone who can write to a shared cache folder but cannot read the
key can delete entries (the runs recompute them) but cannot make a run use an entry they changed or
replaced, even with its SHA-256 record rewritten to match; whoever can read the key file can. Users who want
to share a cache share the key file too (TTP_KEY_FILE pointing to a file readable by the group, and by no one
else); with different keys each user's runs recompute the other's entries.

A SHA-256 alone is no such proof: anyone who can replace a file can rewrite its hash.
"""

import functools
import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path

from ttp_lightning.core.errors import TTPUserError
from ttp_lightning.core.files import atomic_text

log = logging.getLogger(__name__)

KEY_ENV = "TTP_KEY_FILE"
DEFAULT_KEY = "~/.config/ttp_lightning/cache.key"
KEY_BYTES = 32
SUFFIX = ".mac"


def key_file() -> Path:
    return Path(os.environ.get(KEY_ENV) or DEFAULT_KEY).expanduser()


@functools.lru_cache(maxsize=4)
def _key(path: Path) -> bytes:
    """The key in `path`, created there (0600, atomically: two processes starting together agree) when absent."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # fails when another process created it first: then theirs is the key
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    _warn_if_others_can_use(path)
    try:
        key = path.read_bytes()
    except OSError as exc:
        raise TTPUserError(f"the cache key {str(path)!r} cannot be read ({exc.strerror}); set {KEY_ENV} to a key "
                           "file you can read, or remove it to have a new one made") from None
    if len(key) < KEY_BYTES:
        raise TTPUserError(f"the cache key {str(path)!r} holds {len(key)} bytes, fewer than {KEY_BYTES}; remove it "
                           "to have a new one made (every cached file is then recomputed)")
    return key


def _warn_if_others_can_use(path: Path) -> None:
    """One warning line when users outside the file's group can read or change the key (0600, or 0640 to share a
    cache with a group, is what keeps a planted cache entry from passing)."""
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        return  # reading it fails next, in one line
    if mode & 0o006:
        log.warning("the cache key %s can be %s by every user of this machine (mode %s): anyone who can read it can "
                    "sign a cache entry or checkpoint your runs will trust; chmod 600 it (or 640 to share it with "
                    "your group)", path, "read" if mode & 0o004 else "changed", oct(mode))


def mac_of(data: bytes) -> str:
    return hmac.new(_key(key_file()), data, hashlib.sha256).hexdigest()


def file_mac(path: Path) -> str:
    mac = hmac.new(_key(key_file()), digestmod=hashlib.sha256)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            mac.update(block)
    return mac.hexdigest()


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + SUFFIX)


def sign(path: Path, data: bytes | None = None) -> None:
    """Write `path`'s MAC beside it (`data`: the file's bytes, when the caller has them)."""
    atomic_text(sidecar(path), mac_of(data) if data is not None else file_mac(path))


def verified(path: Path, data: bytes | None = None) -> bool:
    """Whether `path` (or `data`, its bytes as read) carries a valid MAC."""
    stored = sidecar(path)
    if not stored.is_file():
        return False
    actual = mac_of(data) if data is not None else file_mac(path)
    return hmac.compare_digest(stored.read_text().strip(), actual)


def discard(path: Path, what: str, extra: tuple[Path, ...] = ()) -> None:
    """One warning line, then `path`, its MAC and `extra` are deleted (the caller recomputes them)."""
    log.warning("%s %s carries no valid proof (it was changed, replaced, or written without this user's key %s); "
                "deleting it and computing it again", what, path, key_file())
    for stale in (path, sidecar(path), *extra):
        stale.unlink(missing_ok=True)
