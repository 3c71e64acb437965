"""partition_schedule: assign every op to a warp-group role and size the roles.

Assumes: data_partition ran (chains set; only TMA ``load``s are shared, with ``chain=None``).
Guarantees: every non-container op (not ``loop``/``yield``) has ``partition``; ``Program.partitions``
lists them, first the consumer of chain 0 (it becomes Gluon's default partition), then the other
consumers, then the producer; each consumer has 4 warps per ``arch.mma_rows`` rows of its chain (one
warpgroup per MMA slice: wgmma's M=64 on sm_90); the producer has ``options.producer_warps`` warps with
``options.producer_regs`` registers; the register file (``arch.regs_per_sm``) holds all of them with
consumers at the most registers a multiple of ``arch.reg_granularity`` allows (setmaxnreg granularity, at
most ``arch.max_regs_per_thread``). With ``options.ctas_per_sm`` n > 1 the compile caps every thread at an even
share of the register file over n CTAs' threads (``maxnreg``: ``arch.regs_per_thread``, codegen.compile's
``compile_options``), and the CTA's registers are that cap times its threads: setmaxnreg moves the producer's unused
registers to the consumers within them, as with one CTA an SM (a consumer asking for more than the CTA holds would
wait forever).

Roles: ``producer`` issues every TMA load (they need no registers beyond addresses); ``consumer<c>``
runs chain c's wgmma, math and epilogue (the TMA store is issued from its own SMEM staging tile,
so the store overlaps the next tile's main loop without another role).

Tile consumers (``options.tile_consumers`` t > 1; data_partition replicated the whole tile into t chains): consumer
c gets ``Partition.tiles = (c, t)``: it runs the tiles j of its CTA's walk with j % t == c, the producer every tile
in walk order (code_partition makes the ring positions agree, tile_loop puts the share on the walk). Each consumer
is one warpgroup (4 warps), whatever its rows: a taller tile is issued as ``rows / arch.mma_rows`` MMA row blocks
by the same warpgroup (CUTLASS's ping-pong: a 128x128 fp32 accumulator is 128 registers a thread), so the two
consumers' registers fit beside the producer's. The consumers' main loops follow the producer's tile order (the
ring hands tile j's operands out before tile j+1's), so one consumer's epilogue runs under the other's main loop.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Partition, Program, map_ops, walk
from ..ir.kinds import STRUCTURAL, kinds
from . import PassError

ACCUMULATES = kinds(accumulates=True)


def _only_added(name: str, users: dict) -> bool:
    """Whether ``name`` reaches memory only through accumulating outputs (through one-operand ops): a partial sum
    of a split contraction (data_partition), full-shaped in every chain but not what sizes the chain."""
    us = users.get(name, ())
    return bool(us) and all(u.kind in ACCUMULATES or (len(u.operands) == 1 and u.results
                                                      and all(_only_added(r.name, users) for r in u.results))
                            for u in us)


def _rows(program: Program, chain: int) -> int:
    """Rows of the chain's MMA tiles, which fix its warps; partial sums (``_only_added``) do not count: a dQ partial
    [BM, D] of a chain that owns BN/2 keys runs in the chain's warps, several MMA slices per warpgroup."""
    users: dict = {}
    for o in walk(program.body):
        for x in o.operands:
            users.setdefault(x, []).append(o)
    rows = 0
    for o in walk(program.body):
        if o.chain == chain and o.kind in ("mma", "store", "zeros"):
            t = o.results[0].type if o.results else None
            if t is not None and len(t.shape) == 2 and not (o.kind == "mma" and _only_added(o.results[0].name, users)):
                rows = max(rows, t.shape[0])
    return rows


def run(program: Program, options=None) -> Program:
    opts = options or program.options

    def assign(o):
        if o.kind in STRUCTURAL:
            return o
        if o.kind == "load":
            return replace(o, partition="producer")
        if o.chain is None:
            raise PassError(f"partition_schedule: {o.kind} op has no chain and is not a TMA load; run data_partition")
        return replace(o, partition=f"consumer{o.chain}")

    body = map_ops(program.body, assign)
    arch = program.arch
    chains = sorted({o.chain for o in walk(body) if o.chain is not None})
    consumers = []
    share = opts.tile_consumers > 1
    if share and chains != list(range(opts.tile_consumers)):
        raise PassError(f"partition_schedule: tile_consumers={opts.tile_consumers} but the chains are {chains}; run "
                        f"data_partition with the same options")
    for c in chains:
        rows = _rows(program, c)
        if rows % arch.mma_rows:
            raise PassError(f"partition_schedule: chain {c} has {rows} rows; {arch.mma} needs multiples of "
                            f"{arch.mma_rows} per warpgroup: raise block_m or lower data_partition")
        consumers.append((f"consumer{c}", 4 if share else 4 * (rows // arch.mma_rows)))
    prod_warps = opts.producer_warps
    prod_group_regs = opts.producer_regs * 32 * 4  # a worker is padded to a full warpgroup
    cons_threads = 32 * sum(w for _, w in consumers)
    budget = arch.regs_per_sm  # the CTA's registers: with n CTAs an SM, what the launch's cap gives its threads
    if opts.ctas_per_sm > 1:
        threads = arch.cta_threads([w for _, w in consumers] + [prod_warps])
        budget = arch.regs_per_thread(opts.ctas_per_sm, threads) * threads
    regs = (budget - prod_group_regs) // cons_threads // arch.reg_granularity * arch.reg_granularity
    regs = min(regs, arch.max_regs_per_thread)
    if regs < 64:
        raise PassError(f"partition_schedule: {regs} registers per consumer thread is too few; lower block sizes"
                        + (" or ctas_per_sm" if opts.ctas_per_sm > 1 else ""))
    parts = [Partition(n, w, regs, tiles=(c, len(chains)) if share else None) for c, (n, w) in zip(chains, consumers)]
    parts.append(Partition("producer", prod_warps, opts.producer_regs))
    return replace(program, body=body, partitions=tuple(parts))
