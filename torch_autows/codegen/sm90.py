"""Hopper (sm_90) lowering: the emitters and Gluon names that are Hopper's own.

codegen picks this module for ``program.arch.name == "sm90"`` (``codegen.gluon.LOWERINGS``). It gives:

* ``IMPORTS``: the generated module's imports from ``gluon.language.nvidia.hopper`` (``mbarrier``,
  ``tma`` and ``fence_async_shared`` are also used by the kernel prologue in ``codegen/gluon.py``);
* ``accumulator_layout(warps, n)``: the register layout of an n-wide MMA result (wgmma's
  ``NVMMADistributedLayout`` v3); reductions and broadcasts slice it (``codegen/context.py``);
* ``KIND_IMPORTS``: imports only the kernels holding an op of a kind need (the TMA reduce-add builtin);
* ``EMITTERS``: asynchronous wgmma (``mma``, ``mma_wait``), TMA copies (``load``, ``store``, ``tma_reduce_add``) and the
  mbarrier ring protocol (``acquire``, ``wait_ready``, ``release``, ``release_tail``, the ping-pong
  ``turn_wait``/``turn_pass``; the chains' ``chain_sync``). Every other kind uses the shared emitters of
  ``codegen/emitters.py``.

A new generation (``codegen/sm100.py``) provides the same three names.
"""
from __future__ import annotations

from ..ir import value_types, walk
from ..passes.memory_plan import hosted_stages
from .context import dot_a_layout, expr, v
from .emit_base import _as, emitter
from .emit_math import zeros_expr
from .emit_memory import _ago

IMPORTS = ("from triton.experimental.gluon.language.nvidia.hopper import ("
           "fence_async_shared, mbarrier, tma, warpgroup_mma,\n"
           "                                                             warpgroup_mma_wait)\n")

#: Imports a generated module adds when it holds an op of the kind (``codegen.gluon.generate``): Gluon builtins of
#: our own (``codegen/gluon_ext.py``) that triton's Hopper module lacks.
KIND_IMPORTS = {"tma_reduce_add": "from torch_autows.codegen.gluon_ext import async_reduce_add_shared_to_global, "
                                  "bulk_wait_read_only\n"}

EMITTERS: dict = {}


def accumulator_layout(warps: int, n: int) -> str:
    """The wgmma accumulator layout of an ``n``-wide result over ``warps`` warps (Gluon source)."""
    return (f"gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[{warps}, 1], "
            f"instr_shape=[16, {min(n, 256)}, 16])")


def _sm90(*kinds):
    return emitter(*kinds, table=EMITTERS)


def _row_fold_base(ctx, o) -> bool:
    """Whether ``zeros`` op ``o`` is only the base of accumulator initial values that broadcast a row vector (the
    backward's ``fold_rows``: S^T from ``add(z, lse row)``, dP^T from ``sub(z, delta row)``) over a tile that gives each
    thread two rows (r and r + 8: M = 16 * warps), every use an ``add``/``sub`` with ``z`` first, a [1, N] operand and
    a result that only enters mmas as their accumulator."""
    r = o.results[0]
    if len(r.type.shape) != 2 or r.type.dtype != "f32" or r.type.shape[0] != 16 * ctx.part.warps:
        return False
    ops = list(walk(ctx.part.body))
    types = value_types(ctx.part.body)
    users = [u for u in ops if r.name in u.operands]
    for u in users:
        if u.kind not in ("add", "sub") or len(u.operands) != 2 or u.operands[0] != r.name:
            return False
        t = types.get(u.operands[1])
        if t is None or t.space != "reg" or tuple(t.shape) != (1, r.type.shape[1]):
            return False
        s = u.results[0].name
        if not all(w.kind == "mma" and len(w.operands) == 3 and w.operands[2] == s and s not in w.operands[:2]
                   for w in ops if s in w.operands):
            return False
    return bool(users)


