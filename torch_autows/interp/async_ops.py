"""The partitioned interpreter's asynchronous work and its handlers (``partitioned.HANDLERS`` maps the op kinds to
them): an async wgmma group (``Wgmma``: ``mma`` issues it, ``mma_wait`` or the ``pending`` bound retires it) and
an async TMA store's (or reduce-add's) read of its staging slot (``StoreRead``: ``store`` or ``tma_reduce_add``
issues it, ``PartRun.store_wait`` ends it), with ``smem_store`` and ``trans``, which hand out slot references read
at each use. ``pr`` is the running ``partitioned.PartRun``."""
from __future__ import annotations

from ..ir import Op
from .cta import SlotRef
from .ops import InterpError, apply, skipped


class Wgmma:
    """An async wgmma group: operands are read (from SMEM) when it retires at a wgmma wait."""

    def __init__(self, owner, op, step, args, refs):
        self.owner, self.op, self.step, self.args, self.refs = owner, op, step, args, refs
        self.value = None

    def describe(self) -> str:
        return f"async wgmma `{self.op.results[0].name} = mma(...)` issued by {self.owner.name} at #{self.step}"


class StoreRead:
    """An async TMA store reading its staging slot until the partition's next store_wait."""

    def __init__(self, owner, op, step, key, tag, coords, cols=None):
        self.owner, self.op, self.step, self.key, self.tag, self.coords = owner, op, step, key, tag, coords
        self.cols = cols  # the slot's columns it reads (a store staged in a column slice), None: all
        self.value = None

    def staged(self, st) -> bool:
        """Whether slot state ``st`` still holds the tile this store staged."""
        return (st.tag if self.cols is None else st.cols.get(self.cols)) == self.tag

    def data(self, st):
        return st.view.clone() if self.cols is None else st.view[:, self.cols[0]:self.cols[1]].clone()

    def describe(self) -> str:
        what = "reduce-add" if self.op.kind == "tma_reduce_add" else "store"
        return f"TMA {what} from {self.key[0]} issued by {self.owner.name} at #{self.step}"


def _trans(pr, o: Op):
    x = pr.raw(o.operands[0], o)
    if isinstance(x, SlotRef):  # a free view of the slot: still read at the use
        pr.env[o.results[0].name] = SlotRef(x.buf, x.slot, x.tag, x.group, not x.trans, x.cols)
    else:
        pr.env[o.results[0].name] = apply(pr, o, [pr.value(x, o)])[0]


def _mma(pr, o: Op):
    vals = [pr.raw(x, o) for x in o.operands]
    refs = []
    for i, x in enumerate(vals):
        if isinstance(x, SlotRef):
            pr.cta.read_slot(x, pr.name, o)  # checked at issue and again at retire
            refs.append(x)
        elif isinstance(x, Wgmma) and not (i == 2 and x.owner is pr):
            vals[i] = pr.value(x, o)  # only the accumulator may be a wgmma still in flight
    grp = Wgmma(pr, o, pr.run.step, vals, refs)
    for ref in refs:
        pr.cta.smem.slots[(ref.buf, ref.slot)].reads.append(grp)
    pr.wgmma.append(grp)
    pr.env[o.results[0].name] = grp
    if o.attr("wait", True) is not False:
        pr.retire_until(o.attr("pending", 0), o)


def _mma_wait(pr, o: Op):
    pr.retire_until(o.attr("pending", 0), o)
    pr.env[o.results[0].name] = pr.value(pr.raw(o.operands[0], o), o)


