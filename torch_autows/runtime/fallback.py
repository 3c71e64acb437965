"""Why a call did not run a generated kernel: one log line per distinct reason, and counters.

``counters`` counts calls per op: ``"gemm.autows"`` served by the generated kernel, ``"gemm.fallback"`` run
by torch because the kernel cannot serve it, ``"gemm.vendor"`` servable but sent to the vendor's path that
runtime.choice found faster; and ``"choice.measured"`` / ``"choice.cache"`` / ``"choice.prior"``: where
decisions came from. Examples and ``explain()`` read them. ``Unsupported`` is raised by the
runtime's support checks and carries the reason that is logged.

The counting and the log-once are ``torch_autows.diagnostics.calls``; ``counters`` and ``_logged`` are its
``counters`` and ``logged`` (the same objects, under the names callers use).
"""
from __future__ import annotations

from ..diagnostics import calls

counters = calls.counters
_logged = calls.logged


class Unsupported(Exception):
    """Raised by a support check: the call goes to torch, and ``str(exc)`` says why."""


def note_served(op: str) -> None:
    """A call of ``op`` ran the generated kernel."""
    calls.count(f"{op}.autows")


def note_vendor(op: str) -> None:
    """A call the generated kernel could serve went to the vendor's path, which runtime.choice found faster."""
    calls.count(f"{op}.vendor")


def note_fallback(op: str, reason: str) -> None:
    """Count a fallback and log its reason the first time this (op, reason) is seen in the process."""
    calls.count(f"{op}.fallback")
    calls.log_once((op, reason), "autows %s: falling back to torch: %s", op, reason)


def reset() -> None:
    """Forget counters and which reasons were logged (tests)."""
    calls.reset()