@_sm90("zeros")
def _zeros(ctx, o, indent):
    """``gl.zeros``; as the base of row-broadcast accumulator initial values (``_row_fold_base``), zeros signed by
    row instead: +0 in rows r, -0 in rows r + 8. Broadcast over rows, an initial value is the same in a thread's two
    rows, so its two accumulator registers are one SSA value twice, tied to the wgmma's operands: LLVM copies it
    right before the wgmma asm, after the previous wgmma's issue (S^T's, for dP^T's), and ptxas, on such copies into
    the next wgmma's accumulator while one is in flight, may wait for that one (an injected ``WARPGROUP.DEPBAR``:
    dP^T's issue waited for S^T's retire, ``codegen.compile.injected_wgmma_waits``). With the signed zeros the two
    rows' values are different instructions of equal value (z + x: fma(.., +0) and x; z - x: 0 - x and -x), no
    copies: the accumulators differ from the plain sum only in the sign of a zero."""
    r = o.results[0]
    L = ctx.layouts[r.name]
    shape = list(r.type.shape)
    zeros = zeros_expr(ctx, r)
    if not _row_fold_base(ctx, o):
        return [f"{v(r.name)} = {zeros}"]
    neg0 = f"gl.full({shape}, -2147483648, gl.int32, {L}).to(gl.float32, bitcast=True)"  # -0.0 (a literal folds to +0)
    rows = f"gl.arange(0, {shape[0]}, layout={ctx._slice(1, L)})"
    return [f"{v(r.name)} = gl.where((({rows} // 8) % 2 == 0)[:, None], {zeros}, {neg0})"]


@_sm90("acquire")
def _acquire(ctx, o, indent):
    g = ctx.groups[o.attr("group")]
    return [f"{g.name}_s = {g.name}_n % {g.count}",
            f"mbarrier.wait({g.name}_empty.index({g.name}_s), (({g.name}_n // {g.count}) & 1) ^ 1)",
            f"mbarrier.expect({g.name}_ready.index({g.name}_s), {g.nbytes})"]


@_sm90("load")
def _load(ctx, o, indent):
    g = o.attr("group")
    coords = ", ".join(expr(c) for c in o.attr("coords"))
    return [f"tma.async_copy_global_to_shared({o.attr('arg')}_desc, [{coords}], {g}_ready.index({g}_s), "
            f"{o.attr('buffer')}.index({g}_s))"]


@_sm90("wait_ready")
def _wait_ready(ctx, o, indent):
    g = ctx.groups[o.attr("group")]
    return [f"{g.name}_s = {g.name}_n % {g.count}",
            f"mbarrier.wait({g.name}_ready.index({g.name}_s), ({g.name}_n // {g.count}) & 1)"]


def _trip_from_start(ctx) -> str:
    loop = ctx.loop_stack[-1]
    return f"({loop.attr('var')} - {expr(loop.attr('lb'))})"


@_sm90("release")
def _release(ctx, o, indent):
    g = ctx.groups[o.attr("group")]
    lag = o.attr("lag", 0)
    if lag == 0:
        arrive = f"mbarrier.arrive({g.name}_empty.index({g.name}_s))"
        if o.attr("sync"):
            # the slot was read by every thread (smem_read) and one thread arrives for all: each orders its generic
            # loads before the TMA (async proxy) that refills the slot, the threads meet, then the arrive (without
            # the fence the H200 returned rows of a later tile's Q: passes/README.md, "Q in registers")
            fence = ("fence_async_shared()  # this thread's generic loads of the slot before TMA (async proxy) "
                     "refills it")
            return [fence, "gl.thread_barrier()  # every thread's loads from the slot are done before its release",
                    arrive]
        return [arrive]
    if o.attr("guard", True) is False:  # the slot of ``lag`` steps ago is always filled here
        return [f"mbarrier.arrive({g.name}_empty.index({_ago(g, lag)}))"]
    return [f"mbarrier.arrive({g.name}_empty.index({_ago(g, lag)}), pred={_trip_from_start(ctx)} >= {lag})"]


@_sm90("release_tail")
def _release_tail(ctx, o, indent):
    g = ctx.groups[o.attr("group")]
    out = []
    for j in range(1, o.attr("lag") + 1):
        out.append(f"mbarrier.arrive({g.name}_empty.index({_ago(g, j)}), pred=_trip >= {j})")
    return out


