"""The decision points of a kernel (``Options``): what templates fix (the tile), what passes read (data
partition, pipelining, rings, warp roles, per-template forms) and what a heuristic or a search picks. A ``Program``
carries one (``core.Program.options``); ``text.py`` prints the fields that differ from their unset values."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Options:
    """Decision points. Templates fix the tile; passes read the rest; a heuristic or search picks all."""

    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    stages: int = 4  # wanted copies of each pipelined buffer; memory_plan may lower it to fit SMEM
    data_partition: int = 2  # 1, 2 or 3 chains along M (a consumer warpgroup set each)
    persistent: bool = True
    group_m: int = 8  # rows of tiles walked together (L2 reuse); attention: causal query tiles per head
    mma_pending: int = 1  # async wgmma groups left in flight inside a loop
    store_buffers: int = 1  # staging copies per TMA-stored tile: 2 lets a store drain under the next tile
    tile_buffers: int = 1  # copies of a per-tile channel (attention's Q): 2 lets the next tile's loads start early
    skip_mask: bool = True  # mask only blocks a mask can change (a uniform branch around it)
    defer_mma: bool = False  # issue a dependent mma (attention's P V) one step late, under the next step's work
    pingpong: bool = False  # compute partitions take turns issuing wgmma (one's softmax under the other's mma)
    raw_max: bool = False  # attention: running max on unscaled scores, scale folded into exp2's FFMA (scale > 0)
    # persistent CTAs take every other wave of tiles in reverse order: with tiles sorted longest first
    # (causal attention), CTA 0 no longer gets the longest tile of every wave
    serpentine: bool = False
    producer_warps: int = 1
    producer_regs: int = 40
    # CTAs per output tile, each summing a contiguous range of the reduction loop (passes/split_k; 1: none)
    split_k: int = 1
    # a persistent consumer overlaps tile t's tail (last P V, normalise, stores) with tile t+1's first QK^T and
    # softmax (passes/cross_tile)
    cross_tile: bool = False
    # consumer partitions that take turns over the output tiles (CUTLASS's ping-pong): consumer c runs tiles c,
    # c+t, ... of its CTA's persistent walk, each the whole tile (data_partition=1), while the producer loads every
    # tile's operands in walk order through one ring; one consumer's epilogue runs under the other's main loop
    # (passes/data_partition replicates the tile, partition_schedule shares the tiles; 1: every consumer, every tile)
    tile_consumers: int = 1
    # GEMM template (templates/gemm.py): compute C^T's tile, W^T X^T, so that a few activation rows fill wgmma's N slot
    # (block_m rows of C become the accumulator's columns, 8..64) and the weight tile is wgmma's A (block_n rows);
    # the epilogue stores the [block_n, block_m] accumulator transposed (store_ptr ``transposed``). Decode only.
    swap_ab: bool = False
    # attention backward, "reduce" dQ form with data_partition > 1 (passes/data_partition): the chains share their dS
    # tiles through SMEM (meeting once a step, chain_sync) and chain c computes dQ's head-dim columns c*D/f.. over every
    # key, transposed (FA3's dQ_swapAB: dQ^T = K^T dS^T, so wgmma's M is D/f and BM may be 32), instead of a full-shape
    # partial sum per chain; where D/f < 64 (d=64) and BM/f >= 64, dQ's query rows c*BM/f.. instead (FA3's d=64 split)
    dq_split: bool = False
    # attention backward: S^T's and dP^T's accumulators start at -lse2/c and -delta (c = qk_fold), so the two per-column
    # row vectors die at their mmas' issue instead of living across the step (templates/attention_bwd.py); where the
    # step's registers are tight (64-query steps at d=128: 0 spill bytes instead of 180/524)
    fold_rows: bool = False
    # attention forward: a head dim that is not a power of two runs in power-of-two column pieces (192 = 3 x 64: Q K^T
    # mmas chained into one S, an accumulator and a P V mma per piece, a store per piece) instead of one tile padded
    # to the next power of two (templates.attention.d_pieces)
    split_d: bool = False
    # ... in the widest power-of-two pieces first (192 = 128 + 64, 96 = 64 + 32: fewer, wider wgmmas) instead of equal
    # ones; each width reads and writes its tensors through a descriptor of its own (an ``Arg.alias``)
    split_d_binary: bool = False
    # software_pipeline: a pipelined step's leading mmas include the mmas chained onto them as their accumulator (a
    # head dim in pieces: every Q K^T piece is issued before step j-1's deferred P V, so S is ready, and the softmax
    # runs, while P V is on the tensor core; without it P V is issued after the first piece and S waits for it)
    lead_chains: bool = False
    # codegen: a loop's ``var // n`` and ``var % n`` (n loop-invariant: the attention backward's q-head and Q block of
    # step j) as two counters carried from step to step instead of an integer division by a runtime value per step
    # and use (codegen/emit_control.carried_counters; the IR and the interpreter are unchanged). Not measured yet.
    carry_index: bool = False
    # GEMM template: the epilogue's operand tiles (the residual, RoPE's cos/sin) come by TMA, loaded by the producer
    # after the tile's K steps into SMEM and read by the consumer, instead of pointer loads in the consumer (a
    # burst of loads by every CTA at once after its last mma, with the tensor cores idle)
    epilogue_tma: bool = False
    # CTAs resident on one SM at once (their tiles interleave: one's pipeline fill and epilogue run under another's
    # mmas): each gets 1/n of the SM's SMEM (memory_plan) and of its registers (the compile's maxnreg; setmaxnreg
    # reallocates within the CTA's share: partition_schedule), and a persistent grid has n CTAs per SM
    ctas_per_sm: int = 1
    # codegen: a partition that adds a staged tile into memory (``tma_reduce_add``, one staging copy) waits for its
    # previous reduce to have read the staging tile before the step's first ``smem_store`` instead of right before
    # the staging store, so the bar.sync that publishes the stored tile to the step's wgmma publishes the wait too:
    # one partition-wide barrier a step fewer (the attention backward's reduce form: dS^T's store, then dQ's reduce)
    early_reduce_wait: bool = False
    # attention forward: each consumer reads its Q rows from SMEM into registers once a tile (``smem_read`` in
    # wgmma's A-operand layout), so every step's Q K^T reads only K from SMEM (a 64-key step reads A and B alike:
    # as many SMEM bytes per FLOP as the tensor core computes)
    q_regs: bool = False
    # attention backward: each consumer reads its K and V rows into registers once a tile, so S^T = K Q^T and
    # dP^T = V dO^T take A from registers and a step reads only Q and dO for them (K and V stay in SMEM for dQ's mma
    # and the dK/dV stores)
    kv_regs: bool = False
    # a persistent kernel's top-level TMA stores stage in the bytes of the ring its consumers read last in a tile
    # (attention's V: FlashAttention-3's O in V's SMEM) instead of a per-tile slot they hold (stage_in_slots: Q), so
    # that slot is released after its last reader and the next tile's loads start under this tile's end; the consumer
    # chains meet before staging, and the producer's first fill of that ring in a tile waits until the previous
    # tile's stores have read their staging tiles (passes/memory_plan, passes/code_partition). With one tile a CTA
    # the stores stage in the ring's bytes after the chains' meeting alone (the attention backward's dK/dV in the
    # Q/dO ring, where no slot of its own was free: TMA stores instead of pointer stores)
    store_in_ring: bool = False
    # GEMM template, the SwiGLU backward's epilogue: its math in column chunks of this width (0: the whole tile), each
    # chunk of the accumulator a register split of it (col_split) and G's and U's chunks column slices of their SMEM
    # tiles, so that a 256-wide tile's fp32 temporaries take a chunk's registers beside the accumulator, not a tile's
    epilogue_chunk: int = 0
    # GEMM template, with epilogue_tma: the epilogue's operand tiles are loaded at the tile's start, before its K loop,
    # instead of after its K loads, so they have the whole K loop to land (at every SM's share of HBM bandwidth the
    # SwiGLU backward's 128 KB of G and U take longer than the few K steps the producer runs ahead); the producer then
    # waits at each tile's start for the previous tile's epilogue to release their slots before its first K loads
    epilogue_prefetch: bool = False

    def items(self) -> list[tuple[str, Any]]:
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]
