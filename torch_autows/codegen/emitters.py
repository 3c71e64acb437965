"""Per-op Gluon emitters that any generation shares: ``EMITTERS[kind](ctx, op, indent) -> lines``,
registered with ``@emitter``.

Elementwise math, reductions, masks, loops, register loads and stores, ring counters and slot
indexing are plain Gluon and live here, one module per op family: ``emit_math`` (register math),
``emit_mask`` (the attention mask), ``emit_memory`` (pointer loads and stores, ring slots, split-K's
reduction), ``emit_control`` (loops and the tile walk); ``emit_base`` holds the table, ``@emitter`` and
``emit_ops``. Importing this module registers them all. What a GPU generation lowers its own way (the MMA,
TMA copies, mbarrier waits and arrivals) lives in that generation's module (``codegen/sm90.py``), whose
``EMITTERS`` ``emit_ops`` consults first. Each emitted block is preceded by a comment holding the IR
op and its partition (``emit_ops``), so a reader of the generated Gluon finds where every line came from.
"""
from __future__ import annotations

from . import emit_math, emit_memory  # noqa: F401  (their @emitter registers them in EMITTERS)
from .emit_base import EMITTERS, emit_ops, emitter
from .emit_control import tile_lines
from .emit_mask import mask_guard

__all__ = ["EMITTERS", "emit_ops", "emitter", "mask_guard", "tile_lines"]
