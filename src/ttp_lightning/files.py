"""Every file a run writes goes through one rename: written under a temporary name beside its target, then
moved over it, so a crash, a signal or a full disk never leaves half a file under the real name."""

import os
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | Path, write: Callable[[Path], object], mode: int | None = None) -> Path:
    """`write(tmp)` fills a temporary file beside `path` (permissions `mode` when given), which then
    replaces `path`; on any failure the temporary file is removed and `path` is untouched."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        if mode is not None:  # created with its permissions, never readable by others in between
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode))
        write(tmp)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_text(path: str | Path, text: str, mode: int | None = None) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text), mode)


def atomic_tensors(path: str | Path, tensors: dict, mode: int | None = None, metadata: dict | None = None) -> Path:
    """Tensors as a safetensors file (host copies, contiguous: what safetensors stores), written atomically."""
    from safetensors.torch import save_file

    host = {name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()}
    return atomic_write(path, lambda tmp: save_file(host, str(tmp), metadata=metadata), mode)
