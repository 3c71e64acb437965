"""What a program's values may flow into, from the template and data_partition on: accumulating outputs add
f32 into an f32 out arg nothing else touches (``_check_accumulate``), data-partition chains read only their own
values and read-only loads (``_check_chains``), split-K's parts, workspace and predicated stores agree
(``_check_split``), and an ``smem_read`` reads an SMEM tile into registers of its shape (``_check_smem_reads``)."""
from __future__ import annotations

from ..ir import Program, defs, value_types, walk
from ..ir.kinds import OPS, STRUCTURAL
from .base import _fail

#: The argument kind each accumulating output adds through: pointers (per-element atomics) or a TMA descriptor.
_TARGET_KIND = {"atomic_add_ptr": "ptr", "tma_reduce_add": "tensor"}


def _check_smem_reads(p: Program, stage: str):
    """An ``smem_read`` takes an SMEM tile and gives a register tile of the same shape and dtype (codegen reads the
    slot with ``.load(layout)``; a register operand would have no slot to read)."""
    types = value_types(p.body)
    for o in walk(p.body):
        if o.kind != "smem_read":
            continue
        src, dst = types.get(o.operands[0]), o.results[0].type
        if src is None or src.space != "smem" or dst.space != "reg":
            _fail(stage, f"smem_read of %{o.operands[0]} ({src.space if src else 'undefined'}) into {dst.space}: it "
                  f"reads an SMEM tile into registers", o)
        if (src.shape, src.dtype) != (dst.shape, dst.dtype):
            _fail(stage, f"smem_read of a {src.dtype}{list(src.shape)} tile gives {dst.dtype}{list(dst.shape)}; the "
                  f"same shape and dtype (cast after the read)", o)


def _check_accumulate(p: Program, stage: str):
    """An accumulating output (``atomic_add_ptr``, ``tma_reduce_add``) adds an f32 register tile into an f32 out arg
    of its kind (a ``ptr``; a ``tensor`` for the TMA reduce, with a coordinate per tile dim) that no other op of the
    program reads or writes: a read would see a sum other CTAs are still adding to, a plain store would race the
    adds. All adds into one arg use one kind of op."""
    types = value_types(p.body)
    args = {a.name: a for a in p.args}
    targets: dict = {}
    for o in walk(p.body):
        if OPS[o.kind].accumulates:
            first = targets.setdefault(o.attr("arg"), o)
            if first.kind != o.kind:
                _fail(stage, f"{o.kind} and {first.kind} both add into {o.attr('arg')!r}; use one kind of add", o)
    for name, o in targets.items():
        a, want = args.get(name), _TARGET_KIND.get(o.kind, "ptr")
        if a is None or a.kind != want or a.dtype != "f32" or not a.out:
            _fail(stage, f"{o.kind} adds into {name!r}, which must be an f32 {want} out arg", o)
    for o in walk(p.body):
        if not OPS[o.kind].accumulates:
            continue
        t = types[o.operands[0]]
        if t.dtype != "f32" or t.space != "reg":
            _fail(stage, f"{o.kind} adds a {t.dtype} {t.space} tile; it takes f32 registers (cast to f32 first)", o)
        if o.kind == "tma_reduce_add" and len(o.attr("coords", ())) != len(t.shape):
            _fail(stage, f"tma_reduce_add of a {len(t.shape)}-D tile has coords {o.attr('coords')!r}: one per "
                  f"dimension", o)
    for o in walk(p.body):
        if o.attr("arg") in targets and not OPS[o.kind].accumulates:
            _fail(stage, f"{o.kind} touches {o.attr('arg')!r}, which atomic adds accumulate into: only adds may "
                  f"touch it in the kernel (read the sum after it ends)", o)


def _check_chains(p: Program, stage: str):
    dmap = defs(p.body)
    for o in walk(p.body):
        if o.kind in STRUCTURAL or o.chain is None:
            continue
        for x in o.operands:
            d = dmap.get(x)
            # data_partition's dq_split: a chain reads the other chains' K tiles (read-only TMA loads) as wgmma
            # operands (whole, or column slices), and their dS tiles through views after the chains' meeting
            # (_check_meetings orders it)
            if d is None or d.kind == "loop" or o.kind == "smem_view" or (
                    o.kind in ("slice", "mma") and d.kind == "load" and p.options.dq_split):
                continue
            if d.chain is None and d.kind != "load":
                _fail(stage, f"chain {o.chain} reads %{x}, a shared value that is not a read-only load", o)
            if d.chain is not None and d.chain != o.chain:
                _fail(stage, f"chain {o.chain} reads %{x} of chain {d.chain}: chains must be independent", o)


def _check_split(p: Program, stage: str):
    """passes/split_k: each split_reduce's part count is the extent of its grid index (a counter target that
    differs lets the last arriver sum parts not written yet, or never sum); its workspace and counters are
    args of the right dtypes; a store's ``pred`` names a split_reduce result computed before it, and every
    output op writing a value computed from one has a ``pred``."""
    extents = dict(p.grid.tiles)
    reduced: set[str] = set()
    derived: set[str] = set()  # values computed from a split_reduce result: only the summing CTA may store them
    for o in walk(p.body):
        if any(x in derived for x in o.operands):
            derived.update(r.name for r in o.results)
            if OPS[o.kind].output and o.attr("pred") is None:
                _fail(stage, f"{o.kind} writes a value computed from a split_reduce without its pred: every CTA "
                      f"of the split would store", o)
        if o.kind == "split_reduce":
            if extents.get(o.attr("part")) != str(o.attr("splits")):
                _fail(stage, f"split_reduce sums {o.attr('splits')} parts but grid index {o.attr('part')!r} has "
                      f"extent {extents.get(o.attr('part'))!r}", o)
            args = {a.name: a for a in p.args}
            for name, dt in ((o.attr("ws"), "f32"), (o.attr("locks"), "i32")):
                if name not in args or args[name].kind != "ptr" or args[name].dtype != dt:
                    _fail(stage, f"split_reduce needs a ptr<{dt}> arg {name!r}", o)
            reduced.add(o.results[0].name)  # the first result carries the summing CTA's flag (the stores' pred)
            derived.update(r.name for r in o.results)
        if o.attr("pred") is not None and o.attr("pred") not in reduced:
            _fail(stage, f"{o.kind} is predicated on %{o.attr('pred')}, which is not a split_reduce result before it",
                  o)
