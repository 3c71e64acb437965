"""cross_tile: a persistent consumer overlaps one tile's tail with the next tile's first step (``Options.cross_tile``).

Assumes: tile_loop ran (each partition body is one ``tile_loop``) and the grid is persistent; no ping-pong turns.
A partition it rewrites has, in its tile body, the shape software_pipeline leaves: ``head`` (inits, the ring
waits and gets of the tile, a prologue whose first mma is synchronous, then exactly one top-level ``loop``) and
``tail`` (everything after that loop: exactly one synchronous mma, ring releases, the epilogue math and stores),
with no ``release_tail``, TMA ``store`` or ``split_reduce``, and every value the tail reads from the head in
registers. A partition of another shape (the producer, a consumer whose loop is not pipelined) is left as it is.
Guarantees: in each rewritten partition the ``tile_loop`` gets ``cross_tile=True`` and its body becomes
``head(t0)``, one ``tile_next`` op, ``tail(last)``. The tile_loop then runs its body once, on the CTA's first
tile (a CTA without tiles runs nothing); ``tile_next`` runs its body once per further tile, after binding the
current tile's indices as ``<index>_prev`` and the next tile's as the indices. Its iter_args (``<x>_pt``) carry
the values the tail reads from the head (``acc``, ``l``, ``m``, ``p16_last``, ...): inits from ``head(t0)``,
yields from the next head; its results (``<x>_lt``) feed ``tail(last)``. Its body is ``tail(t)`` interleaved
with ``head'(t+1)``:

    tail(t)'s sync ops on rings it reads nothing from (Q's release and advance)
    tail(t) to its mma, issued without a wait (the last P V of tile t; its register A operand kept alive to
        the wait below)
    head'(t+1) to its first mma, issued without a wait (QK^T(t+1, 0)); its constant inits sink to their first use
    mma_wait pending=1 (wgmma groups retire in issue order: P V(t) retired), the rest of tail(t) (releases,
        normalise, stores of tile t, under QK^T(t+1, 0): their index expressions read ``<index>_prev``)
    mma_wait pending=0 (QK^T(t+1, 0) retired), the rest of head'(t+1): softmax of (t+1, 0), its pipelined loop

P V(t) goes first so that tile t's normalise and stores, not tile t+1's softmax, run under the tensor core.
Measured at sm_90a (d=128, causal): with QK^T(t+1, 0) first and the softmax between the two waits, ptxas moved
the P V wait above the softmax anyway (no overlap left) and spilled 2272 bytes (the stores' 64 addresses and the
softmax's values live together); in this order the step's register peak is below the pipelined loop's, and the
kernel spills 160 bytes at 232 consumer registers, none at 240 (the config's ``producer_regs=24``).

Names the step defines are suffixed ``_nx`` (head'(t+1)) and ``_pt`` (tail(t)). Per barrier group the order of
the ring ops is unchanged where it matters: no head' op on a group comes before a tail op on it, except a head'
wait before a tail op that addresses its slot by lag (the wait moves no counter), and then the ring is deeper
than that lag, so the wait never depends on the later release (else PassError; the checker stays for bodies
whose head waits on a ring the tail still releases). The producer is untouched.

With ``cross_tile`` set and no partition of this shape (a non-persistent grid, turns, unpipelined loops), the
program is left unchanged, with a note saying why and one log line: the option is a request, not a promise.
Without it the pass returns the program as it is (every existing kernel's IR and Gluon stay the same).

Why last: it rewrites the walk over the tiles, which exists as an op only after tile_loop; software_pipeline's
prologue, loop and epilogue are the head and tail it interleaves.
"""
from __future__ import annotations

import logging
import re
from dataclasses import replace

from ..ir import Op, Program, Value, op, walk
from . import PassError
from .code_partition import renamed_after_waits

log = logging.getLogger("torch_autows")

_SYNC = ("acquire", "wait_ready", "get", "release", "release_tail", "advance")
_REFUSED = ("turn_wait", "turn_pass", "release_tail", "store", "tma_reduce_add", "split_reduce", "tile_next")


def _defined(ops) -> list[str]:
    """Every name ``ops`` define (results, iter_args of nested loops), in order."""
    out = []
    for o in walk(ops):
        out += [r.name for r in o.results] + list(o.attr("iter_args", ()))
    return out


