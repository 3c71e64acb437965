"""CPU interpreter of Programs, before and after partitioning, and a schedule verifier.

    run_sequential(program, inputs)             the body tile by tile (any stage up to memory_plan)
    run_partitioned(program, inputs, policy=, seed=, nprog=)
                                                the partition bodies as coroutines over mbarrier
                                                rings, SMEM slots and async wgmma/TMA, under a
                                                scheduling policy; raises ``Violation`` with a trace
    interpret_report(before, after, seeds=, policies=) -> (ok, report)
                                                random small instance, both semantics, every policy
                                                and seed, compared with torch

Op semantics live in ``ops.py`` (``@semantics("kind")``), one function per op kind.
"""
from __future__ import annotations

from . import ops_attention  # noqa: F401  (registers the attention op kinds)
from .instances import Instance, make_instance
from .machine import Violation
from .ops import SEMANTICS, InterpError, semantics
from .report import interpret_report
from .sched import POLICIES, make_policy, run_partitioned
from .sequential import run_sequential

__all__ = ["POLICIES", "SEMANTICS", "Instance", "InterpError", "Violation", "interpret_report", "make_instance",
           "make_policy", "run_partitioned", "run_sequential", "semantics"]
