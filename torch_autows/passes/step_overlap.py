"""Intra-step mma overlap (passes/BACKWARD.md §3 "Break 2"), a rule software_pipeline applies to the loops it does
not pipeline.

Assumes: code_partition lowered the partition loop (wait_ready/get/release/advance per ring; every mma in the body
still waits right after its issue: ``wait`` unset, ``pending`` from loop_schedule).
Guarantees: in a loop step where overlap gains something (below), every mma is issued ``wait=False`` and retired by
an ``mma_wait`` placed right before the first op that needs it, with ``pending`` = the mmas of the step issued after
it (wgmma groups retire in order, so that wait retires it and every earlier one):

* a reader of its result (the wait's result is read from there on: ``code_partition.renamed_after_waits``);
* the step's end (the ``yield``): every mma still in flight is retired, the last with ``pending=0`` (FA3's
  ``warpgroup_wait<0>``), so nothing crosses a step: the next step's ``smem_store`` may overwrite a tile an mma of
  this step read, and the accumulators the loop carries are plain values;
* a register A operand stays alive up to its mma's wait (an extra operand of the wait, as software_pipeline does);
* an mma another mma of the step accumulates onto (``accumulated_into``: a head dim's Q K^T pieces, the split dQ)
  gets no wait of its own: the wait of the last mma of its chain retires it.

A ring's ``release`` (and the ``advance`` after it) moves to right after the first wait that retires every mma of the
step reading the ring's slot, with ``lag=0``: the slot of this step is free there. code_partition counted, for its
lag, the wgmma groups a reader's ``pending`` may leave in flight across steps; here none are in flight across a step,
so the ``release_tail`` code_partition put after the loop for a lag is dropped.

When overlap gains something: the body has an mma issued with ``pending=0`` (it would wait for itself right after
its issue) whose next mma does not depend on it, within the step, and is issued before its first reader: the two
then run back to back on the tensor core (attention backward: S^T = K Q^T and dP^T = V dO^T; the forward with a head
dim in pieces without deferring: its P V pieces). Elsewhere the loop is left as it is: a GEMM step issues one mma, the
forward's one-piece P V reads the QK^T of its step through the softmax, SwiGLU's two mmas keep ``pending=1`` across
steps (with ``mma_pending=0``, which no runtime config uses, they do overlap under the rule). Loops software_pipeline
pipelined (an
mma with ``wait=False`` or an ``mma_wait`` already in the body), loops holding loops and loops whose releases are
not followed by their ``advance`` are left alone too.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Op, Value, op


def _deps(body: list[Op]) -> dict[str, set[str]]:
    """Value -> every value of the step it is computed from (transitively)."""
    out: dict[str, set[str]] = {}
    for o in body:
        d = set()
        for x in o.operands:
            d |= {x} | out.get(x, set())
        for r in o.results:
            out[r.name] = d
    return out


def accumulated_into(body) -> dict[str, str]:
    """mma result -> the mma of ``body`` that accumulates onto it, for results nothing else reads (a chain of mmas on
    one accumulator: a head dim's Q K^T pieces). Such a result needs no wait of its own: wgmma groups retire in order,
    so the wait of the mma accumulating onto it retires it too; and it must get none while that mma runs, for a wait
    reads its registers, which the running wgmma is writing: ptxas then serializes every wgmma of the kernel
    ("wgmma.mma_async instructions are serialized due to non wgmma instructions reading accumulator registers",
    C7514), silently (codegen.compile.ptxas_info reports it)."""
    readers: dict[str, list[tuple[Op, int]]] = {}
    for o in body:
        for i, x in enumerate(o.operands):
            readers.setdefault(x, []).append((o, i))
    out = {}
    for o in body:
        if o.kind == "mma":
            r = readers.get(o.results[0].name, [])
            if len(r) == 1 and r[0][0].kind == "mma" and r[0][1] == 2:
                out[o.results[0].name] = r[0][0].results[0].name
    return out


def retire_plan(issued: list[str], last: int, into: dict[str, str]) -> tuple[int, list[int]]:
    """To retire ``issued[last]`` (mmas in issue order): (the index up to which ``issued`` then retires, the indices
    that get an ``mma_wait`` of their own). ``last`` moves past every mma in flight that accumulates onto the one
    there (``accumulated_into``): the wait of a chain's last issued mma retires the chain; an mma another one in
    that span accumulates onto gets no wait."""
    while last >= 0 and into.get(issued[last]) in issued[last + 1:]:
        last = issued.index(into[issued[last]])
    return last, [k for k in range(last + 1) if into.get(issued[k]) not in issued[k + 1:last + 1]]


def gains(loop: Op) -> bool:
    """Whether the loop's step has two mmas to overlap (the module docstring's rule)."""
    body = list(loop.body[:-1])
    if any(o.body or o.kind == "mma_wait" or (o.kind == "mma" and o.attr("wait", True) is False) for o in body):
        return False
    deps = _deps(body)
    mmas = [i for i, o in enumerate(body) if o.kind == "mma"]
    for i, j in zip(mmas, mmas[1:]):
        a, b = body[i], body[j]
        r = a.results[0].name
        first_reader = next((k for k in range(i + 1, len(body)) if r in body[k].operands), len(body))
        if a.attr("pending", 0) == 0 and r not in deps.get(b.results[0].name, set()) and j < first_reader:
            return True
    return False


def slot_groups(body: list[Op]) -> dict[str, str]:
    """SMEM value of the step -> ring group whose slot it is (gets and their ``trans`` views)."""
    out: dict[str, str] = {}
    for o in body:
        if o.kind == "get":
            out[o.results[0].name] = o.attr("group")
        elif o.kind in ("trans", "slice") and o.operands[0] in out:
            out[o.results[0].name] = out[o.operands[0]]
    return out


def overlap_loop(loop: Op) -> tuple[Op, set[str]] | None:
    """(the loop with its mmas overlapped within the step, groups whose release lag became 0), or None where the
    rule does not apply (see the module docstring)."""
    if not gains(loop):
        return None
    body, y = list(loop.body[:-1]), loop.body[-1]
    for i, o in enumerate(body):
        if o.kind == "release" and not (i + 1 < len(body) and body[i + 1].kind == "advance"
                                        and body[i + 1].attr("group") == o.attr("group")):
            return None
    slots = slot_groups(body)
    reads_group = {o.results[0].name: {slots[x] for x in o.operands if x in slots} for o in body if o.kind == "mma"}
    mma_ops = {o.results[0].name: o for o in body if o.kind == "mma"}
    regs = {r.name for o in body for r in o.results if r.type.space == "reg"}
    stored: set[str] = set()  # tiles smem_store wrote this step, and their views
    for o in body:
        if o.kind in ("smem_store", "smem_view") or (o.kind in ("trans", "slice") and o.operands[0] in stored):
            stored.add(o.results[0].name)
    issued: list[str] = []     # this step's mmas in issue order
    waited: set[str] = set()   # retired, with an mma_wait of their own (their value is read through it)
    held: list[Op] = []        # releases (with their advance) waiting for their slot's readers to retire
    relagged: set[str] = set()
    out: list[Op] = []

    into = accumulated_into(body)

    def wait(names) -> None:
        need = [n for n in set(names) if n in issued and n not in waited]
        last, own = retire_plan(issued, max(map(issued.index, need), default=-1), into)
        for k, r in enumerate(issued[:last + 1]):  # the earlier ones retire too: their values (and A operands) now
            if r in waited:
                continue
            waited.add(r)
            if k not in own:  # retired by the wait of the mma accumulating onto it
                continue
            m = mma_ops[r]
            a = m.operands[0]
            keep = [a] if a in regs and a not in mma_ops else []  # a register A operand: alive to here
            out.append(op("mma_wait", [Value(r + "_w", m.results[0].type)], [r, *keep], pending=len(issued) - k - 1))
        for rel, adv in list(held):
            g = rel.attr("group")
            if all(n in waited for n in issued if g in reads_group[n]):
                if rel.attr("lag", 0):
                    relagged.add(g)
                out.extend((rel.with_attrs(lag=0), adv))
                held.remove((rel, adv))

    i = 0
    while i < len(body):
        o = body[i]
        if o.kind == "release":
            held.append((o, body[i + 1]))
            wait(())
            i += 2
            continue
        # an mma accumulating onto an mma of this step in flight needs no wait: wgmma on one accumulator is ordered
        # (the split dQ's sum over the chains' keys)
        chained = o.kind == "mma" and len(o.operands) == 3 and o.operands[2] in issued
        wait(o.operands[:2] if chained else o.operands)
        if o.kind == "smem_store":  # overwrites a tile an earlier mma of the step may still read
            wait(n for n in issued if any(x in stored for x in mma_ops[n].operands[:2]))
        if o.kind == "mma":
            out.append(o.with_attrs(wait=False, pending=0))
            issued.append(o.results[0].name)
        else:
            out.append(o)
        i += 1
    wait(issued)
    return replace(loop, body=tuple(out) + (y,)), relagged


def overlapped(ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """``ops`` with the rule applied to every loop it gains in (loops inside other ops' bodies included); the
    ``release_tail`` after a loop whose release lag became 0 is dropped."""
    out: list[Op] = []
    drop: set[str] = set()
    for o in ops:
        if o.kind == "release_tail" and o.attr("group") in drop:
            continue
        if o.kind not in ("mma_wait", "release_tail"):
            drop = set()
        if o.body:
            o = replace(o, body=overlapped(o.body))
        if o.kind == "loop":
            done = overlap_loop(o)
            if done is not None:
                o, drop = done
        out.append(o)
    return tuple(out)
