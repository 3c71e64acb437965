"""Why a call did not run a generated kernel: one log line per distinct reason, and counters.

``counters`` counts calls per op: ``"gemm.autows"`` served by the generated kernel, ``"gemm.fallback"`` run
by torch because the kernel cannot serve it, ``"gemm.vendor"`` servable but sent to the vendor's path that
runtime.choice found faster; and ``"choice.measured"`` / ``"choice.cache"`` / ``"choice.prior"``: where
decisions came from. Examples and ``explain()`` read them. ``Unsupported`` is raised by the
runtime's support checks and carries the reason that is logged.
"""
from __future__ import annotations

import collections
import logging

log = logging.getLogger("torch_autows")

counters: collections.Counter[str] = collections.Counter()
_logged: set[tuple[str, str]] = set()


class Unsupported(Exception):
    """Raised by a support check: the call goes to torch, and ``str(exc)`` says why."""


def note_served(op: str) -> None:
    counters[f"{op}.autows"] += 1


def note_vendor(op: str) -> None:
    """A call the generated kernel could serve went to the vendor's path, which runtime.choice found faster."""
    counters[f"{op}.vendor"] += 1


def note_fallback(op: str, reason: str) -> None:
    """Count a fallback and log its reason the first time this (op, reason) is seen in the process."""
    counters[f"{op}.fallback"] += 1
    key = (op, reason)
    if key not in _logged:
        _logged.add(key)
        log.warning("autows %s: falling back to torch: %s", op, reason)


def reset() -> None:
    """Forget counters and which reasons were logged (tests)."""
    counters.clear()
    _logged.clear()