def _rename(o: Op, names: dict[str, str]) -> Op:
    """``o`` (and its body) reading and defining through ``names``."""
    def one(x: Op) -> Op:
        x = replace(x, operands=tuple(names.get(n, n) for n in x.operands),
                    results=tuple(Value(names.get(r.name, r.name), r.type) for r in x.results),
                    body=tuple(one(b) for b in x.body))
        if x.attr("iter_args") is not None:
            x = x.with_attrs(iter_args=tuple(names.get(n, n) for n in x.attr("iter_args")))
        return x
    return one(o)


def _prev_indices(o: Op, indices: list[str]) -> Op:
    """``o`` with every tile index in its expression attrs read as ``<index>_prev``."""
    def sub(x):
        if isinstance(x, str):
            for n in indices:
                x = re.sub(rf"\b{n}\b", f"{n}_prev", x)
            return x
        if isinstance(x, tuple):
            return tuple(sub(e) for e in x)
        return x
    return replace(o, attrs=tuple((k, sub(x)) for k, x in o.attrs))


def _sunk(ops: list[Op]) -> list[Op]:
    """``ops`` with operand-less value ops (``zeros``, ``full``) moved to just before their first reader, so a
    fresh accumulator is not live across the boundary."""
    consts = [o for o in ops if o.kind in ("zeros", "full") and not o.operands]
    out = [o for o in ops if o not in consts]
    for c in reversed(consts):
        name = c.results[0].name
        at = next((i for i, o in enumerate(out) if name in {x for b in walk((o,)) for x in b.operands}), len(out))
        out.insert(at, c)
    return out


def _shape(body: tuple[Op, ...]) -> tuple[list[Op], list[Op], str]:
    """(head, tail, "") of a tile body of the assumed shape, or ([], [], why not)."""
    bad = next((o for o in walk(body) if o.kind in _REFUSED), None)
    if bad is not None:
        return [], [], f"it has a {bad.kind}"
    loops = [i for i, o in enumerate(body) if o.kind == "loop"]
    if len(loops) != 1:
        return [], [], f"it has {len(loops)} top-level loops, not one"
    head, tail = list(body[:loops[0] + 1]), list(body[loops[0] + 1:])
    t_mmas = [o for o in tail if o.kind == "mma"]
    h_mmas = [o for o in head[:-1] if o.kind == "mma"]
    if len(t_mmas) != 1 or not h_mmas:
        return [], [], "its tail is not one mma after a pipelined loop with a prologue mma"
    for m in (t_mmas[0], h_mmas[0]):
        if m.attr("pending", 0) != 0 or m.attr("wait", True) is False:
            return [], [], f"its mma {m.results[0].name} is asynchronous already"
    if any(o.kind == "release" and o.attr("lag", 0) and o.attr("guard", True) is not False for o in head + tail):
        return [], [], "a guarded lagged release outside a loop"
    return head, tail, ""


def _group_order(step: list[tuple[str, Op]], counts: dict[str, int]) -> str:
    """Why the interleaved step breaks a ring's order ("" when it keeps it; see the module docstring)."""
    for g, count in counts.items():
        seen_h: list[Op] = []
        for who, o in step:
            if o.attr("group") != g or o.kind not in _SYNC:
                continue
            if who == "h":
                seen_h.append(o)
                continue
            lag = o.attr("lag", 0)
            if any(h.kind == "advance" for h in seen_h) or (seen_h and not (o.kind in ("get", "release") and lag)):
                return f"group {g}: the next tile's {seen_h[0].kind} would run before this tile's {o.kind}"
            if seen_h and o.kind == "release" and count <= lag:
                return f"group {g}: a ring of {count} would make the next tile's wait depend on this tile's release"
    return ""