def _turn_bar(ctx) -> str:
    """The turn barriers' name (``Program.turns``, made by passes/ping_pong)."""
    if ctx.program.turns is None:
        raise ValueError("codegen: turn_wait/turn_pass without Program.turns; run passes.ping_pong to make them")
    return ctx.program.turns.name


@_sm90("turn_wait")
def _turn_wait(ctx, o, indent):
    # partition ``me`` issues its k-th mma group after partition me-1 issued its k-th (partition 0: after the
    # last partition's (k-1)-th; a fresh barrier passes the parity-1 wait, so partition 0 starts)
    first = " ^ 1" if o.attr("me") == 0 else ""
    return [f"mbarrier.wait({_turn_bar(ctx)}.index({o.attr('me')}), (turn_n & 1){first})"]


@_sm90("turn_pass")
def _turn_pass(ctx, o, indent):
    return [f"mbarrier.arrive({_turn_bar(ctx)}.index({o.attr('to')}))", "turn_n += 1"]


@_sm90("mma")
def _mma(ctx, o, indent):
    res = o.results[0]
    L = ctx.layouts[res.name]
    a, b = o.operands[:2]
    a_src = v(a)
    # A from registers: wgmma takes it in the accumulator's dot-operand layout (an smem_read reads straight into it)
    if a in ctx.layouts and ctx.layout_defs.get(ctx.layouts[a]) != dot_a_layout(L):
        a_src = f"gl.convert_layout({v(a)}, {dot_a_layout(L)})"
    r = v(res.name)
    if len(o.operands) == 3:
        call = f"warpgroup_mma({a_src}, {v(b)}, {_as(ctx, o.operands[2], L)}, is_async=True)"
    else:
        call = (f"warpgroup_mma({a_src}, {v(b)}, gl.zeros({list(res.type.shape)}, gl.float32, {L}), "
                f"use_acc=False, is_async=True)")
    if o.attr("wait", True) is False:  # issued only: a later mma_wait retires it
        return [f"{r} = {call}"]
    return [f"{r} = {call}", f"{r} = warpgroup_mma_wait(num_outstanding={o.attr('pending', 0)}, deps=({r},))"]


@_sm90("mma_wait")
def _mma_wait(ctx, o, indent):
    # operands after the first are register operands of the mma, kept alive (unmodified) until it retires
    deps = ", ".join(v(x) for x in o.operands) + ("," if len(o.operands) == 1 else "")
    lhs = v(o.results[0].name) + (", " + ", ".join("_" for _ in o.operands[1:]) if len(o.operands) > 1 else "")
    return [f"{lhs} = warpgroup_mma_wait(num_outstanding={o.attr('pending', 0)}, deps=({deps}))"]


@_sm90("smem_store")
def _smem_store(ctx, o, indent):
    # registers -> the partition's own SMEM tile (slot ``n % count`` of its counter), fenced for the async proxy
    # (the wgmma that reads it); the result names the slot
    r = o.results[0].name
    b = ctx.buffers.get(next((n for n, x in ctx.buffers.items() if x.value == r), ""))
    if b is None:
        raise ValueError(f"codegen: smem_store %{r} has no buffer; run passes.buffers/memory_plan first")
    wait = [f"bulk_wait_read_only()  # the previous TMA reduce out of {s} has been read (early_reduce_wait: the "
            f"bar.sync before this tile's reader tells every thread)" for s in _early_reduce_stages(ctx)]
    if b.count == 1:
        return [*wait, f"{v(r)} = {b.name}", f"{v(r)}.store({v(o.operands[0])})", "fence_async_shared()"]
    # several copies: slot n % count of the partition's counter of this tile (``<buf>_n``, as the interpreter's)
    return [*wait, f"{v(r)} = {b.name}.index({b.name}_n % {b.count})", f"{v(r)}.store({v(o.operands[0])})",
            "fence_async_shared()", f"{b.name}_n += 1"]


def _early_reduce_stages(ctx) -> list[str]:
    """The staging tiles of the partition's ``tma_reduce_add`` ops whose wait moves to its ``smem_store`` ops
    (``Options.early_reduce_wait``): an smem_store's tile is read by a wgmma after a partition-wide bar.sync, which
    then orders the wait before the staging store. Only where every reduce comes after an smem_store in the same
    loop body (checked by ``_tma_reduce_add``)."""
    if not ctx.program.options.early_reduce_wait:
        return []
    return [o.attr("buffer") for o in walk(ctx.part.body) if o.kind == "tma_reduce_add"]


