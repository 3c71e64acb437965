"""ping_pong: compute partitions take turns issuing their wgmma (``options.pingpong``).

Assumes: software_pipeline ran: partition bodies are final but for the turns (loops pipelined, every
mma's retirement explicit: an mma waits for itself unless ``wait=False`` / ``pending`` > 0 says it
stays in flight until a later ``mma_wait``).
Guarantees: with ``options.pingpong`` and two or more compute partitions (those that issue mmas, i.e.
data-partitioned consumers), ``Program.turns`` is a TurnGroup over them in partition order (one
mbarrier each, counted in ``smem_bytes``: 8 B each, still within ``arch.smem_limit``) and every run of
mma issues with nothing that may block between them (an "issue group": a prologue's first mma; a
steady step's Q K^T, the rescale and the deferred P V; an epilogue's mma) is wrapped in
``turn_wait {turns, me}`` ... ``turn_pass {turns, to}``; an mma that waits for itself is split into the
issue, the pass and a ``mma_wait`` (later ops read its result), so a partition hands the turn over
before it blocks. Partition i's k-th issue group waits until partition i-1 issued its k-th (partition
0: its (k-1)-th of the last one), so one partition's softmax runs while the other's wgmma occupy the
tensor cores. Every compute partition runs the same issue groups per tile (data partitioning splits
one tile's rows), so the turns stay balanced (verify checks each partition's waits and passes pair
up, in the same loops). Without ``pingpong`` nothing changes but a note; with one compute partition
nothing at all.

Why last: the issue groups are the mma runs of the final bodies, the pipelined loop's steady step
included (its first mma and the previous step's deferred one form one group), so the turns wrap what
software_pipeline made.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Op, Program, TurnGroup, Value, op, walk
from ..ir.kinds import BLOCKING
from . import PassError

#: The name of the turn barriers (the SMEM array codegen allocates, ``turn_bar[i]``: partition i's go).
TURN_BAR = "turn_bar"

def _take_turns(body: tuple[Op, ...], me: int, turns: int) -> tuple[Op, ...]:
    """``body`` with every issue group of mmas wrapped in turn_wait / turn_pass (see the module docstring)."""
    out: list[Op] = []
    ops = list(body)
    i = 0
    while i < len(ops):
        o = ops[i]
        if o.body:
            out.append(replace(o, body=_take_turns(o.body, me, turns)))
            i += 1
            continue
        if o.kind != "mma":
            out.append(o)
            i += 1
            continue
        j = i  # the issue group ends at the last mma before anything that may block (or a nested body)
        for k in range(i + 1, len(ops)):
            if ops[k].kind in BLOCKING or ops[k].body:
                break
            if ops[k].kind == "mma":
                j = k
        group, tail = ops[i:j + 1], []
        last = group[-1]
        if last.attr("wait", True) is not False and last.attr("pending", 0) == 0:
            # issue, hand the turn over, then block on it; later ops read the retired value
            r = last.results[0]
            group[-1] = last.with_attrs(wait=False)
            tail = [op("mma_wait", [Value(r.name + "_w", r.type)], [r.name], pending=0)]
            ops[j + 1:] = [_reading(x, r.name, r.name + "_w") for x in ops[j + 1:]]
        out += [op("turn_wait", turns=turns, me=me), *group, op("turn_pass", turns=turns, to=(me + 1) % turns), *tail]
        i = j + 1
    return tuple(out)


def _reading(o: Op, old: str, new: str) -> Op:
    """``o`` (and its body) reading ``new`` where it read ``old``."""
    body = tuple(_reading(x, old, new) for x in o.body) if o.body else o.body
    return replace(o, operands=tuple(new if x == old else x for x in o.operands), body=body)


def run(program: Program, options=None) -> Program:
    """Turns between the compute partitions (those that issue mmas), when ``options.pingpong`` asks and
    there are two or more; the turn mbarriers (``Program.turns``) are added to ``smem_bytes``."""
    compute = [p for p in program.partitions if any(o.kind == "mma" for o in walk(p.body))]
    if len(compute) < 2:
        return program
    if not program.options.pingpong:  # the decision is printed either way
        note = f"ping_pong: off: {', '.join(p.name for p in compute)} issue wgmma independently"
        return replace(program, notes=program.notes + (note,))
    turns = TurnGroup(TURN_BAR, tuple(p.name for p in compute))
    idx = {name: i for i, name in enumerate(turns.partitions)}
    parts = tuple(replace(p, body=_take_turns(p.body, idx[p.name], turns.count)) if p.name in idx else p
                  for p in program.partitions)
    smem = (program.smem_bytes or 0) + turns.nbytes
    if smem > program.arch.smem_limit:
        raise PassError(f"ping_pong: {turns.count} turn barriers do not fit ({smem} B of SMEM); "
                        f"run without options.pingpong or with fewer stages")
    note = f"ping_pong: {', '.join(turns.partitions)} take turns issuing wgmma"
    return replace(program, partitions=parts, smem_bytes=smem, turns=turns, notes=program.notes + (note,))


