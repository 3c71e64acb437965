"""The tile IR, as a package:

    core.py      the records: Program, Op, Value, TileType, Arg, Grid, Arch (SM90, ARCHS), Partition,
                 Buffer, Channel, BarrierGroup, TurnGroup; ``op()`` builds an Op
    options.py   Options: a kernel's decision points (tile, partitioning, pipelining, per-template forms)
    analysis.py  queries: walk, defs, value_types, map_ops, deferred_stage_waits; index expressions: check_expr,
                 eval_expr, add_offset
    text.py      the text form: format_program / format_op print, parse_program reads the same text back
    kinds.py     the op table: OPS (name -> OpKind), kind_of, kinds(**where), STRUCTURAL, BLOCKING, LATENCY

The names above are re-exported here (``from torch_autows.ir import Program, walk, format_program, OPS``),
except ``kinds()``: ``torch_autows.ir.kinds`` is the op table's module, so import the function from it
(``from torch_autows.ir.kinds import kinds``).

The invariants each pipeline stage must satisfy are not here but in ``torch_autows/verify/``: they are
named by the pipeline's stages (``passes.pipeline.STAGES``) and read passes' analyses, a higher layer.
"""
from __future__ import annotations

from .analysis import add_offset, check_expr, deferred_stage_waits, defs, eval_expr, map_ops, value_types, walk
from .core import (
    ARCHS,
    DTYPE_BYTES,
    SM90,
    Arch,
    Arg,
    BarrierGroup,
    Buffer,
    Channel,
    Grid,
    Op,
    Partition,
    Program,
    TileType,
    TurnGroup,
    Value,
    op,
)
from .kinds import BLOCKING, LATENCY, OPS, STRUCTURAL, OpKind, kind_of
from .options import Options
from .text import format_op, format_program, parse_program

__all__ = [
    "ARCHS", "BLOCKING", "DTYPE_BYTES", "LATENCY", "OPS", "SM90", "STRUCTURAL",
    "Arch", "Arg", "BarrierGroup", "Buffer", "Channel", "Grid", "Op", "OpKind", "Options", "Partition", "Program",
    "TileType", "TurnGroup", "Value",
    "add_offset", "check_expr", "deferred_stage_waits", "defs", "eval_expr", "format_op", "format_program", "kind_of",
    "map_ops", "op", "parse_program", "value_types", "walk",
]
