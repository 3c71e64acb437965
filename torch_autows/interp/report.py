"""``interpret_report``: both semantics of a Program on random small instances, under every policy.

For each seed a fresh instance (``instances.make_instance``) runs through the sequential semantics of
the Program before partitioning and through the partitioned semantics after code_partition under each
policy; every output is compared with torch. The report lists per semantics/policy how many runs
matched, the largest error, the step counts, and the first violation's full trace.
"""
from __future__ import annotations

from ..ir import Program
from .instances import Instance, _gemm_layout, make_instance
from .machine import Violation
from .ops import InterpError
from .sched import POLICIES, run_partitioned
from .sequential import run_sequential

#: The most work units an instance may have before ``fit_shape`` shrinks it (GEMM: batch x output tiles x
#: K steps; attention: batch x q heads x q tiles x k/v tiles): a few seconds per seed and policy set on a core.
BUDGET = 48


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _keep(x: int, block: int, tiles: int) -> int:
    """``x`` cut to at most ``tiles`` blocks, the last one as ragged as in ``x``."""
    t = _cdiv(x, block)
    return x if t <= tiles else (tiles - 1) * block + (x - (t - 1) * block)


def fit_shape(program: Program, shape: tuple[int, ...]) -> tuple[tuple[int, ...], str | None]:
    """The problem the CPU interpreter should run for a requested ``shape`` (GEMM (M, N, K); attention and its
    backward (batch, q heads, kv heads, Sq, Skv)) and a note saying what changed and why (None: nothing changed).
    A shape within ``BUDGET`` runs as asked. A larger one shrinks: each dimension to a few tiles with the
    last tile as ragged as asked, K to enough steps that the ring wraps, attention to one batch and at
    most 2 k/v heads with a GQA group of at most 2 (equal lengths stay equal)."""
    o = program.options
    names = {a.name for a in program.args}
    if {"q", "k", "v", "o", "lse"} <= names or {"q", "k", "v", "do"} <= names:  # the forward, the backward's kernels
        B, Hq, Hkv, Sq, Skv = shape
        units = B * Hq * _cdiv(Sq, o.block_m) * _cdiv(Skv, o.block_n)
        if units <= BUDGET:
            return tuple(shape), None
        g = min(Hq // Hkv, 2)
        sq = _keep(Sq, o.block_m, 2)
        new = (1, min(Hkv, 2) * g, min(Hkv, 2), sq, sq if Skv == Sq else _keep(Skv, o.block_n, 3))
        fmt = "batch={} Hq={} Hkv={} Sq={} Skv={}"
        return new, (f"interpreting {fmt.format(*new)} instead of the requested {fmt.format(*shape)}: "
                     f"{units} tile pairs is more than the CPU interpreter's budget of {BUDGET}; the small shape "
                     f"keeps the last tile's raggedness (blocks {o.block_m}x{o.block_n})")
    lay = _gemm_layout(program)
    if lay is None:
        return tuple(shape), None
    M, N, K = shape
    batch, why = lay[3], []
    if batch > 1 and (M % o.block_m or K % o.block_k):  # rows of all batches are one tensor: whole tiles only
        M, K = _cdiv(M, o.block_m) * o.block_m, _cdiv(K, o.block_k) * o.block_k
        why.append(f"a batched GEMM needs M and K in whole {o.block_m}x{o.block_k} tiles (the runtime checks it)")
    units = batch * _cdiv(M, o.block_m) * _cdiv(N, o.block_n) * _cdiv(K, o.block_k)
    if units > BUDGET:
        count = max([g.count for g in program.groups] or [o.stages])
        M, N, K = _keep(M, o.block_m, 3 if batch == 1 else 1), _keep(N, o.block_n, 2), _keep(K, o.block_k, count + 2)
        why.append(f"{units} tile-steps is more than the CPU interpreter's budget of {BUDGET}; the small shape keeps "
                   f"the last tile's raggedness and K steps enough to wrap the {count}-slot ring")
    if (M, N, K) == tuple(shape):
        return tuple(shape), None
    return (M, N, K), f"interpreting M={M} N={N} K={K} instead of the requested M={shape[0]} N={shape[1]} " \
                      f"K={shape[2]}: " + "; ".join(why)


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
    # no run proves nothing: zero seeds, no policy for a partitioned program, no semantics at all
    idle = [t.label.strip() for t in tallies if t.runs == 0]
    if program_after is not None and not policies:
        idle.append("partitioned (no policy given)")
    ok = bool(tallies) and not idle and all(t.ok == t.runs for t in tallies)
    for t in tallies:
        if t.first is not None:
            seed, desc, e = t.first
            text = e.trace() if isinstance(e, Violation) else str(e)
            lines.append(f"  FIRST FAILURE of {t.label.strip()} (seed {seed}, {desc}):")
            lines += ["    " + ln for ln in text.splitlines()]
    if idle:
        lines.append(f"result: FAILED: NOTHING RUN for {', '.join(idle)} ({seeds} seeds x {len(policies)} policies); "
                     f"pass seeds >= 1 and at least one policy")
    else:
        lines.append("result: " + ("OK: every run matches torch, no schedule violation" if ok else "FAILED"))
    return ok, "\n".join(lines)
