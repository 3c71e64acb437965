"""The torch and triton versions torch_autows is tested with, and a one-time warning outside them.

torch_autows uses Inductor internals (``compile_fx_inner``, the choices handler, post-grad passes) and
Triton's Gluon dialect, which change between releases without notice. The ranges here are the ones
``setup.cfg`` declares. Importing this module (``torch_autows/__init__.py`` does) runs
:func:`warn_if_untested` once.
A version outside them is not refused (the runtime still falls back to torch for anything it cannot
serve); the warning names the tested range so that a surprising failure can be traced to it.
Silence it with ``warnings.filterwarnings("ignore", category=torch_autows._compat.UntestedVersionWarning)``.
"""
from __future__ import annotations

import re
import warnings

#: ``name -> (lowest tested, first untested)`` as (major, minor); keep in step with setup.cfg.
TESTED = {"torch": ((2, 11), (2, 14)), "triton": ((3, 6), (3, 7))}

_warned = False


class UntestedVersionWarning(UserWarning):
    """torch or triton is outside the range torch_autows is tested with."""


def release(version: str) -> tuple[int, int] | None:
    """``"2.13.0+cpu"`` -> ``(2, 13)``; ``"2.14.0a0+git1234"`` -> ``(2, 14)``; unparsable -> None."""
    m = re.match(r"\s*v?(\d+)\.(\d+)", str(version))
    return (int(m.group(1)), int(m.group(2))) if m else None


def spec(name: str) -> str:
    """The tested range in pip's spelling, e.g. ``torch>=2.11,<2.14``."""
    lo, hi = TESTED[name]
    return f"{name}>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]}"


def untested(versions: dict[str, str | None]) -> list[str]:
    """One phrase per package whose version is missing or outside :data:`TESTED`."""
    out = []
    for name, version in versions.items():
        lo, hi = TESTED[name]
        rel = release(version) if version else None
        if version is None:
            out.append(f"{name} is not importable (tested: {spec(name)})")
        elif rel is None or not lo <= rel < hi:
            out.append(f"{name} {version} is outside the tested range {spec(name)}")
    return out


def installed_versions() -> dict[str, str | None]:
    """The running torch and triton versions (None for one that cannot be imported)."""
    import torch

    try:
        import triton

        triton_version = getattr(triton, "__version__", None)
    except ImportError:
        triton_version = None
    return {"torch": torch.__version__, "triton": triton_version}


def warn_if_untested(versions: dict[str, str | None] | None = None) -> bool:
    """Warn once per process when torch or triton is outside the tested range; True when it warned."""
    global _warned
    if _warned:
        return False
    problems = untested(installed_versions() if versions is None else versions)
    if not problems:
        return False
    _warned = True
    warnings.warn(
        "torch_autows: " + "; ".join(problems) + ". The Inductor and Gluon internals it relies on may "
        f"differ there; install {spec('torch')} and {spec('triton')} for the tested combination.",
        UntestedVersionWarning, stacklevel=2)
    return True


warn_if_untested()