def _overlap(tl: Op, indices: list[str], counts: dict[str, int], taken: set[str]) -> tuple[Op | None, str]:
    """The cross-tile form of one partition's tile_loop, or (None, why not)."""
    head, tail, why = _shape(tl.body)
    if why:
        return None, why
    h_defs = set(_defined(head))
    carried = list(dict.fromkeys(x for o in tail for b in walk((o,)) for x in b.operands if x in h_defs))
    types = {r.name: r.type for o in walk(head) for r in o.results}
    types.update({n: r.type for o in walk(head) for n, r in zip(o.attr("iter_args", ()), o.results)})
    smem = [x for x in carried if types[x].space != "reg"]
    if smem:
        return None, f"its tail reads %{smem[0]}, a ring slot of the head"
    t_groups = {o.attr("group") for o in tail if o.kind in _SYNC}
    free = {g for g in t_groups if all(o.kind in ("release", "advance") and not o.attr("lag", 0)
                                       for o in tail if o.attr("group") == g)}

    nx = {n: n + "_nx" for n in h_defs}
    pt = {n: n + "_pt" for n in _defined(tail)}
    pt.update({x: x + "_pt" for x in carried})
    lt = {x: x + "_lt" for x in carried}
    clash = (set(nx.values()) | set(pt.values()) | set(lt.values())) & taken
    if clash:
        raise PassError(f"cross_tile: the names {sorted(clash)[:3]} it would define exist already; rename them")

    h = _sunk([_rename(o, nx) for o in head])
    t = [_prev_indices(_rename(o, pt), indices) for o in tail]
    hi = next(i for i, o in enumerate(h) if o.kind == "mma")
    h_mma = h[hi]
    h_a = h[:hi] + [h_mma.with_attrs(wait=False)]
    t_free = [o for o in t if o.attr("group") in free]
    t_rest = [o for o in t if o not in t_free]
    ti = next(i for i, o in enumerate(t_rest) if o.kind == "mma")
    t_mma = t_rest[ti]
    t_a, t_b = t_rest[:ti] + [t_mma.with_attrs(wait=False)], t_rest[ti + 1:]
    r = t_mma.results[0]
    # a register A operand is read by the tensor core until the wait: keep it alive to there
    a_type = {**types, **{q.name: q.type for o in walk(tail) for q in o.results}}.get(
        next(o for o in tail if o.kind == "mma").operands[0])
    keep = t_mma.operands[:1] if a_type is not None and a_type.space == "reg" else ()
    # wgmma groups retire in issue order: P V(t), issued first, is what pending=1 retires
    wait_t = op("mma_wait", [Value(r.name + "_done", r.type)], [r.name, *keep], pending=1)
    r = h_mma.results[0]
    wait_h = op("mma_wait", [Value(r.name + "_r", r.type)], [r.name], pending=0)
    tagged = ([("t", o) for o in t_free] + [("t", o) for o in t_a] + [("h", o) for o in h_a] + [("t", wait_t)]
              + [("t", o) for o in t_b] + [("h", wait_h)] + [("h", o) for o in h[hi + 1:]])
    why = _group_order(tagged, counts)
    if why:
        raise PassError(f"cross_tile: {why}; the interleaving keeps each ring's order only when the head's "
                        f"sync ops on it follow the tail's (turn cross_tile off for this config)")
    y = op("yield", operands=tuple(nx[x] for x in carried))
    step = renamed_after_waits(tuple(o for _, o in tagged) + (y,))
    nxt = op("tile_next", [Value(lt[x], types[x]) for x in carried], carried, step,
             iter_args=tuple(pt[x] for x in carried))
    last = [_rename(o, lt) for o in tail]
    return replace(tl, body=(*head, nxt, *last)).with_attrs(cross_tile=True), ""


def run(program: Program, options=None) -> Program:
    """Each consumer's tile_loop in cross-tile form when ``Options.cross_tile`` asks (see the module docstring)."""
    if not program.options.cross_tile:
        return program
    for pt in program.partitions:
        if len(pt.body) != 1 or pt.body[0].kind != "tile_loop":
            raise PassError(f"cross_tile: partition {pt.name} is not one tile_loop; run passes/tile_loop first")
    why = ("the grid is not persistent" if not program.grid.persistent
           else "the partitions take ping-pong turns" if program.turns is not None else "")
    indices = [n for n, _ in program.grid.tiles]
    counts = {g.name: g.count for g in program.groups}
    parts, skipped = [], []
    for pt in program.partitions:
        new = None
        if not why:
            taken = set(_defined(pt.body))
            new, reason = _overlap(pt.body[0], indices, counts, taken)
            if new is None:
                skipped.append(f"{pt.name}: {reason}")
        parts.append(pt if new is None else replace(pt, body=(new,)))
    if why or len(skipped) == len(parts):
        note = f"cross_tile: off: {why or '; '.join(skipped)}"
        log.info("torch_autows: %s (%s); the kernel walks its tiles one after another", note, program.name)
        return replace(program, notes=(*program.notes, note))
    return replace(program, partitions=tuple(parts))
