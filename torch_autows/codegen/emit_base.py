"""The shared emitter table and its dispatch: ``EMITTERS`` (op kind -> ``fn(ctx, op, indent) -> lines``),
``@emitter`` to register into it (or into a generation's own table), ``emit_ops`` to emit an op list (the
generation's emitter first, else the shared one; each block after a comment holding the IR op and its partition),
and ``_as``, an operand moved into a layout. The emitters themselves are in the ``emit_*`` family modules, which
``codegen/emitters.py`` imports so that the table is full."""
from __future__ import annotations

from ..ir import format_op
from .context import Ctx, v

EMITTERS = {}


def emitter(*kinds, table: dict | None = None):
    """Register the decorated function as the emitter of ``kinds`` in ``table`` (default: the shared
    ``EMITTERS``; a generation's module passes its own)."""
    def deco(fn):
        for k in kinds:
            (EMITTERS if table is None else table)[k] = fn
        return fn
    return deco


def emit_ops(ctx: Ctx, ops, indent: int) -> list[str]:
    lines = []
    pad = "    " * indent
    for o in ops:
        fn = ctx.lowering.EMITTERS.get(o.kind) or EMITTERS.get(o.kind)
        if fn is None:
            raise NotImplementedError(f"codegen: no Gluon emitter for op kind {o.kind!r} on {ctx.program.arch.name}; "
                                      f"add one to codegen/emitters.py or codegen/{ctx.program.arch.name}.py")
        head = format_op(o)[0].strip()
        if o.kind not in ("yield", "tile_loop"):  # the tile walk's lines say what they are
            lines.append(f"{pad}# {head}  <{ctx.part.name}>")
        lines += [pad + ln if ln else ln for ln in fn(ctx, o, indent)]
    return lines


def _as(ctx, x: str, layout: str) -> str:
    """Operand ``x`` in ``layout`` (a register shuffle through SMEM only where they differ)."""
    return v(x) if ctx.layouts.get(x) == layout else f"gl.convert_layout({v(x)}, {layout})"
