"""Paths a cache or dump directory cannot use, for the filesystem-fault tests."""
from __future__ import annotations

import pytest


def unwritable(tmp_path, kind: str) -> str:
    """A directory path that cannot be used: "file" (a regular file), "file/sub" (a path under one) or
    "read-only" (skips where chmod does not stop writes, as for root)."""
    f = tmp_path / "a_file"
    f.write_text("not a directory")
    if kind == "file":
        return str(f)
    if kind == "file/sub":
        return str(f / "sub")
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        (d / "probe").write_text("")
    except OSError:
        return str(d)
    pytest.skip("running as root: chmod does not stop writes (the 'file' and 'file/sub' cases cover this)")
