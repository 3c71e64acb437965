"""Why a call did not run a generated kernel: one log line per distinct reason, and counters.

``counters`` counts served and fallen-back calls per op (``counters["gemm.autows"]``,
``counters["gemm.fallback"]``); examples and ``explain()`` read them. ``Unsupported`` is raised by the
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
