"""The op table: one record per IR op kind, with the per-kind rules the passes, codegen, interpreter and verifier read.

Adding an op kind means adding its ``OpKind`` here, a Gluon emitter (``@emitter`` in a ``codegen/emit_*.py``) and
an interpreter meaning (``interp/ops.py`` ``@semantics``, or a handler in ``interp/partitioned.py``'s ``HANDLERS``
for the synchronisation ops); ``test/ir/test_ir_ops.py`` checks all three agree.

Fields:
    operands, results  (min, max) counts; max None: any number (loop, yield)
    phase        "template": templates build it and every pass sees it; "partitioned": code_partition (or a later
                 pass: software_pipeline, ping_pong, tile_loop) makes it
    axes         how the result's axes follow the operands' (data_partition's split rule; codegen's layouts):
                 "elementwise" (same shape; size-1 dims broadcast), "columns" (the rows of the operand, the columns a
                 part of its: col_split, slice), "mma" (rows from A and the accumulator,
                 columns from B), "trans" (swapped), "expand" (a new size-1 dim at ``axis``), "reduce"
                 (``axis`` removed), "source" (no tile operands: read from memory), None (no tile result)
    output       writes a kernel output; data_partition splits its operand along rows (axis 0)
    accumulates  an output that adds into memory (atomically) instead of overwriting it: several CTAs may target one
                 element (the interpreter's ``global-race`` check allows it), and data_partition may feed it a
                 per-chain partial sum instead of a row split
    row_attrs    attributes indexed by the tile's rows, which a chain of a data partition shifts by its first
                 row: (attribute, "offset") adds the row offset, (attribute, "bound") subtracts it
    blocking     may block the warp (a wait): ends a ping-pong issue group of mmas (ping_pong)
    latency      stages a user must run after it in a software pipeline (loop_schedule, verify)
    structural   a container (loop, tile_loop, tile_next) or its terminator (yield): every pass and interpreter
                 walks it as structure
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpKind:
    """The rules of one op kind (see the module docstring for the fields)."""

    name: str
    operands: tuple[int, int | None]
    results: tuple[int, int | None]
    phase: str = "template"
    axes: str | None = None
    output: bool = False
    row_attrs: tuple[tuple[str, str], ...] = ()
    blocking: bool = False
    latency: int = 0
    structural: bool = False
    accumulates: bool = False

    @property
    def elementwise(self) -> bool:
        return self.axes == "elementwise"


def _kinds(*records: OpKind) -> dict[str, OpKind]:
    return {k.name: k for k in records}


_UNARY, _BIN, _NONE, _ONE = (1, 1), (2, 2), (0, 0), (1, 1)

OPS: dict[str, OpKind] = _kinds(
    # structure
    OpKind("loop", (0, None), (0, None), structural=True),
    OpKind("yield", (0, None), _NONE, structural=True),
    # memory
    OpKind("load", _NONE, _ONE, axes="source", latency=1),
    OpKind("load_vec", _NONE, _ONE, axes="source"),
    # a masked pointer load of a 2-D tile straight into registers (the residual epilogue's R): rows row + r
    # (r < rows_valid), columns col + c (c < cols_valid) of a row-major tensor with leading dim ``ld``, else 0;
    # ``row_mod`` / ``col_mod`` (optional): rows (row + r) % row_mod, columns (col + c) % col_mod, a table read
    # periodically (the RoPE epilogue's cos/sin: a row's position is its index modulo the sequence length, a column's
    # place in its head its index modulo the head dim)
    OpKind("load_ptr", _NONE, _ONE, axes="source", row_attrs=(("row", "offset"), ("rows_valid", "bound"))),
    # a TMA store of a register tile through an SMEM staging tile: its own ``<value>_stage`` buffer, or (``stage``, set
    # by passes/buffers) the slot of a per-tile SMEM value the partition has finished reading, its second operand; the
    # store then waits for TMA to have read the slot, so the slot's release (after its last reader, this op) is safe
    OpKind("store", (1, 2), _NONE, output=True, blocking=True),
    # made by passes/split_k: the partial accumulator tiles in, the sums of the split's parts out (in the last
    # CTA), one result per operand
    OpKind("split_reduce", (1, None), (1, None), axes="elementwise", row_attrs=(("rows_valid", "bound"),)),
    # a masked pointer store of a register tile: rows row + r (r < rows_valid), columns col + c (c < cols_valid) of a
    # row-major tensor with leading dim ``ld``; ``transposed``: element (r, c) goes to (col + c) * ld + row + r (the
    # swap-AB GEMM's tile of C^T into C), so the tile's rows, which a data partition shifts, stay its rows
    OpKind("store_ptr", _UNARY, _NONE, output=True, row_attrs=(("row", "offset"), ("rows_valid", "bound"))),
    OpKind("store_vec", _UNARY, _NONE, output=True, row_attrs=(("offset", "offset"), ("valid", "bound"))),
    # store_ptr's addressing, but an atomic fp32 add into the target (attention backward's dQ workspace)
    OpKind("atomic_add_ptr", _UNARY, _NONE, output=True, accumulates=True,
           row_attrs=(("row", "offset"), ("rows_valid", "bound"))),
    # an f32 register tile added into an f32 tensor through its TMA descriptor at ``coords`` (a TMA bulk reduce-add,
    # clipped at the tensor's bounds): registers -> the partition's own SMEM staging tile -> async reduce, which reads
    # the tile until a later store_wait (attention backward's dQ in the "reduce" form, FlashAttention-3's)
    OpKind("tma_reduce_add", _UNARY, _NONE, output=True, accumulates=True, blocking=True),
    # a register tile into a partition-private SMEM slot (the result is that slot: an A operand an mma reads
    # transposed, attention backward's dS)
    OpKind("smem_store", _UNARY, _ONE, axes="elementwise"),
    # the per-step meeting of ``count`` consumer chains on one mbarrier ``bar`` (arrive, then wait for the phase of this
    # partition's ``bar`` counter): SMEM a chain wrote before it (smem_store) is then readable by the others, and a slot
    # they read before their own meeting is not rewritten by its owner before its next one (FA3's shared dS; the
    # attention backward's split dQ, passes/BACKWARD.md step 8 (b)); no operands, no results
    OpKind("chain_sync", _NONE, _NONE, blocking=True),
    # another chain's smem_store tile, read in this chain after their meeting (chain_sync): the operand is that tile
    # (the sequential meaning); partitioned, the slot of the owner's fill n, n this chain's own stores so far into
    # the tile ``step_of`` (both chains store once a step); no channel: the meeting orders it (made by data_partition's
    # ``dq_split``)
    OpKind("smem_view", _UNARY, _ONE, axes="elementwise"),
    # an SMEM tile read into registers (Gluon ``.load(layout)``), in the layout its users need: a small TMA-loaded
    # tile the math reads as a register operand (attention backward's lse2/delta rows, which the producer loads with
    # Q and dO instead of each consumer reading them from global memory at the top of every step)
    OpKind("smem_read", _UNARY, _ONE, axes="elementwise"),
    # a view of ``size`` columns from ``start`` of an SMEM tile (Gluon ``.slice(start, size, 1)``; a wgmma operand,
    # or an epilogue's column chunk of a TMA-loaded tile)
    OpKind("slice", _UNARY, _ONE, axes="columns"),
    # a register tile's columns in equal chunks, in order (a power of two of them): an epilogue in column chunks keeps
    # a wide accumulator's temporaries to a chunk's registers (templates/gemm.py). In wgmma's accumulator layout a
    # thread holds the same columns of every chunk, so it moves no data (codegen: reshape, permute, split)
    OpKind("col_split", _UNARY, (2, None), axes="columns"),
    # math
    OpKind("mma", (2, 3), _ONE, axes="mma"),
    OpKind("trans", _UNARY, _ONE, axes="trans"),
    OpKind("expand", _UNARY, _ONE, axes="expand"),
    OpKind("reduce_max", _UNARY, _ONE, axes="reduce"),
    OpKind("reduce_sum", _UNARY, _ONE, axes="reduce"),
    OpKind("zeros", _NONE, _ONE, axes="elementwise"),
    OpKind("full", _NONE, _ONE, axes="elementwise"),
    OpKind("add", _BIN, _ONE, axes="elementwise"),
    OpKind("sub", _BIN, _ONE, axes="elementwise"),
    OpKind("mul", _BIN, _ONE, axes="elementwise"),
    OpKind("max", _BIN, _ONE, axes="elementwise"),
    OpKind("div0", _BIN, _ONE, axes="elementwise"),
    OpKind("lse", _BIN, _ONE, axes="elementwise"),
    OpKind("cast", _UNARY, _ONE, axes="elementwise"),
    OpKind("exp2", _UNARY, _ONE, axes="elementwise"),
    OpKind("silu", _UNARY, _ONE, axes="elementwise"),  # x * sigmoid(x), fp32 (the swiglu epilogue)
    # the swiglu backward's epilogue: sigmoid(x); silu's derivative s * (1 + x * (1 - s)) from x and s = sigmoid(x)
    # (operands x, s: the sigmoid is computed once for silu and its derivative), fp32
    OpKind("sigmoid", _UNARY, _ONE, axes="elementwise"),
    OpKind("silu_grad", _BIN, _ONE, axes="elementwise"),
    # F.gelu in fp32, attr approximate "tanh" or "none" (erf) (the GEMM activation epilogue)
    OpKind("gelu", _UNARY, _ONE, axes="elementwise"),
    # RoPE's rotate-half on each group of ``width`` columns (a head): column c of a group takes -x[c + width/2] for
    # c < width/2, else x[c - width/2] (torch.cat((-x2, x1), -1)); rows independent (the RoPE epilogue)
    OpKind("rotate_half", _UNARY, _ONE, axes="elementwise"),
    OpKind("mulc", _UNARY, _ONE, axes="elementwise"),
    OpKind("fin0", _UNARY, _ONE, axes="elementwise"),
    # scores past kv_len (and, with q_len, queries past q_len) to -inf, causal top-left; ``keys_on_rows``: the
    # transposed frame (rows are keys from ``row``, columns queries from ``col``)
    OpKind("mask", _UNARY, _ONE, axes="elementwise", row_attrs=(("row", "offset"),)),
    # no template builds these yet (the interpreter's tests do)
    OpKind("neg", _UNARY, _ONE, axes="elementwise"),
    OpKind("where", (3, 3), _ONE, axes="elementwise"),
    # made by code_partition: channel rings, wgmma retirement (also software_pipeline); by ping_pong: turns
    OpKind("acquire", _NONE, _NONE, phase="partitioned", blocking=True),
    OpKind("wait_ready", _NONE, _NONE, phase="partitioned", blocking=True),
    OpKind("get", _NONE, _ONE, phase="partitioned"),
    OpKind("release", _NONE, _NONE, phase="partitioned"),
    OpKind("release_tail", _NONE, _NONE, phase="partitioned"),
    OpKind("advance", _NONE, _NONE, phase="partitioned"),
    OpKind("mma_wait", (1, 2), _ONE, phase="partitioned", blocking=True),
    # made by code_partition for a consumer that shares the tiles (Partition.tiles): the group's counter jumps to this
    # tile's first fill, ``n = j * per_tile`` for the CTA's j-th tile (the fills of the tiles other consumers ran)
    OpKind("seek", _NONE, _NONE, phase="partitioned"),
    # made by code_partition for stores staged in a ring's bytes (Options.store_in_ring): a consumer waits until TMA
    # has read its staging tiles (tma.store_wait(0)) and arrives on ``bar`` (``count`` arrivals a phase, one per
    # storing consumer: a phase per tile); the ring's producer, in the filling loop's first trip, waits for the
    # previous tile's phase (the k-th wait for k phases: a fresh barrier passes the first) before its first fill
    OpKind("store_drained", _NONE, _NONE, phase="partitioned", blocking=True),
    OpKind("wait_drained", _NONE, _NONE, phase="partitioned", blocking=True),
    OpKind("turn_wait", _NONE, _NONE, phase="partitioned", blocking=True),
    OpKind("turn_pass", _NONE, _NONE, phase="partitioned"),
    # made by passes/tile_loop: a partition's whole body, run once per output tile its CTA walks (the grid's
    # attributes: tiles, persistent, tile_group, serpentine; ir.Grid.of reads them)
    OpKind("tile_loop", _NONE, _NONE, phase="partitioned", structural=True),
    # made by passes/cross_tile, inside a ``cross_tile`` tile_loop: the walk over a CTA's tiles after its first,
    # with iter_args carrying the previous tile's values (its tile indices as ``<index>_prev``)
    OpKind("tile_next", (0, None), (0, None), phase="partitioned", structural=True),
)


def kind_of(name: str) -> OpKind:
    """The record of op kind ``name``; a KeyError that says where to add an unknown one."""
    k = OPS.get(name)
    if k is None:
        raise KeyError(f"unknown op kind {name!r}: add an OpKind for it to torch_autows/ir/kinds.py (with a Gluon "
                       f"emitter and an interpreter semantic)")
    return k


def kinds(**where) -> frozenset[str]:
    """The names of the kinds whose fields equal ``where`` (e.g. ``kinds(blocking=True)``)."""
    return frozenset(n for n, k in OPS.items() if all(getattr(k, f) == v for f, v in where.items()))


#: Derived views the passes read.
STRUCTURAL = kinds(structural=True)
BLOCKING = kinds(blocking=True)
LATENCY: dict[str, int] = {n: k.latency for n, k in OPS.items() if k.latency}