@_sm90("smem_view")
def _smem_view(ctx, o, indent):
    # another chain's tile, after the meeting: the slot of this step's fill, n = this partition's own stores so far
    # into ``step_of``'s tile minus one (both chains store once a step)
    peer, own = (next((b for b in ctx.buffers.values() if b.value == x), None) for x in (o.operands[0],
                                                                                          o.attr("step_of")))
    if peer is None or own is None or peer.count < 2 or own.count < 2:
        raise ValueError(f"codegen: smem_view of %{o.operands[0]} needs both chains' tiles in several copies (its "
                         f"owner rewrites a copy while the reader may still read the previous); run memory_plan")
    return [f"{v(o.results[0].name)} = {peer.name}.index(({own.name}_n - 1) % {peer.count})"]


@_sm90("slice")
def _slice(ctx, o, indent):
    return [f"{v(o.results[0].name)} = {v(o.operands[0])}.slice({o.attr('start')}, {o.attr('size')}, 1)"]


@_sm90("chain_sync")
def _chain_sync(ctx, o, indent):
    # the consumer chains' per-step meeting: triton lowers the arrive to one elected thread after a partition-local
    # bar.sync, so every thread's SMEM writes (fenced by smem_store) are ordered before it; the wait is the parity of
    # this partition's meetings so far (the barrier has ``count`` arrivals a phase, one per chain)
    m = o.attr("bar")
    return [f"mbarrier.arrive({m}.index(0))", f"mbarrier.wait({m}.index(0), {m}_n & 1)", f"{m}_n += 1"]


@_sm90("store_drained")
def _store_drained(ctx, o, indent):
    # this partition's TMA stores have read their staging tiles (in a ring's bytes: Options.store_in_ring); the
    # arrive (one elected thread, after store_wait's partition-wide bar.sync) lets the ring's producer refill it
    return ["tma.store_wait(0)  # TMA has read the staging tiles", f"mbarrier.arrive({o.attr('bar')}.index(0))"]


@_sm90("wait_drained")
def _wait_drained(ctx, o, indent):
    # before the ring's first fill of a tile: the previous tile's stores out of its bytes have drained (the k-th
    # wait, k tiles so far, passes at k completed phases; a fresh barrier passes the parity-1 wait of the first)
    m, loop = o.attr("bar"), ctx.loop_stack[-1]
    return [f"if {loop.attr('var')} == {expr(loop.attr('lb'))}:",
            f"    mbarrier.wait({m}.index(0), ({m}_n & 1) ^ 1)", f"    {m}_n += 1"]


@_sm90("store")
def _store(ctx, o, indent):
    coords = ", ".join(expr(c) for c in o.attr("coords"))
    if o.attr("stage"):  # staged in the held slot of a per-tile tile this partition has read (passes/buffers)
        slot = v(o.operands[1])
        wait = ("# its wait is the next staged store's store_wait(0), before any release" if id(o) in ctx.deferred_waits
                else "tma.store_wait(0)  # TMA has read the slot: its release may hand it back to the producer")
        return [f"{slot}.store({v(o.operands[0])})  # {o.attr('stage')}'s slot, read for the last time before this",
                "fence_async_shared()",
                f"tma.async_copy_shared_to_global({o.attr('arg')}_desc, [{coords}], {slot})", wait]
    b = ctx.stage_buf[o.operands[0]]
    if b.count == 1 and not ctx.program.grid.persistent and not ctx.loop_stack and b.name in hosted_stages(ctx.program):
        # one tile a CTA, the store issued once, its staging tile in a ring's bytes no other store uses: no store
        # before it out of this tile (the chains met before it: no read of the ring is left either)
        wait, buf, step = None, b.name, []
    elif b.count == 1:
        wait = "tma.store_wait(0)  # the previous TMA store out of this staging tile has finished reading it"
        buf, step = b.name, []
    else:
        # TMA store groups are counted per issuing thread: this holds while the partition issues one store
        # per tile (checked here), so ``count - 1`` groups left in flight means slot n % count is free
        if sum(x.kind == "store" for x in walk(ctx.part.body)) != 1:
            raise ValueError(f"codegen: {b.name} has {b.count} copies but partition {ctx.part.name} issues several "
                             f"TMA stores; use store_buffers=1")
        wait = (f"tma.store_wait({b.count - 1})  # at most {b.count - 1} stores in flight: "
                f"slot {b.name}_n % {b.count} is free")
        buf, step = f"{b.name}.index({b.name}_n % {b.count})", [f"{b.name}_n += 1"]
    lines = [*([wait] if wait else []), f"{buf}.store({v(o.operands[0])})", "fence_async_shared()",
             f"tma.async_copy_shared_to_global({o.attr('arg')}_desc, [{coords}], {buf})", *step]
    if o.attr("pred"):  # after a split_reduce: only the CTA that summed the parts stores the tile
        return [f"if {v(o.attr('pred'))}_last:"] + ["    " + ln for ln in lines]
    return lines


