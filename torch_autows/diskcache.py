"""The package's on-disk cache: one root directory, atomic writes, reads that never raise.

``root()`` is the directory every on-disk cache of the package lives under (generated kernel sources,
and whatever else wants to survive the process). It is ``torch_autows.config.cache_dir``
(TORCH_AUTOWS_CACHE_DIR) when set, else ``<Inductor's cache dir>/autows``, so TORCHINDUCTOR_CACHE_DIR
moves it along with Inductor's own caches (default ``/tmp/torchinductor_<user>/autows``). It returns
None, with one warning, when the directory cannot be created or written: callers then keep their data in
memory or in a private temporary directory, and never fail because of the cache.

``atomic_write(path, data)`` writes through a unique temporary file in the same directory and
``os.replace``, so a reader in any thread or process sees either the old file or the whole new one,
never a partial write; several writers of one path at once are safe (the last rename wins). It returns
False, with one warning per directory, instead of raising ``OSError``. ``read_text(path)`` returns the
file's exact text (no newline translation), or None when it is missing, unreadable or not UTF-8.

Files are created with ``tempfile.mkstemp``'s private mode (0600): the cache is per user, as Inductor's
is. Nothing here imports ``torch._inductor`` at module import time.
"""
from __future__ import annotations

import os
import tempfile


def _warn_once(kind: str, where: str, msg: str, *args) -> None:
    """Log ``msg`` the first time this (kind, place) goes wrong in the process (``diagnostics.faults``; imported
    here, so this module alone still loads with the standard library only)."""
    from . import diagnostics

    diagnostics.faults.log_once(("diskcache", kind, where), msg, *args)


def root() -> str | None:
    """The package's cache root, created if needed; None (warned once) when it cannot be created or
    written (a regular file in the way, a read-only directory or file system, no permission)."""
    from . import config

    d = config.cache_dir
    try:
        if not d:
            from torch._inductor.runtime.cache_dir_utils import cache_dir

            d = os.path.join(cache_dir(), "autows")
        os.makedirs(d, exist_ok=True)
        if not os.access(d, os.W_OK | os.X_OK):
            raise PermissionError(f"no write permission on {d!r}")
    except OSError as e:
        _warn_once("root", str(d), "torch_autows: cache directory %s is unusable (%s); caching in memory or a "
                   "private temporary directory instead. Set TORCH_AUTOWS_CACHE_DIR (or TORCHINDUCTOR_CACHE_DIR) "
                   "to a writable directory to keep compiled kernels across processes.", d, e)
        return None
    return d


def atomic_write(path: str, data: str | bytes) -> bool:
    """Replace ``path`` with ``data`` atomically (unique temp file in its directory, then ``os.replace``).
    True on success; False, warned once per directory, on any ``OSError`` (nothing is left behind)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    d = os.path.dirname(path) or "."
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.replace(tmp, path)
        tmp = None
        return True
    except OSError as e:
        _warn_once("write", d, "torch_autows: could not write %s (%s); going on without it. Point the setting "
                   "that chose this directory at a writable one to keep the file.", path, e)
        return False
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def read_text(path: str) -> str | None:
    """The exact text of ``path`` (UTF-8, newlines as stored), or None if it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None
