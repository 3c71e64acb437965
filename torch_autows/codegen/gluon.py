"""Gluon code generator: a partitioned Program -> warp-specialized Gluon source for its GPU generation.

Input: a Program after the whole pipeline (partitions with bodies, buffers with counts/offsets, barrier
groups, ping-pong turns: ``Program.turns``). Output: Python source of a module with one ``@gluon.jit``
function per partition and a ``kernel`` (named after the Program, aliased ``kernel``) that allocates SMEM
and mbarriers (the rings' and the turns') and calls ``gl.warp_specialize`` (first consumer as the
default partition, other consumers and the producer as workers with their warps and registers).

``LOWERINGS`` maps ``program.arch.name`` to the generation's lowering module (``sm90``: wgmma, TMA,
mbarriers; its imports head the generated module). Every op is emitted by the function registered for
its kind in that module's ``EMITTERS``, else in the shared ``emitters.EMITTERS`` (``emitters_for``);
each emitted block starts with a comment holding the IR op and its partition, so a reader of the Gluon
finds its origin.
Per partition and barrier group a counter ``<g>_n`` walks the ring: slot ``n % count``, phase
``(n // count) & 1`` (the producer waits for ``empty`` with the opposite phase: a fresh barrier
counts as released).
"""
from __future__ import annotations

from ..ir import Program, TileType, walk
from ..passes.memory_plan import hosted_stages
from . import sm90
from .context import GL_DTYPE, Ctx, expr
from .emitters import EMITTERS, emit_ops

__all__ = ["GL_DTYPE", "LOWERINGS", "block_shapes", "emitters_for", "expr", "generate", "lowering"]

#: ``Arch.name`` -> the module that lowers its generation-specific ops (``IMPORTS``, ``accumulator_layout``,
#: ``EMITTERS``); a new generation adds its module beside ``sm90.py`` and an entry here.
LOWERINGS = {"sm90": sm90}


def lowering(program: Program):
    """The lowering module of the program's GPU generation."""
    mod = LOWERINGS.get(program.arch.name)
    if mod is None:
        raise ValueError(f"codegen: no Gluon lowering for arch {program.arch.name!r} (have {sorted(LOWERINGS)}); "
                         f"add codegen/{program.arch.name}.py and list it in codegen.gluon.LOWERINGS")
    return mod


def emitters_for(arch_name: str) -> dict:
    """Op kind -> emitter as codegen uses them for ``arch_name``: the generation's own over the shared ones."""
    return {**EMITTERS, **LOWERINGS[arch_name].EMITTERS}


def _params(program: Program) -> list[str]:
    out = []
    for a in program.args:
        out.append({"tensor": f"{a.name}_desc", "ptr": f"{a.name}_ptr", "scalar": a.name}[a.kind])
    return out


#: Op kinds that name a one-slot mbarrier ``bar`` of ``count`` arrivals a phase: the chains' meetings and the stores'
#: drain signal (passes/code_partition).
BAR_KINDS = ("chain_sync", "store_drained", "wait_drained")


def meetings(program: Program) -> dict[str, int]:
    """The one-slot barriers of the partitions (``chain_sync``'s meetings, ``store_drained``'s signal), with their
    arrival count."""
    return {o.attr("bar"): o.attr("count") for pt in program.partitions for o in walk(pt.body)
            if o.kind in BAR_KINDS}


def _shared_params(program: Program) -> list[str]:
    return ([b.name for b in program.buffers] + [f"{g.name}_{k}" for g in program.groups for k in ("ready", "empty")]
            + ([program.turns.name] if program.turns else []) + sorted(meetings(program)))


