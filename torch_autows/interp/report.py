"""``interpret_report``: both semantics of a Program on random small instances, under every policy.

For each seed a fresh instance (``instances.make_instance``) runs through the sequential semantics of
the Program before partitioning and through the partitioned semantics after code_partition under each
policy; every output is compared with torch. The report lists per semantics/policy how many runs
matched, the largest error, the step counts, and the first violation's full trace.
"""
from __future__ import annotations

from ..ir import Program
from .instances import Instance, make_instance
from .machine import Violation
from .ops import InterpError
from .sched import POLICIES, run_partitioned
from .sequential import run_sequential


class _Tally:
    def __init__(self, label: str):
        self.label, self.runs, self.ok, self.err, self.steps, self.first = label, 0, 0, 0.0, [], None

    def add(self, inst: Instance, fn, seed: int):
        self.runs += 1
        stats: dict = {}
        try:
            out = fn(stats)
        except (Violation, InterpError) as e:
            if self.first is None:
                self.first = (seed, inst.desc, e)
            return
        err = inst.error(out)
        self.err = max(self.err, err)
        if "steps" in stats:
            self.steps.append(stats["steps"])
        if inst.matches(out):
            self.ok += 1
        elif self.first is None:
            self.first = (seed, inst.desc, f"outputs differ from torch: max |err| = {err:g}")

    def line(self) -> str:
        steps = f"   steps {min(self.steps)}..{max(self.steps)}" if self.steps else ""
        return f"  {self.label:<34} {self.ok}/{self.runs} ok   max |err| vs torch {self.err:g}{steps}"


def interpret_report(program_before: Program | None, program_after: Program | None, *, seeds: int = 5,
                     policies=POLICIES, nprog: int = 2, shape: tuple[int, int, int] | None = None) -> tuple[bool, str]:
    """Run small random instances through the sequential semantics of ``program_before`` and the
    partitioned semantics of ``program_after`` (each policy x seed); compare every output with torch.
    Returns (ok, a human-readable report with any violation's trace)."""
    ref = program_after or program_before
    if ref is None:
        raise ValueError("interpret_report needs a program before or after the passes")
    o = ref.options
    lines = [f"interpret {ref.name}: {seeds} seeds x {len(policies)} policies"
             f" (block {o.block_m}x{o.block_n}x{o.block_k}, stages={o.stages}, data_partition={o.data_partition},"
             f" persistent={ref.grid.persistent})"]
    if program_after is not None:
        ctas = f"{nprog} persistent CTAs" if program_after.grid.persistent else "one CTA per tile"
        rings = ", ".join(f"{g.name}: {g.count} slots x {g.nbytes} B, {g.arrivals} releasing" for g in
                          program_after.groups)
        lines.append(f"  {ctas}; partitions {', '.join(p.name for p in program_after.partitions)}; rings {rings}")
    tallies = []
    if program_before is not None:
        tallies.append(_Tally("sequential (before partitioning)"))
    tallies += [_Tally(f"partitioned {pol}") for pol in policies] if program_after is not None else []
    insts = []
    try:
        for seed in range(seeds):
            inst = make_instance(ref, seed, shape=shape)
            insts.append(inst.desc)
            i = 0
            if program_before is not None:
                tallies[0].add(inst, lambda st, inst=inst: run_sequential(program_before, inst.inputs()), seed)
                i = 1
            for pol, t in zip(policies, tallies[i:]):
                t.add(inst, lambda st, inst=inst, pol=pol, seed=seed: run_partitioned(
                    program_after, inst.inputs(), policy=pol, seed=seed, nprog=nprog, stats=st), seed)
    except InterpError as e:
        return False, "\n".join(lines + [f"  cannot interpret: {e}"])
    shown = sorted(set(insts), key=insts.index)
    lines.append("  instances: " + "; ".join(shown[:4]) + (f"; ... ({len(shown)} shapes)" if len(shown) > 4 else ""))
    lines += [t.line() for t in tallies]
    ok = all(t.ok == t.runs for t in tallies)
    for t in tallies:
        if t.first is not None:
            seed, desc, e = t.first
            text = e.trace() if isinstance(e, Violation) else str(e)
            lines.append(f"  FIRST FAILURE of {t.label.strip()} (seed {seed}, {desc}):")
            lines += ["    " + ln for ln in text.splitlines()]
    lines.append("result: " + ("OK: every run matches torch, no schedule violation" if ok else "FAILED"))
    return ok, "\n".join(lines)
