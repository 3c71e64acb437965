"""GEMM configs and their choice: the generated kernel's tile configs (``CONFIGS``), the decode model that picks a
split-K decode tile for a few rows (``decode_time`` / ``decode_pick``), the large-GEMM tile rule and which configs
serve which epilogue. Pure arithmetic on shapes: no tensors, no GPU.

A residual (``gemm(..., residual=r)``: ``a @ b (+ bias) + r`` in the epilogue, r [M, N] contiguous and 16-byte
aligned) comes by TMA where K is not split (``residual_options``: the producer loads R's tile into SMEM, the consumer
reads it after its last mma), so any tile width serves it; split-K tiles load it by pointers, which only the 128-wide
tiles take without spilling (``serves_residual``). Measured offline (ptxas, ws_p_128x256, nt + bias): the masked
[64, 256] pointer load spills 970 bytes; the same load without a mask 0; a row mask with clamped columns 0 or 2182
depending only on the order of equivalent statements: R by TMA was the fix.

An activation (``gemm(..., activation="gelu_tanh" | "gelu")``: ``gelu(a @ b (+ bias))`` in the epilogue) is
served where it compiles without spills (``serves_activation``; offline sm_90a, nn/nt/tn/tt, with and without bias,
bf16/fp16/fp32 out): "gelu_tanh" on every config but ws_np_128x256 (never the heuristic's pick: 16 bytes with a
bias and fp32 output); the exact "gelu" (an erf per element) spills on the 256-wide tiles (ws_p_128x256 504 bytes,
ws_np_128x256 360, dec_256x64_s1 32, nt + bias), so it takes the 128-wide ones. Its measured choice compares
against cuBLAS then torch's gelu.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Options

#: Every config the runtime can run: choose_config picks among them, config= names one (tests compile each
#: one offline for sm_90a).
CONFIGS: dict[str, Options] = {
    # 128x256 output tile, two consumer warpgroups (64 rows each), persistent, epilogue staged per chain.
    "ws_p_128x256": Options(block_m=128, block_n=256, block_k=64, stages=4, data_partition=2, persistent=True),
    # Two epilogue staging copies (store_wait(1)): a tile's store drains under the next tile. Measured on
    # the H200 it is within 2% of ws_p_128x128 on short-K shapes (K <= 256), so the heuristic does not
    # pick it; it stays selectable (config=) for tuning.
    "ws_p_128x128_e2": Options(block_m=128, block_n=128, block_k=64, stages=5, data_partition=2, persistent=True,
                               store_buffers=2),
    # 128x128 for narrow N: more tiles to fill 132 SMs, a deeper ring fits.
    "ws_p_128x128": Options(block_m=128, block_n=128, block_k=64, stages=5, data_partition=2, persistent=True),
    # One 8-warp consumer, one tile per CTA: the epilogue staging reuses the operand ring (4 stages).
    "ws_np_128x256": Options(block_m=128, block_n=256, block_k=64, stages=4, data_partition=1, persistent=False),
    # Ping-pong over tiles (CUTLASS's KernelTmaWarpSpecializedPingpong): two one-warpgroup consumers take the
    # CTA's tiles in turn (tile_consumers=2), each a whole tile with a 128-register fp32 accumulator (232
    # registers a thread beside a 40-register producer), so one consumer's epilogue runs under the other's main
    # loop. 128x128 is two m64n128 row blocks per wgmma step, 64x256 one m64n256. As many stages as SMEM holds
    # beside the two staging tiles (memory_plan lowers ``stages``: 5 and 4). Not picked by choose_config until
    # measured (bench/results/sweeps/gemm_pingpong.py).
    "ws_pp2_128x128": Options(block_m=128, block_n=128, block_k=64, stages=8, data_partition=1, persistent=True,
                              tile_consumers=2),
    "ws_pp2_64x256": Options(block_m=64, block_n=256, block_k=64, stages=8, data_partition=1, persistent=True,
                             tile_consumers=2),
}
#: Decode tiles (a few rows, memory-bound): one 64-row consumer warpgroup, persistent, as deep a ring as SMEM
#: holds, the K loop split across ``s`` CTAs (passes/split_k) so that enough SMs stream the weight. A 256-wide
#: tile splits at most 2 ways: the reduction's partial sum, load and offsets of 3+ parts spill registers.
DECODE_TILES = ((64, 128, (1, 2, 3, 4)), (128, 128, (1, 2, 3, 4)), (256, 64, (1, 2)))  # (block_n, block_k, splits)


def decode_configs(prefix: str, tiles) -> dict[str, Options]:
    """The decode configs of ``tiles`` ((block_n, block_k, splits) entries), named ``<prefix>_<bn>x<bk>_s<s>``."""
    return {decode_name(prefix, (bn, bk, s)): Options(block_m=64, block_n=bn, block_k=bk, stages=12, data_partition=1,
                                                      persistent=True, split_k=s)
            for bn, bk, splits in tiles for s in splits}


def decode_name(prefix: str, pick: tuple[int, int, int]) -> str:
    """The name of the decode config (block_n, block_k, splits) ``pick``."""
    return "{}_{}x{}_s{}".format(prefix, *pick)


CONFIGS.update(decode_configs("dec", DECODE_TILES))

#: Swap-AB decode tiles (``Options.swap_ab``, templates/gemm.py): the weight's [block_n, block_k] tile is wgmma's A
#: operand (one consumer warpgroup: 64 rows, or 128 as two m64 blocks) and the activations' [bmx, block_k] tile its
#: B (wgmma N = bmx), so M <= bmx rows pad bmx, not 64. Served: nn.Linear's layout (``x @ w.t()``, nt) with or without
#: a bias, operand or f32 output, split-K 1..4; nothing else (``serves_swap``). Compiled offline for sm_90a with no
#: spills (test/codegen/test_swap_codegen.py). Measured on the H200 (sweeps/2026-12-01-h200-decode-swap.json, the
#: Llama-3 decode shapes at M 1-64): split 1 is the fastest swap config at every shape; 16 rows beat 64 up to M = 32;
#: the 64- or 128-wide tile wins by shape (up to 10% apart) in a way no rule of N, K and SMs fitted; the best of
#: them 0.96-1.09x cuBLAS (geomean 1.02), against 0.81-1.08x for the dec_* pick. So the heuristic takes one swap
#: config up to 32 rows (``SWAP_PICK``), and ``decode_candidates`` offers the others to the measured choice
#: (runtime.choice), which keeps the fastest per site.
SWAP_TILES = ((64, 128, (1, 2, 3, 4)), (128, 128, (1, 2, 3, 4)))  # (block_n, block_k, splits)
SWAP_ROWS = (16, 64)  # bmx: the activation rows of a tile (wgmma N)


def swap_configs(prefix: str, tiles, rows) -> dict[str, Options]:
    """The swap-AB decode configs, named ``<prefix>_<bn>x<bk>_m<bmx>_s<s>``."""
    return {f"{prefix}_{bn}x{bk}_m{bmx}_s{s}": Options(block_m=bmx, block_n=bn, block_k=bk, stages=12,
                                                       data_partition=1, persistent=True, split_k=s, swap_ab=True)
            for bn, bk, splits in tiles for bmx in rows for s in splits}


CONFIGS.update(swap_configs("decs", SWAP_TILES, SWAP_ROWS))
#: ... with 256-deep K steps (each weight row read 512 bytes at a time, 5 stages of SMEM instead of 12 128-deep ones),
#: 16 activation rows. On an H100 at 1-16 rows (sweeps/2026-12-05-h100-decode-bk.json, against the best of the two
#: unsplit tiles above): 64x256 0.992-1.062x on five of the Llama-3 decode shapes (2.17-2.19 against 2.06 TB/s at
#: 14336x4096), 128x256 1.018-1.026x at 8192x10240; at 32 rows 0.985-1.013x. Offered to the measured choice up to
#: 32 rows (``decode_candidates``), not taken by the heuristic.
SWAP_DEEP_TILES = ((64, 256, (1,)), (128, 256, (1,)))
CONFIGS.update(swap_configs("decs", SWAP_DEEP_TILES, (16,)))


#: The swap-AB config ``choose_config`` takes for up to 32 rows where it serves the call: on the H200 sweep's 28
#: shapes of M 1-32 (sweeps/2026-12-01-h200-decode-swap.json) 0.92-1.08x cuBLAS, geomean 1.005, against the dec_*
#: pick's 0.81-0.98x, geomean 0.915; the single best swap config there (the 128-wide tile wins on 8 of them).
SWAP_PICK = "decs_64x128_m16_s1"


def decode_candidates(m: int, n: int, k: int, swap: bool) -> list[str]:
    """The configs the measured choice times for an M x N x K GEMM: ``choose_config``'s pick (with and without
    ``swap``), and where ``swap`` (the call is one ``serves_swap`` takes) and M <= 64 the two unsplit swap-AB tiles of
    the row count that won the sweep at that M (16 rows up to M = 32, else 64), up to 32 rows also the two 256-deep
    ones (``SWAP_DEEP_TILES``). Each config once."""
    out = [choose_config(m, n, k, swap=swap), choose_config(m, n, k)]
    if swap and m <= 64:
        bmx = 16 if m <= 32 else 64
        out += [f"decs_{bn}x128_m{bmx}_s1" for bn in (64, 128)]
        if m <= 32:
            out += [f"decs_{bn}x{bk}_m16_s1" for bn, bk, _ in SWAP_DEEP_TILES]
    return list(dict.fromkeys(out))


#: Throughput of a 128x128 tile relative to 128x256 when both fill every SM: 644 against 706 TFLOP/s at
#: 4096^3 on the H200 (sweeps/2026-11-30-h200-gemm-configs.json, both at 3.9 waves).
_EFF_128x128 = 0.91


#: The decode model's constants (fit to sweeps/2026-11-30-h200-decode-configs.json, 42 shapes, M 1..128: the
#: pick is on average 1.6% and at most 10% slower than the best of the 16 configs measured): HBM bandwidth,
#: the most one SM streams alone, and the extra HBM traffic per byte of split-K partials.
_HBM_BPS, _SM_BPS, _SPLIT_TRAFFIC = 4.1e12, 60e9, 8


def decode_time(m: int, n: int, k: int, bn: int, bk: int, s: int, sms: int = 132, weights: int = 1) -> float:
    """Estimated seconds of a decode config: each wave of persistent work units takes the longer of the
    wave's bytes at HBM bandwidth and one unit's bytes at one SM's bandwidth; split-K adds its partials.
    ``weights``: weight tiles streamed per K step (2 for swiglu's gate and up), each with its own partials."""
    units = -(-m // 64) * -(-n // bn) * s
    k_steps = -(-k // bk)
    steps = -(-k_steps // s)  # K steps of one part
    unit_bytes = steps * bk * (weights * bn + 64) * 2  # the weight tiles and the (zero-padded) activation tile
    t = 0.0
    while units > 0:
        w = min(units, sms)
        units -= w
        t += max(w * steps * bk * weights * bn * 2 / _HBM_BPS, unit_bytes / _SM_BPS)
    return t + (_SPLIT_TRAFFIC * weights * m * n * 4 * s / _HBM_BPS if s > 1 else 0.0)


def choose_config(m: int, n: int, k: int, sms: int = 132, split: bool = True, residual: bool = False,
                  activation: str = "none", swap: bool = False, out32: bool = False) -> str:
    """The config for an M x N x K GEMM: decode tiles (``decode_time``'s least) up to 128 rows, else the
    large-GEMM choice below. ``split=False`` is for batched GEMMs: no split-K (split_k takes 2-D grids), and
    only tiles whose K step divides K (a batch's rows are flattened, so no tile may straddle two).
    ``residual``, ``activation``: only the configs that serve that epilogue (``serves_residual``, ``out32``: an
    output wider than the operands; ``serves_activation``); a residual takes the large-GEMM pick where it serves
    one. ``swap``: the call is one the swap-AB configs serve (``swap_serves``, a contiguous output); then up to 32
    rows take ``SWAP_PICK`` (see there)."""
    if swap and m <= 32 and not residual and activation == "none":
        return SWAP_PICK
    narrow = residual or activation == "gelu"  # decode tiles: 128 wide (pointer loads of R; gelu spills wider)
    if m <= 128:
        tiles = tuple(t for t in DECODE_TILES if t[0] <= RESIDUAL_BLOCK_N) if narrow else DECODE_TILES
        best = decode_pick(tiles, m, n, k, sms, split=split)
        if best:
            return decode_name("dec", best)
    if activation == "gelu":
        return "ws_p_128x128"
    pick = _large_config(m, n, k, sms)
    return pick if not residual or serves_residual(pick, out32) else "ws_p_128x128"


#: The widest output tile that adds a residual in the epilogue without spilling registers.
RESIDUAL_BLOCK_N = 128


def serves_residual(config: str, out32: bool = False) -> bool:
    """Whether ``config`` serves the residual epilogue, as runtime.gemm builds it (``residual_options``): not
    swap-AB (its tile is C^T's), and R by TMA where K is not split, which any tile width takes (0 spills offline for
    sm_90a on every unsplit config; ``out32``, an output wider than the operands, needs a staging tile of its own,
    which a 256-wide tile's SMEM plan does not fit), or by pointer loads (split-K: the CTA that stores adds R) on
    tiles at most ``RESIDUAL_BLOCK_N`` wide."""
    o = CONFIGS[config]
    return not o.swap_ab and (o.block_n <= RESIDUAL_BLOCK_N or (o.split_k == 1 and not out32))


def residual_options(config: str) -> Options:
    """The Options of ``config``'s residual GEMM: R's tile by TMA (``epilogue_tma``: the producer loads it into SMEM
    during the tile's last K steps, the consumer reads it there) where K is not split; pointer loads in the consumer
    after split-K's reduction. On the H200 (Llama-3-8B at 8x2048 rows, bench/results/sweeps epilogue_tma) the TMA
    form lets the residual take the 128x256 tile: o_proj 821 us against 889 on 128x128 tiles with pointer loads (and
    cuBLAS's GEMM alone 830), down_proj 2794 against 2961."""
    o = CONFIGS[config]
    return replace(o, epilogue_tma=o.split_k == 1)


def serves_rope(config: str, head_dim: int) -> bool:
    """Whether ``config`` serves the RoPE epilogue at ``head_dim`` (templates.gemm ``GemmRequest.rope``): tiles of whole
    heads, a consumer's accumulator at most 64 x ``RESIDUAL_BLOCK_N`` (offline sm_90a, nn.Linear's layout: 0 spills
    there at D 64/128; 2.4-3.9 KB with 256-wide tiles and 5.6 KB with a consumer owning a whole 128x128 tile, the
    ping-pong ``ws_pp2_128x128``, where the fp32 cos/sin tiles sit beside 128 accumulator registers), not swap-AB
    (its tile is C^T: a head's columns are the accumulator's rows). Split-K serves it as the residual: the CTA that
    stores rotates the reduced sum."""
    o = CONFIGS[config]
    rows = o.block_m // o.data_partition  # a consumer's accumulator rows
    return (o.block_n <= RESIDUAL_BLOCK_N and rows <= 64 and o.block_n % head_dim == 0 and head_dim % 2 == 0
            and not o.swap_ab)


def serves_swap(config: str, *, trans_a: bool, trans_b: bool, batched: bool = False, epilogue: str = "none") -> bool:
    """Whether ``config`` serves a GEMM of that layout and kind: a swap-AB config only nn.Linear's (A row-major, B a
    transposed view), 2-D, no activation (``epilogue``: the GEMM's activation; templates.gemm.swap_reason); every
    other config all of them."""
    return not CONFIGS[config].swap_ab or swap_serves(trans_a=trans_a, trans_b=trans_b, batched=batched,
                                                      epilogue=epilogue)


def swap_serves(*, trans_a: bool, trans_b: bool, batched: bool = False, epilogue: str = "none") -> bool:
    """Whether the swap-AB configs serve a GEMM of that layout and kind (``serves_swap``)."""
    return not trans_a and trans_b and not batched and epilogue == "none"


def serves_activation(config: str, activation: str) -> bool:
    """Whether ``config`` applies ``activation`` in its epilogue without spills (offline sm_90a): the exact gelu on
    128-wide tiles; the tanh form on every config but ws_np_128x256 (16 bytes with a bias and fp32 output); none on
    the swap-AB configs (the swapped epilogue stores the biased product only)."""
    if activation != "none" and CONFIGS[config].swap_ab:
        return False
    if activation == "gelu":
        return CONFIGS[config].block_n <= RESIDUAL_BLOCK_N
    return activation == "none" or config != "ws_np_128x256"


def decode_pick(tiles, m: int, n: int, k: int, sms: int = 132, *, weights: int = 1,
                split: bool = True) -> tuple[int, int, int] | None:
    """(block_n, block_k, splits) of ``tiles`` ((block_n, block_k, splits) entries) with the least
    ``decode_time``, wider tiles first on a tie; ``split=False``: no split-K, and only tiles whose K step divides
    K. None where no tile qualifies."""
    cands = [(decode_time(m, n, k, bn, bk, s, sms, weights), -bn, s, bn, bk) for bn, bk, splits in tiles
             for s in (splits if split else (1,)) if split or k % bk == 0]
    if not cands:
        return None
    best = min(cands)
    return best[3], best[4], best[2]


def _large_config(m: int, n: int, k: int, sms: int = 132) -> str:
    """The tile with the least estimated time: a persistent CTA runs ceil(tiles / SMs) tiles, so the cost is
    that many tiles of the tile's area at its throughput. 128x256 wins on big grids; 128x128 where the
    last wave of 128x256 tiles would leave many SMs idle (e.g. N=768 at M=8192: 2 rounds of 256-wide tiles
    against 3 of 128-wide ones, 4 against 3.3 units) and for narrow N."""
    def cost(bn: int, eff: float) -> float:
        tiles = -(-m // 128) * -(-n // bn)
        return -(-tiles // sms) * bn / eff

    if n <= 128 or cost(128, _EFF_128x128) < cost(256, 1.0):
        return "ws_p_128x128"
    return "ws_p_128x256"