def _partition_fn(program: Program, part) -> list[str]:
    ctx = Ctx(program, part, lowering(program))
    params = _params(program) + _shared_params(program)
    groups = sorted({o.attr("group") for o in walk(part.body) if o.attr("group")})
    body = [f"    {g}_n = 0" for g in groups]
    if program.turns and part.name in program.turns.partitions:
        body.append("    turn_n = 0  # mma issue groups this partition ran (ping-pong turns)")
    body += [f"    {ctx.stage_buf[o.operands[0]].name}_n = 0  # stores issued from this staging ring"
             for o in walk(part.body) if o.kind == "store" and not o.attr("stage")
             and ctx.stage_buf[o.operands[0]].count > 1]
    body += [f"    {b.name}_n = 0  # register stores into this SMEM tile's {b.count} copies"
             for o in walk(part.body) if o.kind == "smem_store"
             for b in program.buffers if b.value == o.results[0].name and b.count > 1]
    body += [f"    {m}_n = 0  # meetings of the consumer chains on {m}"
             for m in sorted({o.attr("bar") for o in walk(part.body) if o.kind == "chain_sync"})]
    body += [f"    {m}_n = 0  # tiles whose stores this partition waited for on {m}"
             for m in sorted({o.attr("bar") for o in walk(part.body) if o.kind == "wait_drained"})]
    body += emit_ops(ctx, part.body, 1)  # the tile_loop and all in it; emitters may add layouts: declare them after
    lines = ["@gluon.jit", f"def {part.name}({', '.join(params)}):",
             f"    # partition {part.name}: {part.warps} warps, {part.regs} registers"]
    lines += [f"    {name}: gl.constexpr = {d}" for name, d in sorted(ctx.layout_defs.items())]
    return lines + body


def shared_layout(t: TileType) -> str:
    """Gluon source of the NVMMA shared layout TMA would give a tile of type ``t`` (``get_default_for``): for SMEM
    no descriptor fills (``smem_store``'s buffer), so that a wgmma reads it as it reads a TMA-filled tile."""
    from triton.experimental.gluon import language as gl

    lay = gl.NVMMASharedLayout.get_default_for(list(t.shape), eval(GL_DTYPE[t.dtype], {"gl": gl}))
    return (f"gl.NVMMASharedLayout(swizzle_byte_width={lay.swizzle_byte_width}, "
            f"element_bitwidth={lay.element_bitwidth}, rank={lay.rank})")


def _kernel_fn(program: Program) -> list[str]:
    params = _params(program)
    # the entry point is named after the Program so profilers show what ran (e.g. attn_fwd_bf16_d128_...)
    lines = ["@gluon.jit", f"def {program.name}({', '.join(params)}):"]
    roots = {}
    desc_of = {}
    for o in walk(program.body):
        if o.kind in ("load", "store"):
            x = o.results[0].name if o.kind == "load" else o.operands[0]
            desc_of[x] = o.attr("arg")
    for o in (x for pt in program.partitions for x in walk(pt.body)):
        if o.kind == "tma_reduce_add":  # its staging tile, named by the op (the operand was renamed since)
            desc_of[next(b.value for b in program.buffers if b.name == o.attr("buffer"))] = o.attr("arg")
    rings = {c.buffer for c in program.channels}
    hosted = hosted_stages(program)
    for b in sorted(program.buffers, key=lambda b: (b.name in hosted, b.offset, -b.nbytes, b.name)):
        shape = [b.count, *b.type.shape] if b.name in rings or b.count > 1 else list(b.type.shape)
        layout = f"{desc_of[b.value]}_desc.layout" if b.value in desc_of else shared_layout(b.type)
        root = roots.get(b.offset)
        lines.append(f"    # buffer {b.name}: {b.type} x{b.count} at byte {b.offset}")
        if b.name in hosted:  # a store's staging tile in the bytes of the ring read last (Options.store_in_ring)
            h = next(x for x in program.buffers if x.name == hosted[b.name])
            lines.append(f"    {b.name} = {h.name}._reinterpret({GL_DTYPE[b.type.dtype]}, [{h.nbytes // b.nbytes}, "
                         f"{', '.join(map(str, shape))}], {layout}).index({(b.offset - h.offset) // b.nbytes})"
                         f"  # in {h.name}'s bytes: its fills wait for this tile's store (wait_drained)")
        elif root is None:
            roots[b.offset] = b.name
            lines.append(f"    {b.name} = gl.allocate_shared_memory({GL_DTYPE[b.type.dtype]}, {shape}, {layout})")
        else:
            lines.append(f"    {b.name} = {root}._reinterpret({GL_DTYPE[b.type.dtype]}, {shape}, {layout})"
                         f"  # reuses {root}: lifetimes do not overlap")
    for g in program.groups:
        lines.append(f"    # barriers {g.name}: {g.count} slots of {g.nbytes} B, {g.arrivals} releasing partitions "
                     f"({', '.join(g.channels)})")
        for k in ("ready", "empty"):
            lines.append(f"    {g.name}_{k} = gl.allocate_shared_memory(gl.int64, [{g.count}, 1], "
                         f"mbarrier.MBarrierLayout())")
        lines.append(f"    for i in gl.static_range({g.count}):")
        lines.append(f"        mbarrier.init({g.name}_ready.index(i), count=1)")
        lines.append(f"        mbarrier.init({g.name}_empty.index(i), count={g.arrivals})")
    t = program.turns
    if t:
        lines.append(f"    # ping-pong: {t.count} compute partitions take turns issuing wgmma ({t.name}[i]: i's go)")
        lines.append(f"    {t.name} = gl.allocate_shared_memory(gl.int64, [{t.count}, 1], mbarrier.MBarrierLayout())")
        lines.append(f"    for i in gl.static_range({t.count}):")
        lines.append(f"        mbarrier.init({t.name}.index(i), count=1)")
    drained = {o.attr("bar") for pt in program.partitions for o in walk(pt.body) if o.kind == "store_drained"}
    for m, count in sorted(meetings(program).items()):
        lines.append(f"    # the {count} storing consumers' staging tiles read by TMA, a phase a tile (store_drained)"
                     if m in drained else f"    # the {count} consumer chains meet on {m} (chain_sync)")
        lines.append(f"    {m} = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())")
        lines.append(f"    mbarrier.init({m}.index(0), count={count})")
    args = ", ".join(_params(program) + _shared_params(program))
    parts = program.partitions
    calls = ", ".join(f"({p.name}, ({args}))" for p in parts)
    lines.append(f"    gl.warp_specialize([{calls}],")
    lines.append(f"                       {[p.warps for p in parts[1:]]}, {[p.regs for p in parts[1:]]})")
    return lines


