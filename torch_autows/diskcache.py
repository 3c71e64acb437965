"""Placeholder (replaced by the cache helper's module at merge): the package's cache root and atomic writes."""
from __future__ import annotations

import logging
import os
import tempfile

from . import config

log = logging.getLogger("torch_autows")


def root() -> str | None:
    d = config.cache_dir or os.path.join(tempfile.gettempdir(), f"torchinductor_{os.getuid()}", "autows")
    try:
        os.makedirs(d, exist_ok=True)
    except OSError:
        return None
    return d


def atomic_write(path: str, data: str | bytes) -> bool:
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
        return True
    except OSError:
        return False


def read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None
