"""The package's settings, in one place. Each reads an environment variable TORCH_AUTOWS_<NAME> at import.

Change them at run time with plain assignment (``torch_autows.config.debug = True``); ``snapshot()`` returns
them as a dict, which the Inductor integration hashes into its cache key.
"""
from __future__ import annotations

import os


def _flag(name: str, default: bool) -> bool:
    v = os.environ.get(f"TORCH_AUTOWS_{name}")
    if v is None:
        return default
    return v.strip().lower() not in ("0", "false", "no", "off", "")


#: Directory to write the IR after every pipeline step (TORCH_AUTOWS_DUMP=dir); None: no dump.
dump_dir: str | None = os.environ.get("TORCH_AUTOWS_DUMP") or None
#: Run the IR verifier after every pass (always on in tests).
debug: bool = _flag("DEBUG", False)
#: Serve GEMMs with generated kernels (ops.gemm / the Inductor choice). Off: always torch.
gemm: bool = _flag("GEMM", True)
#: Serve attention with generated kernels. Off: always torch SDPA.
attention: bool = _flag("ATTENTION", True)
#: Directory for compiled kernels; None: in-memory only.
cache_dir: str | None = os.environ.get("TORCH_AUTOWS_CACHE_DIR") or None
#: Test-only: let the FX rewrites run on graphs traced on CPU as if the target were sm_90.
pretend_sm90: bool = _flag("PRETEND_SM90", False)


def snapshot() -> dict:
    """The settings that change what is compiled, as a plain dict (for cache keys and reports)."""
    return {"gemm": gemm, "attention": attention, "debug": debug, "pretend_sm90": pretend_sm90}