HEADER = '''"""Generated by torch_autows from Program {name}. Do not edit: change the template or the passes.

Partitions: {parts}. SMEM plan: {smem} bytes.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
{imports}'''


def generate(program: Program) -> str:
    """Gluon module source for a partitioned Program; ``kernel`` is its entry point."""
    if not program.partitions or not all(p.body for p in program.partitions):
        raise ValueError("codegen: program is not partitioned; run passes.pipeline first")
    if not all(len(p.body) == 1 and p.body[0].kind == "tile_loop" for p in program.partitions):
        raise ValueError("codegen: a partition body is not one tile_loop (the walk over the output tiles); run "
                         "passes.pipeline to its end (passes/tile_loop)")
    if not program.name.isidentifier() or program.name in {p.name for p in program.partitions}:
        raise ValueError(f"codegen: program name {program.name!r} must be an identifier unlike its partitions'")
    parts = ", ".join(f"{p.name} ({p.warps} warps, {p.regs} regs)" for p in program.partitions)
    low = lowering(program)
    kinds = {o.kind for p in program.partitions for o in walk(p.body)}
    imports = low.IMPORTS + "".join(line for k, line in sorted(getattr(low, "KIND_IMPORTS", {}).items()) if k in kinds)
    out = [HEADER.format(name=program.name, parts=parts, smem=program.smem_bytes, imports=imports)]
    for p in program.partitions:
        out += ["", ""] + _partition_fn(program, p)
    out += ["", ""] + _kernel_fn(program)
    out += ["", "", f"kernel = {program.name}  # the entry point, under a fixed name for the runtime"]
    return "\n".join(out) + "\n"


def block_shapes(program: Program) -> dict[str, tuple[tuple[int, ...], str]]:
    """Tensor arg -> (TMA block shape, dtype) of the tiles loaded from, stored to or reduced into it."""
    out = {}
    for o in walk(program.body):
        if o.kind in ("load", "store", "tma_reduce_add"):
            t: TileType = o.results[0].type if o.kind == "load" else None
            if t is None:
                t = next(r.type for x in walk(program.body) for r in x.results if r.name == o.operands[0])
            shape = tuple(t.shape)[::-1] if o.attr("transposed") else tuple(t.shape)  # a dQ^T tile into dQ
            prev = out.get(o.attr("arg"))
            if prev is not None and prev[0] != shape:
                raise ValueError(f"codegen: arg {o.attr('arg')} is accessed with blocks {prev[0]} and {shape}")
            out[o.attr("arg")] = (shape, t.dtype)
    return out