def _store(pr, o: Op):
    """``store`` and ``tma_reduce_add``: wait until the staging slot's previous TMA operation has read it, the
    register tile into the slot, fence, issue the async TMA store (reduce-add), which reads the slot until the
    partition's next store_wait (``PartRun.store_wait`` writes, or adds, the tile then). A ``store`` with ``stage``
    (passes/buffers.stage_in_slots) uses the slot its second operand holds instead: that slot must still hold the fill
    this partition waited for (not released and refilled), and the store waits for TMA to have read it
    (``tma.store_wait(0)``) before the partition goes on to release it, unless a later staged store's wait covers it
    (``ir.deferred_stage_waits``, as codegen). A slot's column slice (an epilogue in column chunks) stages the tile in
    those columns alone."""
    if skipped(pr, o):  # after a split_reduce, in a CTA that did not sum the parts
        return
    x = o.operands[0]
    cols = None
    if o.attr("stage"):
        ref = pr.raw(o.operands[1], o)
        if not isinstance(ref, SlotRef) or ref.trans:
            raise InterpError(f"interp: store of %{x} stages in %{o.operands[1]}, which is not an SMEM slot or a "
                              f"column slice of one")
        pr.cta.read_slot(ref, pr.name, o)
        key, cols = (ref.buf, ref.slot), ref.cols
        where = f"{ref.buf}[{ref.slot}]" + (f" columns {cols[0]}..{cols[1]}" if cols else "")
        who = f"{pr.name}'s register store into {where} (staging)"
    else:
        named = o.attr("buffer")  # a reduce names its staging tile (passes/buffers); a store's is found by its value
        buf = next((b for b in pr.run.program.buffers
                    if ((b.name == named) if named else (b.value == x and b.name.endswith("_stage")))), None)
        if buf is None:
            raise InterpError(f"interp: {o.kind} of %{x} has no staging buffer; run buffers/memory_plan first")
        count = buf.count or 1
        pr.store_wait(count - 1)  # tma.store_wait(count - 1): the store that last used this slot has read it
        key, where = (buf.name, pr.counters[buf.name] % count), buf.name
        pr.counters[buf.name] += 1
        who = f"{pr.name}'s register store into {where}"
    data = pr.value(pr.raw(x, o), o)
    pr.cta.check_write(key, who, pr.name, o, cols=cols)
    tag = ("stage", pr.name, pr.run.step)
    pr.cta.store_slot(key, data.transpose(0, 1) if o.attr("transposed") else data, tag, cols)
    yield None  # fence_async_shared(); then the TMA store (reduce) is issued
    rec = StoreRead(pr, o, pr.run.step, key, tag, tuple(int(pr.eval(c)) for c in o.attr("coords")), cols)
    if not rec.staged(pr.cta.smem.slots[key]):
        pr.fail("overwrite", f"{where} was overwritten between {pr.name}'s register store and its TMA "
                f"{'reduce' if o.kind == 'tma_reduce_add' else 'store'}")
    pr.cta.smem.slots[key].reads.append(rec)
    pr.stores.append(rec)
    if o.attr("stage") and id(o) not in pr.deferred_waits:
        pr.store_wait(0)


def _smem_store(pr, o: Op):
    """A register tile into the partition's own SMEM buffer of the result (slot ``n % count`` of a per-partition
    counter, as the codegen's ``<buf>_n``); overwriting bytes an unretired wgmma still reads is an ``overwrite``.
    The result is a reference to the slot, read at each use."""
    r = o.results[0].name
    buf = next((b for b in pr.run.program.buffers if b.value == r), None)
    if buf is None:
        raise InterpError(f"interp: smem_store %{r} has no buffer; run buffers/memory_plan first")
    count = buf.count or 1
    key = (buf.name, pr.counters[buf.name] % count)
    pr.counters[buf.name] += 1
    data = pr.value(pr.raw(o.operands[0], o), o)
    pr.cta.check_write(key, f"{pr.name}'s smem_store into {buf.name}[{key[1]}]", pr.name, o)
    tag = ("smem_store", buf.name, pr.counters[buf.name] - 1)  # the tile's fill n, which a peer's view expects
    pr.cta.store_slot(key, data, tag)
    pr.env[r] = SlotRef(buf.name, key[1], tag, None)


def _smem_view(pr, o: Op):
    """Another chain's smem_store tile, after the chains met: the slot of its fill n, n = this partition's own stores
    so far into ``step_of``'s tile minus one (codegen: ``<buf>.index((<own>_n - 1) % count)``), read at each use;
    a fill the owner has not stored yet (no meeting before the read) is an ``unfilled-read`` there, a rewrite while
    a wgmma of this partition still reads it an ``overwrite``."""
    bufs = pr.run.program.buffers
    peer = next((b for b in bufs if b.value == o.operands[0]), None)
    own = next((b for b in bufs if b.value == o.attr("step_of")), None)
    if peer is None or own is None:
        raise InterpError(f"interp: smem_view of %{o.operands[0]} (step_of %{o.attr('step_of')}): no buffer; run "
                          f"buffers/memory_plan first")
    n = pr.counters[own.name] - 1
    if n < 0:
        raise InterpError(f"interp: smem_view of %{o.operands[0]} before {pr.name} stored into {own.name}: the view "
                          f"follows the chain's own store of the step")
    count = peer.count or 1
    pr.env[o.results[0].name] = SlotRef(peer.name, n % count, ("smem_store", peer.name, n), None)


def _slice(pr, o: Op):
    x = pr.raw(o.operands[0], o)
    a, size = o.attr("start"), o.attr("size")
    if isinstance(x, SlotRef):  # a view of the slot's columns: still read at the use
        if x.trans or x.cols is not None:
            raise InterpError(f"interp: slice of %{o.operands[0]}, itself a view; slice the loaded tile")
        pr.env[o.results[0].name] = SlotRef(x.buf, x.slot, x.tag, x.group, False, (a, a + size))
    else:
        pr.env[o.results[0].name] = apply(pr, o, [pr.value(x, o)])[0]