def _reduces_before_stores(ctx) -> bool:
    """Whether the partition's TMA reduces and its TMA stores (a staged one waits at once: not counted) may share its
    bulk groups: every wait on them is then ``store_wait(0)`` or ``bulk_wait_read_only`` (all groups read), which a
    group of the other kind only makes wait longer, never less. That holds where no store stages in several copies
    (the only ``store_wait(n > 0)``): one tile a CTA with every store after every reduce (the attention backward's
    dK/dV after its walk's dQ reduces), or a persistent walk whose stores stage in one copy (the next tile's first
    reduce then also waits for this tile's stores to have read their staging tiles, which they did steps before)."""
    seen_store = False
    for x in walk(ctx.part.body):
        if x.kind == "store" and not x.attr("stage"):
            if ctx.program.grid.persistent and ctx.stage_buf[x.operands[0]].count != 1:
                return False  # store_wait(count - 1) would count the reduces' groups as stores in flight
            seen_store = True
        elif x.kind == "tma_reduce_add" and seen_store and not ctx.program.grid.persistent:
            return False
    return True


@_sm90("tma_reduce_add")
def _tma_reduce_add(ctx, o, indent):
    # registers -> the partition's own fp32 staging tile -> a TMA bulk reduce-add into the tensor (one instruction for
    # the tile, no per-element atomics; FlashAttention-3's dQ accumulation). One staging copy: the previous reduce
    # must have read it first (``store_wait(0)``: this partition issues no other TMA store)
    b = ctx.buffers.get(o.attr("buffer"))
    if b is None:
        raise ValueError(f"codegen: tma_reduce_add of %{o.operands[0]} has no staging buffer; run passes.buffers")
    if b.count != 1:
        raise ValueError(f"codegen: tma_reduce_add stages in {b.count} copies of {b.name}; only one is lowered "
                         f"(memory_plan gives 1)")
    if not _reduces_before_stores(ctx):
        raise ValueError(f"codegen: partition {ctx.part.name} issues TMA stores and reduces; store_wait counts them "
                         f"together, so the reduce's wait would be wrong: keep them in separate partitions")
    coords = ", ".join(expr(c) for c in o.attr("coords"))
    dst = f"{b.name}.permute((1, 0))" if o.attr("transposed") else b.name  # a dQ^T tile into dQ's orientation
    wait = ["tma.store_wait(0)  # the previous TMA reduce out of this staging tile has finished reading it"]
    if ctx.program.options.early_reduce_wait:  # waited at the step's smem_store (_early_reduce_stages)
        body = next((lp.body for lp in ctx.loop_stack[-1:]), ctx.part.body)
        before = body[:next((i for i, x in enumerate(body) if x is o), len(body))]
        if not any(x.kind == "smem_store" for x in before):
            raise ValueError(f"codegen: early_reduce_wait, but no smem_store precedes the reduce into {b.name} in its "
                             f"loop body (its bar.sync would order the wait); use early_reduce_wait=False")
        wait = []
    return [*wait, f"{dst}.store({v(o.operands[0])})", "fence_async_shared()",
            f"async_reduce_add_shared_to_global({o.attr('arg')}_desc, [{coords}], {b.name})"]
