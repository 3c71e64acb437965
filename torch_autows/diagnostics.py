"""Counters and log-once: how the package says what it did, and why it did not, without flooding the log.

One mechanism, two instances:

- ``calls``: run-time, per call of an op. ``runtime.fallback`` counts ``"<op>.autows"`` / ``"<op>.fallback"``
  / ``"<op>.vendor"`` and logs a fallback's reason once; ``runtime.choice`` counts ``"choice.*"``.
- ``sites``: compile-time, per site in a graph. ``inductor.support`` counts ``"<op>.rewritten"`` /
  ``"<op>.left"`` / ``"gemm.choice"`` and logs once why a site was left to Inductor.
- ``faults``: things on disk that went wrong and were worked around (an unusable cache or dump directory, a
  corrupted cache entry), logged once per (source, place); nothing is counted.

A reason is logged the first time its key (usually ``(op, reason)``) is seen in the process, so a model of
48 identical layers logs one line, not 48. ``runtime.fallback.counters`` / ``_logged`` and
``inductor.support.site_counters`` / ``_logged`` are these instances' ``counters`` and ``logged`` (the same
objects; ``reset`` clears them in place). This module imports nothing from torch_autows.
"""
from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Hashable

log = logging.getLogger("torch_autows")


class Diagnostics:
    """A ``collections.Counter`` of named events and the set of keys whose message was already logged."""

    def __init__(self) -> None:
        self.counters: collections.Counter[str] = collections.Counter()
        self.logged: set[Hashable] = set()
        self._lock = threading.Lock()

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``name``."""
        self.counters[name] += n

    def log_once(self, key: Hashable, msg: str, *args: object, level: int = logging.WARNING) -> bool:
        """Log ``msg % args`` on the ``torch_autows`` logger unless ``key`` was logged before; True if it
        logged. Safe from several threads: one of them logs."""
        with self._lock:
            if key in self.logged:
                return False
            self.logged.add(key)
        log.log(level, msg, *args)
        return True

    def reset(self) -> None:
        """Forget the counts and which keys were logged (tests, examples)."""
        with self._lock:
            self.counters.clear()
            self.logged.clear()


#: Run-time: calls served, fallen back or sent to the vendor per op, and where choices came from.
calls = Diagnostics()
#: Compile-time: sites rewritten, left to Inductor or offered to autotuning, per op.
sites = Diagnostics()
#: Filesystem and cache faults worked around (diskcache, codegen.compile, the IR dump, runtime.choice).
faults = Diagnostics()


def reset() -> None:
    """Reset ``calls``, ``sites`` and ``faults``."""
    calls.reset()
    sites.reset()
    faults.reset()
