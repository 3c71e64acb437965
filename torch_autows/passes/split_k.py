"""split_k: partition the reduction loop across CTAs (``options.split_k`` parts), the K half of data partitioning.

A decode GEMM (a few rows times a large weight) has too few output tiles to keep 132 SMs streaming the
weight: 4096 columns in 64-wide tiles are 64 CTAs. Splitting the K loop into S contiguous ranges gives S
CTAs per output tile; each streams 1/S of the weight panel and the S partial sums are added afterwards.

Assumes: a Program before partitioning, whose output tile comes from one top-level ``loop`` that sums: every
loop-carried value starts as ``zeros`` and is yielded by an ``mma`` that accumulates into it (nothing else
reads the carried value inside the loop), and the loop runs from 0. Ops after the loop (the epilogue: bias,
casts, stores) read the loop's results. A loop that is not such a sum (attention's running max and
normaliser) is refused with a PassError: its parts do not add.

Guarantees (S > 1): the grid gains an outermost index ``pid_k`` of extent S; the loop runs the CTA's range
``[pid_k*per, min(steps, (pid_k+1)*per))`` with ``per = cdiv(steps, S)``; right after the loop, one
``split_reduce`` op takes every accumulator (A of them, in the loop's order; a swiglu GEMM carries two) and
returns their sums, and every output op (``store``, ``store_ptr``) gets ``pred`` = the first split_reduce result.
The Program gains the args ``ws`` (f32 workspace of A*S partial tiles per output tile) and ``locks`` (one i32
counter per output tile, zero between launches).

``split_reduce`` semantics (codegen and interpreter agree): the CTA writes its partial tiles to its slots of
``ws`` (accumulator i, part p of output tile t at tile ``t*A*S + i*S + p``); then one thread adds 1 to the
tile's counter (acq_rel, GPU scope) after a barrier of the partition: one arrival per CTA, however many
accumulators; the CTA that sees S-1 arrivals before its own is the last: it resets the counter to 0 and sums
each accumulator's S slots in slot order 0..S-1 (so the result does not depend on which CTA came last:
deterministic), and only it runs the stores (``pred``). Others get zeros and store nothing. No CTA ever
waits for another.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import OPS, Arg, Op, Program, Value, defs, op, walk
from . import PassError


def _sum_loop(program: Program) -> Op:
    loops = [o for o in program.body if o.kind == "loop"]
    if len(loops) != 1:
        raise PassError(f"split_k: {program.name} has {len(loops)} top-level loops; split_k splits exactly one "
                        f"reduction loop")
    loop = loops[0]
    d = defs(program.body)
    yields = loop.body[-1].operands
    body_defs = {r.name: o for o in walk(loop.body) for r in o.results}
    for it, init, y in zip(loop.attr("iter_args"), loop.operands, yields):
        y_op = body_defs.get(y)
        users = [o for o in walk(loop.body) if it in o.operands and o.kind != "yield"]
        if d[init].kind != "zeros" or y_op is None or y_op.kind != "mma" or len(y_op.operands) != 3 \
                or y_op.operands[2] != it or users != [y_op]:
            raise PassError(f"split_k: loop-carried %{it} of {program.name} is not a sum of mma steps from zeros "
                            f"(its parts would not add); use split_k=1")
    if str(loop.attr("lb")) != "0":
        raise PassError(f"split_k: the loop of {program.name} starts at {loop.attr('lb')}, not 0")
    return loop


def _tile_index(program: Program) -> str:
    """The linear output-tile id from the grid's indices (row-major over their extents)."""
    e = "0"
    for n, ext in program.grid.tiles:
        e = n if e == "0" else f"({e})*({ext})+{n}"
    return e


def run(program: Program, options=None) -> Program:
    opts = options or program.options
    S = opts.split_k
    if S == 1:
        return program
    if not isinstance(S, int) or S < 1:
        raise PassError(f"split_k: {S!r} parts; use an int >= 1")
    if any(n == "pid_k" for n, _ in program.grid.tiles):
        raise PassError(f"split_k: {program.name} already has a pid_k grid index")
    loop = _sum_loop(program)
    steps = loop.attr("ub")
    per = f"cdiv({steps},{S})"
    new_loop = loop.with_attrs(lb=f"pid_k*{per}", ub=f"min({steps},(pid_k+1)*{per})")
    index = _tile_index(program)
    if len(program.grid.tiles) != 2:
        raise PassError(f"split_k: {program.name} walks a {len(program.grid.tiles)}-D grid of tiles; split_k takes "
                        f"2-D grids (rows x columns of one output)")
    rows = next((o.results[0].type.shape[0] for o in walk(program.body) if o.kind == "zeros"), None)
    store = next((o for o in walk(program.body) if o.kind in ("store", "store_ptr")), None)
    if rows is None or store is None:
        raise PassError(f"split_k: {program.name} has no accumulator tile or no store to guard")
    # rows of the tile that exist (the output's first dim minus the tile's first row; a pointer store says it:
    # the swap-AB tile's rows are C's columns): the rest of the workspace slot is neither written nor read (a
    # decode GEMM has a few rows of a 64-row tile)
    if store.kind == "store_ptr":
        rows_valid = str(store.attr("rows_valid"))
    else:
        rows_valid = f"{program.arg(store.attr('arg')).dims[0]}-({store.attr('coords')[0]})"
    if len({r.type for r in loop.results}) != 1:
        raise PassError(f"split_k: the accumulators of {program.name} differ in type "
                        f"({', '.join(str(r.type) for r in loop.results)}); they share one workspace layout")
    reduced = {r.name: f"{r.name}_sum" for r in loop.results}
    first = reduced[loop.results[0].name]
    body: list[Op] = []
    for o in program.body:
        if o is loop:  # one reduction for all accumulators: one arrival per CTA on the tile's counter
            body += [new_loop, op("split_reduce", [Value(reduced[r.name], r.type) for r in loop.results],
                                  [r.name for r in loop.results], splits=S, part="pid_k", index=index, ws="ws",
                                  locks="locks", rows_valid=rows_valid)]
            continue
        o = replace(o, operands=tuple(reduced.get(x, x) for x in o.operands))
        if OPS[o.kind].output:  # a TMA or a pointer store
            o = o.with_attrs(pred=first)
        body.append(o)
    n = len(loop.results)
    ws = "S*tiles*BM*BN" if n == 1 else f"{n}*S*tiles*BM*BN"
    args = (*program.args, Arg("ws", "ptr", "f32", (ws,)), Arg("locks", "ptr", "i32", ("tiles",)))
    grid = replace(program.grid, tiles=(("pid_k", str(S)), *program.grid.tiles))
    return replace(program, args=args, grid=grid, body=tuple(body), name=f"{program.name}_sk{S}")
