"""Attention forward configs and their choice: the generated kernel's configs (``CONFIGS``), the head dims each serves
(``HEAD_DIMS``; q/k and v of two head dims: ``V_HEAD_DIMS``), the rule that picks one per call (``choose_config``) and
its options for a scale (``options_for``). Pure: no tensors, no GPU; re-exported by runtime.attention, where callers
look for them (as runtime.gemm_configs is by runtime.gemm).
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Options
from ..templates.attention import tile_d

#: Every config the runtime can run (choose_config picks; config= names one; tests compile each offline).
#: Two consumer warpgroups own 64 query rows each; a producer warp streams K and V through SMEM rings
#: (V's one slot deeper: it is read a step late); P V of step j-1 runs under step j's softmax
#: (defer_mma); only diagonal and tail blocks are masked (skip_mask).
_ONE_Q = Options(block_m=128, block_n=128, stages=4, data_partition=2, persistent=True, defer_mma=True,
                 serpentine=True, group_m=1)
# Two Q copies: the producer loads the next tile's Q, then its K/V, while this tile still computes
# (with one, it waits for this tile's end before the next tile's loads). Plans K 2 + V 3 at d=128.
_Q2 = replace(_ONE_Q, tile_buffers=2)
# d=64 only: 192 query rows, three consumer warpgroups sharing each K/V tile (FA3's d=64 shape), at 160
# registers each (producer 24). With P V deferred and 128 keys per step it spills, so either 128 keys
# without deferring, or 64 keys with it.
_P3 = Options(block_m=192, block_n=128, stages=4, data_partition=3, persistent=True, tile_buffers=2,
              serpentine=True, group_m=1, producer_regs=24)
# Short causal sequences: one consumer warpgroup of 64 query rows in 64-key steps, several CTAs an SM (ctas_per_sm).
_SHORT = replace(_Q2, block_m=64, block_n=64, data_partition=1, raw_max=True, group_m=16, producer_regs=24)
_WIDE = Options(block_m=128, block_n=64, stages=2, data_partition=2, persistent=True, serpentine=True, group_m=16,
                raw_max=True)
CONFIGS: dict[str, Options] = {
    "ws_p_128x128": _ONE_Q,
    "ws_p_128x128_q2": _Q2,
    # The running max on unscaled scores (one FFMA per score in the softmax; positive scales only).
    "ws_p_128x128_q2_rm": replace(_Q2, raw_max=True),
    # raw_max, and a head's causal query tiles back to back in groups of 16 (group_m): the CTAs of a wave
    # share K/V in L2. Non-causal grids ignore group_m. Picked, except d=64 from 8192 keys (4096 unmasked).
    "ws_p_128x128_q2_rm_g16": replace(_Q2, raw_max=True, group_m=16),
    # ... with each tile's last P V issued back to back with the next tile's first QK^T, its normalise and stores
    # under that QK^T (passes/cross_tile). Consumers at 240 registers (producer 24): at 232 the step spills at d=128.
    # Not picked: 2-10% behind ws_p_128x128_q2_rm_g16 on the short shapes it targets (H200,
    # bench/results/sweeps/2026-12-01-h200-attention-cross-tile.json).
    "ws_p_128x128_q2_rm_g16_xt": replace(_Q2, raw_max=True, group_m=16, cross_tile=True, producer_regs=24),
    # The two consumers take turns issuing wgmma (ping-pong): one's softmax runs under the other's mma.
    "ws_p_128x128_q2_pp": replace(_Q2, pingpong=True),
    # ... on the pick: picked for causal d=128 up to 4096 keys, +1.5-4% there (s512 319 vs 308 TFLOP/s, s1024 449 vs
    # 431, s4096 573 vs 564; H200, sweeps/2026-12-01-h200-attention-pp-2.json); without the mask +-1%, and at d=64
    # 1-11% behind (the softmax there is too short to hide the other consumer's mma under).
    "ws_p_128x128_q2_rm_g16_pp": replace(_Q2, raw_max=True, group_m=16, pingpong=True),
    "ws_p3_192x128_q2": _P3,
    # Picked for d=64 from 8192 keys (4096 without the mask).
    "ws_p3_192x128_q2_rm_g8": replace(_P3, raw_max=True, group_m=8),
    "ws_p3_192x64_q2": replace(_P3, block_n=64, defer_mma=True),
    # Head dims 192 and 256 (tiles of 256 columns, templates.attention.tile_d), FA3's d=256 shape: each consumer's
    # accumulator is 64x256 f32 (128 registers a thread), so 64 keys per step and nothing deferred (P V deferred
    # spills at d=192); Q 64 KB + 2 K/V stages of 32 KB each (192 KB). Picked for d=256 until the deferred form below.
    "ws_p_128x64_rm_g16": _WIDE,
    # ... with P V deferred (a step late, under the next step's softmax) and a third V slot (K 2 + V 3: 229472 bytes of
    # SMEM; consumers at 240 registers, 0 spills offline). Deferred on two slots it ran 19-21% behind the above: V is
    # read a step late, so its ring had one load ahead (sweeps/2026-12-02-h200-attention-d256-2.json); with the third
    # slot +1.7-6.1% ahead of it at s1024-s16384, causal or not, 0.94-1.01x cuDNN (-d256-3). Picked for d=256.
    "ws_p_128x64_rm_g16_dm_s3": replace(_WIDE, defer_mma=True, producer_regs=24, stages=3),
    "ws_p_128x64_rm_g16_pp": replace(_WIDE, pingpong=True),
    # Head dims 96 and 192 in equal power-of-two column pieces (split_d: 192 = 3 x 64, 96 = 3 x 32) instead of tiles
    # padded to 128 / 256 columns, so no wgmma works on padding (a quarter of the padded tile at 192 and 96): at d=192
    # each consumer's accumulators are 96 registers a thread instead of 128, Q 48 KB. The padded tiles could not
    # defer P V (they spill); in pieces, with P V deferred and three K / four V ring slots (216 KB), d=192 runs
    # 507-595 TFLOP/s against 432-490 without deferring and the padded 403-480 (H200, s1024-s16384): picked for d=192.
    # Deferring with two stages loses 2-11% (V is read a step late: its ring runs dry), two Q copies 3-10%, ping-pong
    # 30% (sweeps/2026-12-01-h200-attention-split-d-2.json). The 432-490 without deferring were measured with every
    # wgmma serialized by ptxas (a wait on a chained Q K^T piece, passes/README.md; fixed since): to re-measure.
    "ws_p_128x64_rm_g16_sd": replace(_WIDE, split_d=True),
    "ws_p_128x64_rm_g16_sd_dm_s3": replace(_WIDE, split_d=True, defer_mma=True, stages=3),
    # ... in the widest pieces first (split_d_binary: 192 = 128 + 64, 96 = 64 + 32): two P V wgmmas a step instead of
    # three, N = 128 and 64 (96: 64 and 32), the second width through descriptors of its own (narrow wgmmas cost:
    # d=96 in 32-column pieces ran at 78% of the padded kernel's tensor-core rate). Picked for d=96 and d=192: +4-7%
    # over the equal pieces at d=96 (470-534 TFLOP/s against 451-502, 1.05-1.18x cuDNN), +2-7% at d=192 but for
    # s4096 causal (-0.5%; 0.93-0.97x cuDNN) (H200, s1024-s16384, sweeps/2026-12-01-h200-attention-split-d-4.json).
    "ws_p_128x64_rm_g16_sdb_dm_s3": replace(_WIDE, split_d=True, split_d_binary=True, defer_mma=True, stages=3),
    # ... with both Q K^T pieces issued before step j-1's deferred P V (lead_chains), so S is waited with the P V
    # pieces in flight and the softmax runs under them: picked for d=192, +1.2-2.4% over the above on all five shapes
    # measured (s1024-s16384, causal or not; sweeps/2026-12-01-h200-attention-lead-chains.json). Its first
    # measurement (20-28% behind) had every wgmma serialized by ptxas (passes/README.md). At d=96 (q2 tiles) it is
    # mixed (-3.1..+2.6%, -lead-chains-2.json): not picked there.
    "ws_p_128x64_rm_g16_sdb_dm_s3_lc": replace(_WIDE, split_d=True, split_d_binary=True, defer_mma=True, stages=3,
                                               lead_chains=True),
    # ... with two Q copies (the next tile's Q loads while this one computes), for q/k 192 and v 128 (MLA prefill:
    # V's 128 columns leave the SMEM for it, 222 KB): +0.2-8.1% over the one-copy form at s1024-s16384, causal or not
    # (sweeps/2026-12-02-h200-attention-mla-2.json). Picked for 192/128. At d=192 (K 2 + V 3 slots, 222 KB) +5.7% with
    # the causal mask at 1024 keys (447 against 423 TFLOP/s, cuDNN 446), 3-5% behind at 4096 (-ctas.json): picked for
    # d=192 up to 1024 keys (without the mask +1.6% there, -d192-q2.json).
    "ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2": replace(_WIDE, split_d=True, split_d_binary=True, defer_mma=True, stages=3,
                                                  lead_chains=True, tile_buffers=2),
    "ws_p_128x128_q2_rm_g16_sdb": replace(_Q2, raw_max=True, group_m=16, split_d=True, split_d_binary=True),
    # d=96 in the d=128 pick's schedule, in three 32-column pieces: K 3 + V 4 ring slots fit (the padded tiles: 2 + 3).
    # +2-11% over the padded d=128 tiles, 1.04-1.11x cuDNN (H200, s1024-s16384, causal or not); the binary pieces
    # above are 4-7% ahead of it.
    "ws_p_128x128_q2_rm_g16_sd": replace(_Q2, raw_max=True, group_m=16, split_d=True),
    # Two CTAs an SM (ctas_per_sm), each one consumer warpgroup of 64 query rows in 64-key steps with half the SM's
    # SMEM and registers (consumer 232 after setmaxnreg; d=128: K 2 + V 3 slots, 115 KB): one CTA's pipeline fill,
    # softmax and epilogue run under the other's mmas. Short causal sequences are mostly fill and epilogue (a tile of
    # s512 has 1-4 key blocks): picked for causal d=128 up to 512 keys, 331 against the ping-pong pick's 316 TFLOP/s
    # (cuDNN 332); from 1024 keys and without the mask 5-20% behind (sweeps/2026-12-02-h200-attention-ctas*.json).
    # cuDNN's short-sequence kernels are such 64-row one-warpgroup tiles.
    "ws_p_64x64_q2_rm_g16_c2": replace(_SHORT, ctas_per_sm=2),
    # ... three CTAs an SM (74 KB of SMEM, 80 registers a thread at launch, the consumer 136 after setmaxnreg; d=128
    # does not fit those registers): picked for causal d=64 up to 512 keys, 266 against 231 TFLOP/s (cuDNN 259); two
    # CTAs of 64x128 or 64x64 tiles 248-249; at 1024 keys 2-4% behind the 128x128 pick.
    "ws_p_64x64_q2_rm_g16_c3": replace(_SHORT, ctas_per_sm=3),
}

# Q read from SMEM into registers once a tile (q_regs), so each step's Q K^T reads only K from SMEM: +2.4-3.9% at
# d=192 (s1024 564 against 546 TFLOP/s with two Q copies, cuDNN 567; s16384 638 against 614, cuDNN 645), +0.9-1.8%
# at d=96, +0.9-1.2% on d=64's 128-row tiles (H200, sweeps/2026-12-02-h200-attention-q-regs.json). Picked there.
# Not at d=256 (992 bytes of spills). d=128 and d=64's 192-row tiles only without the mask (UNMASKED_HEAD_DIMS):
# with it they spill (88 and 96 bytes; d=128 4-7% behind), without it none, +0.3-2.1% at d=128 (s2048-s16384,
# GQA; sweeps/2026-12-02-h200-attention-qr-d128.json) and +1.5-3.6% on the 192-row tiles (-q-regs.json).
CONFIGS.update({f"{name}_qr": replace(CONFIGS[name], q_regs=True) for name in (
    "ws_p_128x128_q2_rm_g16", "ws_p_128x128_q2_rm_g16_sdb", "ws_p_128x64_rm_g16_sdb_dm_s3_lc",
    "ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2", "ws_p3_192x128_q2_rm_g8")})

# O staged in the bytes of V's ring instead of the (one) Q slot (store_in_ring, FlashAttention-3's epilogue): Q is
# released after its last reader, so the next tile's Q and first K load under this tile's last P V and epilogue,
# and only the producer's first V fill of the next tile waits for O's store (passes/README.md "The tile turn").
# Measured on an H100 (no H200 could be had; sweeps/2026-12-05-h100-attention-store-in-ring.json): d=256 with the
# causal mask +1.0/+2.2/+0.7% at 512/1024/2048 keys (306/472/559 against 303/462/555 TFLOP/s, cuDNN 307/441/511),
# picked there; without the mask 1.6-2.2% behind, with it at 4096 keys 3% behind. d=192 (Q in registers: its slot
# frees at the tile's start) 6-10% behind from 4096 keys, also with the drain gate patched out (so not the gate:
# its K and V rings split in two), and +1% at 1024 keys where two Q copies are 3-7% ahead: not picked.
CONFIGS.update({f"{name}_sr": replace(CONFIGS[name], store_in_ring=True) for name in (
    "ws_p_128x64_rm_g16_dm_s3", "ws_p_128x64_rm_g16_sdb_dm_s3_lc_qr")})

#: Head dims each config serves (every config is listed). 96 runs in the 128-column tiles of 128, 192 in the
#: 256-column tiles of 256 (templates.attention.tile_d), so a config serves both or neither.
HEAD_DIMS: dict[str, tuple[int, ...]] = {
    "ws_p_128x128": (64, 96, 128), "ws_p_128x128_q2": (64, 96, 128), "ws_p_128x128_q2_rm": (64, 96, 128),
    "ws_p_128x128_q2_rm_g16": (64, 96, 128), "ws_p_128x128_q2_pp": (64, 96, 128), "ws_p_128x128_q2_rm_g16_pp": (128,),
    "ws_p_128x128_q2_rm_g16_xt": (64, 128),
    "ws_p3_192x128_q2": (64,), "ws_p3_192x128_q2_rm_g8": (64,), "ws_p3_192x64_q2": (64,),
    "ws_p_128x64_rm_g16": (192, 256), "ws_p_128x64_rm_g16_pp": (192, 256), "ws_p_128x64_rm_g16_dm_s3": (256,),
    "ws_p_128x64_rm_g16_sd": (96, 192), "ws_p_128x64_rm_g16_sd_dm_s3": (192,), "ws_p_128x128_q2_rm_g16_sd": (96,),
    "ws_p_128x64_rm_g16_sdb_dm_s3": (192,), "ws_p_128x128_q2_rm_g16_sdb": (96,),
    "ws_p_128x64_rm_g16_sdb_dm_s3_lc": (192,),
    "ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2": (192,),  # and 192 / 128 (V_HEAD_DIMS)
    "ws_p_64x64_q2_rm_g16_c2": (64, 128), "ws_p_64x64_q2_rm_g16_c3": (64,),
    "ws_p_128x128_q2_rm_g16_qr": (64,), "ws_p_128x128_q2_rm_g16_sdb_qr": (96,),
    "ws_p_128x64_rm_g16_sdb_dm_s3_lc_qr": (192,), "ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2_qr": (192,),
    "ws_p3_192x128_q2_rm_g8_qr": (),
    "ws_p_128x64_rm_g16_dm_s3_sr": (256,), "ws_p_128x64_rm_g16_sdb_dm_s3_lc_qr_sr": (192,),
}

#: Head dims a config serves only without the causal mask, besides ``HEAD_DIMS``: Q in registers beside the mask's
#: registers spills there (offline, sm_90a as launched: d=128 32-88 bytes, d=64's 192-row tiles 16-96), without the
#: mask none.
UNMASKED_HEAD_DIMS: dict[str, tuple[int, ...]] = {"ws_p_128x128_q2_rm_g16_qr": (128,),
                                                  "ws_p3_192x128_q2_rm_g8_qr": (64,)}


#: Head dims (q and k, v and o) served where they differ, with the configs that serve each pair (compiled offline
#: without spills, interpreted under every policy: test/passes/test_split_d.py), the first picked: DeepSeek-style MLA
#: prefill, d_qk 192 (128 + 64 in binary pieces) and d_v 128 (one piece) in the d=192 picks' schedules, picked as at
#: d=192 (``choose_config``): with Q in registers on the H200 1.07x cuDNN at s1024, 1.00x at s4096, 0.97x at s16384
#: without the mask, 1.04-1.07x with it (the SMEM-Q forms 0.95-1.03x / 1.03-1.04x;
#: sweeps/2026-12-02-h200-attention-mla-3.json; the 128-key variants 3-15% behind: -mla.json); the measured choice
#: keeps cuDNN where it is faster.
V_HEAD_DIMS: dict[tuple[int, int], tuple[str, ...]] = {
    (192, 128): ("ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2_qr", "ws_p_128x64_rm_g16_sdb_dm_s3_lc_qr",
                 "ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2", "ws_p_128x64_rm_g16_sdb_dm_s3_lc")}


def v_head_dims_text() -> str:
    """The served (q/k, v) head-dim pairs of ``V_HEAD_DIMS``, for messages: "192/128"."""
    return ", ".join(f"{d}/{dv}" for d, dv in V_HEAD_DIMS)


def serves(config: str, d: int, d_v: int | None = None, causal: bool = True) -> bool:
    """Whether ``config`` runs head dim ``d`` (and v head dim ``d_v``: None, the same) without spilling (HEAD_DIMS,
    V_HEAD_DIMS), with the causal mask or (``causal`` False) without it (UNMASKED_HEAD_DIMS too)."""
    if d_v is not None and d_v != d:
        return config in V_HEAD_DIMS.get((d, d_v), ())
    return d in HEAD_DIMS.get(config, ()) or (not causal and d in UNMASKED_HEAD_DIMS.get(config, ()))


def choose_config(d: int, causal: bool, seqlen_kv: int, d_v: int | None = None) -> str:
    """The config for a call, from the H200 grid sweeps (bench/results/sweeps/, median of 3 interleaved rounds
    against cuDNN in one process):

    * raw_max everywhere: 0.919 against 0.873 cuDNN geomean for the same kernel without it (FFMA softmax);
    * causal query tiles grouped 16 per head: +10-20% on causal s1024-s4096 (0.956 geomean with both);
    * d=64 with 8192 keys or more, 4096 without the mask: three consumer warpgroups of 64 rows (192 per tile),
      +4-10% there (s4096 456 -> 475 TFLOP/s, cuDNN 455; -p3-short.json). At 2048 keys +1% (within the rounds'
      spread), at 1024 11% behind; with the mask 3-5% behind up to 4096 keys (its tiles' lengths differ, and 192-row
      tiles are fewer and longer to balance);
    * d=96 and d=192 in column pieces instead of tiles padded to 128 / 256 columns: equal pieces (split_d) +2-11%
      over the padded kernel at d=96, +18-33% at d=192 with P V deferred; the widest pieces first (split_d_binary:
      64 + 32, 128 + 64) 4-7% ahead of the equal ones at d=96 (1.05-1.18x cuDNN) and -0.5..+7% at d=192 (0.93-0.97x
      cuDNN: the prior leaves d=192 with SDPA), at d=192 with both Q K^T pieces issued before the deferred P V
      (lead_chains) +1.2-2.4% more (sweeps/2026-12-01-h200-attention-split-d*.json, -lead-chains.json);
    * d=256 in 128x64 tiles with P V deferred and a third V slot: +1.7-6.1% over the same tiles undeferred
      (sweeps/2026-12-02-h200-attention-d256-3.json);
    * causal d=128 up to 4096 keys: the two consumers ping-pong their mmas, +1.5-4% (-pp-2.json; longer causal
      sequences not measured with it yet);
    * causal up to 512 keys, d=64 and 128: several CTAs an SM of 64-row tiles (ctas_per_sm: three at d=64, two at
      d=128), +15% / +5% over the picks above (2026-12-02-h200-attention-ctas*.json);
    * causal d=256 up to 2048 keys: O staged in V's bytes (store_in_ring), +0.7-2.2% on an H100
      (2026-12-05-h100-attention-store-in-ring.json; without the mask or longer, 1.6-3% behind);
    * d=192 up to 1024 keys: two Q copies, +5.7% with the mask (-ctas-2.json), +1.6% without (546 against 538
      TFLOP/s, cuDNN 569; at 4096 keys 4% behind: -d192-q2.json);
    * Q in registers (q_regs) at d=64 (128-row tiles), 96 and 192: +0.9-3.9% (-q-regs.json); without the mask at
      d=128 (+0.3-2.1% from 2048 keys, -qr-d128.json) and on d=64's 192-row tiles (+1.5-3.6%).
    """
    if d_v is not None and d_v != d:  # MLA prefill: as d=192 (its q/k head dim), among the pair's configs
        short, long = V_HEAD_DIMS[(d, d_v)][:2]
        return short if seqlen_kv <= 1024 else long
    if causal and seqlen_kv <= 512 and d in (64, 128):
        return "ws_p_64x64_q2_rm_g16_c3" if d == 64 else "ws_p_64x64_q2_rm_g16_c2"
    if d == 64 and seqlen_kv >= (8192 if causal else 4096):
        return "ws_p3_192x128_q2_rm_g8" if causal else "ws_p3_192x128_q2_rm_g8_qr"
    if d == 128 and causal and seqlen_kv <= 4096:
        return "ws_p_128x128_q2_rm_g16_pp"
    if d == 96:
        return "ws_p_128x128_q2_rm_g16_sdb_qr"
    if d == 192:
        return "ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2_qr" if seqlen_kv <= 1024 else "ws_p_128x64_rm_g16_sdb_dm_s3_lc_qr"
    if tile_d(d) > 128:
        return "ws_p_128x64_rm_g16_dm_s3_sr" if causal and seqlen_kv <= 2048 else "ws_p_128x64_rm_g16_dm_s3"
    return "ws_p_128x128_q2_rm_g16_qr" if d == 64 or not causal else "ws_p_128x128_q2_rm_g16"



def options_for(config: str, scale: float) -> Options:
    """The config's options for a call: ``raw_max`` (max on unscaled scores) holds for positive scales
    only, so any other scale gets the scaled form."""
    opts = CONFIGS[config]
    return replace(opts, raw_max=False) if opts.raw_max and not scale > 0 else opts
