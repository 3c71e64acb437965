"""Attention backward configs and their choice: the main kernel's configs (``CONFIGS``) and the dQ kernel's
(``DQ_CONFIGS``), the head dims each serves per dQ form (``CONFIG_HEAD_DIMS``, ``DQ_CONFIG_HEAD_DIMS``), the rules that
pick one per call (``choose_config``, ``choose_dq_config``) and the lengths from which the reduce form is the default
(``REDUCE_FROM_KEYS``). Pure: no tensors, no GPU; re-exported by runtime.attention_bwd, where callers look for them
(as runtime.attention_configs is by runtime.attention). Measurements: bench/results/sweeps/README.md.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Options

#: The forms of dQ (module docstring).
DQ_MODES = ("atomic", "reduce", "separate")

#: The forms whose dQ adds reorder from run to run (refused under torch.use_deterministic_algorithms).
NONDETERMINISTIC = ("atomic", "reduce")

#: Every config of the main kernel the runtime can run (choose_config picks; config= names one; tests compile each
#: offline). One CTA per (batch, kv-head, block of BN keys) (``_p``: persistent, a CTA per SM walks those tiles); a
#: producer warp streams Q and dO through a 2-deep ring. ``dp2``: two consumer warpgroups of BN/2 keys each (each adds
#: its partial dQ in the atomic form), producer at 24 registers and consumers at 240 (FA3's split). ``dp1``: one
#: consumer warpgroup.
CONFIGS: dict[str, Options] = {
    "bwd_64x128_dp2": Options(block_m=64, block_n=128, stages=2, data_partition=2, persistent=False, group_m=1,
                              producer_regs=24),
    "bwd_64x64_dp1": Options(block_m=64, block_n=64, stages=2, data_partition=1, persistent=False, group_m=1),
    # Persistent: the next tile's K/V loads overlap this tile's dK/dV epilogue. On the H200 (sweeps/2026-12-01-h200-
    # attention-bwd-configs-2.json) +1-5% at d=64 without a mask, but 6-16% behind with the causal mask (the round-robin
    # walk hands some CTAs the long diagonal tiles together), and at d=128 it spills more (276 bytes) for nothing.
    "bwd_64x128_dp2_p": Options(block_m=64, block_n=128, stages=2, data_partition=2, persistent=True, group_m=1,
                                producer_regs=24),
    # The 64-query steps with lse2/delta folded into the S^T/dP^T accumulators (Options.fold_rows): 0 spills at d=128 in
    # the separate form (bwd_64x128_dp2: 120, causal 172): on the H200 -2..+3% of bwd_64x128_dp2 (sweeps/2026-12-01-
    # h200-attention-bwd-configs-5.json and -8, the latter without the wait ptxas had injected before dP^T's issue in
    # one consumer: codegen/sm90.py ``_zeros``). Served, not picked.
    "bwd_64x128_dp2_fold": Options(block_m=64, block_n=128, stages=2, data_partition=2, persistent=False, group_m=1,
                                   producer_regs=24, fold_rows=True),
    # The persistent walk with the fold at d=64 (reduce form, no mask): 1.3-1.5% ahead of bwd_64x128_dp2_p there (its
    # two subtractions a column and step go into the mmas' initial accumulators; -configs-5). The step's query block
    # and the walk's tile indices carried as counters (carry_index, codegen/emit_control.py): +0.3-2.7% (s1024-s8192,
    # causal or not; sweeps/2026-12-02-h200-attention-bwd-configs-9.json).
    "bwd_64x128_dp2_p_fold": Options(block_m=64, block_n=128, stages=2, data_partition=2, persistent=True, group_m=1,
                                     producer_regs=24, fold_rows=True, carry_index=True),
    # The 5-GEMM reduce form at d=128 with 64-query steps (FA3's plan): the split dQ (dq_split) and the folded row
    # vectors (fold_rows) together leave it 8 spill bytes offline (causal 40; 424/536 without the fold), SMEM 198176.
    # Picked for the reduce form at d=128: with its wgmmas pipelined (ptxas had serialized them, 0.88-0.95x the
    # separate form then: a wait on the chained dQ^T accumulator, passes/README.md) 1.13-1.19x the 32-query split and
    # 0.97x (1024 keys) to 1.13x (8192) the separate form on the H200 (sweeps/2026-12-01-h200-attention-bwd-configs-6).
    # With carry_index (as above): +0.6-3.1% (-configs-9: s1024 407 -> 418 TFLOP/s, s4096 519 -> 535, s8192 549 -> 563;
    # causal +0.7-2.8%).
    # With the wait for dQ's previous reduce before dS^T's store (early_reduce_wait: a bar.sync a step fewer):
    # +0.3-3.2% at s1024-s8192, causal or not (sweeps/2026-12-02-h200-attention-bwd-erw.json).
    "bwd_64x128_dp2_dqsplit_fold": Options(block_m=64, block_n=128, stages=2, data_partition=2, persistent=False,
                                           group_m=1, producer_regs=24, dq_split=True, fold_rows=True,
                                           carry_index=True, early_reduce_wait=True),
    # FA3's d=64 tile in the reduce form: 128-query steps, the split dQ by query rows (dq_split: at d=64 the head-dim
    # halves would be 32 rows, under wgmma's M; each consumer reduces dQ's 64 rows of its half over all 128 keys, so a
    # step adds 2 x 16 KB of fp32 partials for 128 x 128 where the 64 x 64 steps add 4 x 16 KB), half the steps and
    # so half the per-step barriers. Offline sm_90a: 24 spill bytes (causal 104; as launched 0 / 96), SMEM 199200. On
    # the H200 (sweeps/2026-12-02-h200-attention-bwd-rows.json, whole backward, TFLOP/s) against the two-CTA pick
    # bwd_64x64_dp1_c2: 443 / 411 at 4096 keys, 464 / 412 at 8192; causal 398 / 382, 436 / 405 (cuDNN 435, 448, 378,
    # 409); behind it at 512 and 1024 keys (345 / 350, causal 244 / 278): ``REDUCE_LONG``. Without carry_index: the
    # carried counters cost 2-5% here (more live scalars, more spills); persistent 1-20% behind.
    "bwd_128x128_dp2_dqsplit_fold": Options(block_m=128, block_n=128, stages=2, data_partition=2, persistent=False,
                                            group_m=1, producer_regs=24, dq_split=True, fold_rows=True,
                                            early_reduce_wait=True),
    # Separate form only (the atomic form's dQ mma would have 32 rows; wgmma takes multiples of 64): 32-query steps
    # keep S^T/dP^T at 16 registers each beside dK/dV (64 each at d=128), so d=128 compiles without spills.
    "bwd_32x128_dp2": Options(block_m=32, block_n=128, stages=2, data_partition=2, persistent=False, group_m=1,
                              producer_regs=24),
    # Reduce form at d=128 (FA3's split dQ, passes/BACKWARD.md step 8 (b); served, not picked): the two consumers share
    # their dS^T tiles through SMEM (one mbarrier meeting a step) and each reduces dQ^T's 64 head-dim rows over all
    # 128 keys (wgmma M = 64, 16 registers): 0 spills offline, causal or not, bf16 and fp16, SMEM 133168.
    "bwd_32x128_dp2_dqsplit": Options(block_m=32, block_n=128, stages=2, data_partition=2, persistent=False,
                                      group_m=1, producer_regs=24, dq_split=True),
    # Two CTAs an SM (Options.ctas_per_sm) of one consumer warpgroup and 64 keys each (50 KB of SMEM, consumer 232
    # registers after setmaxnreg): one CTA's fill, dK/dV epilogue and per-step barriers under the other's steps.
    # d=64 only (d=128 spills 120-200 bytes). Picked for d=64's reduce form: +4-9% at 1024 keys
    # (sweeps/2026-12-02-h200-attention-bwd-c2.json), +1.7-2.4% over the one-CTA picks at 4096 and 8192, causal or
    # not (-erw.json), where ncu had the one-CTA kernel's consumers stalled on bar.sync for 31% of their issue gaps;
    # with early_reduce_wait (as above) -0.3..+3.2% of without.
    "bwd_64x64_dp1_c2": Options(block_m=64, block_n=64, stages=2, data_partition=1, persistent=False, group_m=1,
                                producer_regs=24, ctas_per_sm=2, early_reduce_wait=True),
    # ... with lse2/delta folded into the accumulators (Options.fold_rows): d=128 without spills (the plain one spills
    # 120-200 bytes there), separate form, 100 KB of SMEM. Served, not picked: in the sweep +5.5% / +3% at 512 / 1024
    # causal keys, 1-2% behind without the mask (sweeps/2026-12-02-h200-attention-bwd-c2-d128.json), but 0.69x
    # cuDNN at 512 causal keys in the bench right after (``SHORT``).
    "bwd_64x64_dp1_c2_fold": Options(block_m=64, block_n=64, stages=2, data_partition=1, persistent=False, group_m=1,
                                     producer_regs=24, ctas_per_sm=2, fold_rows=True),
}
# d=64's two-CTA reduce pick with K and V read into registers once a tile (Options.kv_regs: S^T = K Q^T and
# dP^T = V dO^T take A from registers, so a step's two wgmmas read only Q and dO from SMEM); the one config it fits
# without spills (the two-consumer configs spill 700-1000 bytes). On the H200 (whole backward, TFLOP/s, against
# bwd_64x64_dp1_c2; sweeps/2026-12-02-h200-attention-bwd-kvr.json): 359 / 351 at 1024 keys, 281 / 276 causal (cuDNN
# 356, 249); 286 / 282 and 196 / 193 at 512. Picked in its place (REDUCE_PICKS).
CONFIGS["bwd_64x64_dp1_c2_kvr"] = replace(CONFIGS["bwd_64x64_dp1_c2"], kv_regs=True)

# The reduce picks with dK/dV stored by TMA out of the bytes of the Q/dO ring (Options.store_in_ring with one tile a
# CTA: the chains meet after their last step, then stage; passes/buffers.stage_hosts) instead of by pointer from the
# accumulator's registers, where the KV tiles are whole (the runtime's kv_tma; else the same program as the base). On
# the H200 a CTA's epilogue (from its last step to its end) took 5.6 us at d=128, 2.6 steps of 2.2 us, beside 1.3 us
# waiting for K/V and 1.6 us between one CTA's end and the next one's start (%clock64 in consumer0,
# sweeps/2026-12-05-h200-attention-bwd-timeline.json): the pointer stores write the accumulator's 16-byte row pieces.
# On an H100 (whole backward, TFLOP/s, base / _sr / cuDNN; sweeps/2026-12-05-h100-attention-bwd-store-in-ring.json):
# d=128 s1024 393 / 425 / 398 (main kernel 706 -> 618 us), s2048 473 / 496 / 471, s4096 525 / 552 / 525, s8192 565 /
# 572 / 539, causal s1024 275 / 298 / 282, s2048 376 / 393 / 378, s4096 455 / 467 / 443, s8192 511 / 510 / 482; d=64
# s1024 330 / 354 / 335, s2048 403 / 416 / 401, s4096 439 / 449 / 428, s8192 468 / 467 / 444, causal s4096 384 / 388
# / 364, s8192 438 / 432 / 401 (the last two points within the rounds' spread, 10-17% there). Picked in their place
# (REDUCE_PICKS, REDUCE_LONG). Offline (sm_90a as launched) they spill 60-208 bytes of scalars (the pointer forms 0-96).
for _name in ("bwd_64x128_dp2_dqsplit_fold", "bwd_128x128_dp2_dqsplit_fold"):
    CONFIGS[f"{_name}_sr"] = replace(CONFIGS[_name], store_in_ring=True)

#: Head dims each main-kernel config serves, per form (what compiles at sm_90a; the separate and reduce forms: without
#: spills, but for two measured exceptions). The reduce form's partial sums spill at d=128 (offline sm_90a, ptxas -v,
#: bytes: bwd_64x128_dp2 532, causal 736; bwd_64x64_dp1 196, causal 164; test/codegen/test_attention_bwd_codegen.py
#: ``REDUCE_SPILLS``), so d=128 is served by the split dQ (``bwd_32x128_dp2_dqsplit``, 0 spills, and the 64-query
#: ``bwd_64x128_dp2_dqsplit_fold``: 8/40 bytes, the first exception, faster); at d=64 neither spills (the split needs
#: D/2 >= 64). The second exception: the separate form's 64-query steps at d=128 (bwd_64x128_dp2)
#: spill 120 bytes (causal 172; ``SEPARATE_SPILLS`` there) and still ran 1.11-1.17x the 0-spill 32-query steps on the
#: H200 (bench/results/sweeps/2026-12-01-h200-attention-bwd-configs.json), so they serve d=128 and are picked there.
#: ``bwd_64x128_dp2_fold`` is the same steps without spills (lse2/delta folded into the accumulators), not faster.
CONFIG_HEAD_DIMS: dict[str, dict[str, tuple[int, ...]]] = {
    "bwd_64x128_dp2": {"atomic": (64, 128), "reduce": (64,), "separate": (64, 128)},
    "bwd_64x128_dp2_p": {"atomic": (), "reduce": (64,), "separate": (64,)},
    "bwd_64x128_dp2_fold": {"atomic": (), "reduce": (), "separate": (128,)},
    "bwd_64x128_dp2_p_fold": {"atomic": (), "reduce": (64,), "separate": ()},
    "bwd_64x128_dp2_dqsplit_fold": {"atomic": (), "reduce": (128,), "separate": ()},
    "bwd_128x128_dp2_dqsplit_fold": {"atomic": (), "reduce": (64,), "separate": ()},
    "bwd_64x64_dp1": {"atomic": (64, 128), "reduce": (64,), "separate": (64,)},
    "bwd_32x128_dp2": {"atomic": (), "reduce": (), "separate": (64, 128)},
    "bwd_32x128_dp2_dqsplit": {"atomic": (), "reduce": (128,), "separate": ()},
    "bwd_64x64_dp1_c2": {"atomic": (), "reduce": (64,), "separate": (64,)},
    "bwd_64x64_dp1_c2_fold": {"atomic": (), "reduce": (), "separate": (128,)},
    "bwd_64x64_dp1_c2_kvr": {"atomic": (), "reduce": (64,), "separate": ()},
    "bwd_64x128_dp2_dqsplit_fold_sr": {"atomic": (), "reduce": (128,), "separate": ()},
    "bwd_128x128_dp2_dqsplit_fold_sr": {"atomic": (), "reduce": (64,), "separate": ()},
}

#: Configs of the dQ kernel (separate form). One CTA per (batch, q-head, block of BM queries) (``_p``: persistent);
#: two consumer warpgroups of 64 query rows each, as the forward; a producer streams K and V through a 2-deep ring.
DQ_CONFIGS: dict[str, Options] = {
    "dq_128x128_dp2_p": Options(block_m=128, block_n=128, stages=2, data_partition=2, persistent=True, group_m=1),
    "dq_128x128_dp2": Options(block_m=128, block_n=128, stages=2, data_partition=2, persistent=False, group_m=1),
    "dq_128x64_dp2": Options(block_m=128, block_n=64, stages=2, data_partition=2, persistent=False, group_m=1),
    # Two CTAs an SM of one consumer warpgroup, 64 queries x 64 keys a step (49 / 99 KB at d=64 / 128), persistent:
    # for short sequences, as the main kernel's bwd_64x64_dp1_c2. Served, not picked: 1-16% behind
    # dq_128x128_dp2_p at 512 and 1024 keys (sweeps/2026-12-02-h200-attention-bwd-c2.json).
    "dq_64x64_dp1_c2": Options(block_m=64, block_n=64, stages=2, data_partition=1, persistent=True, group_m=1,
                               producer_regs=24, ctas_per_sm=2),
}

#: Head dims each dQ config serves.
DQ_CONFIG_HEAD_DIMS: dict[str, tuple[int, ...]] = {"dq_128x128_dp2": (64, 128), "dq_128x64_dp2": (64, 128),
                                                   "dq_128x128_dp2_p": (64, 128), "dq_64x64_dp1_c2": (64, 128)}


def serves(config: str, d: int, dq_mode: str = "separate") -> bool:
    """Whether main-kernel ``config`` runs head dim ``d`` in form ``dq_mode``."""
    return d in CONFIG_HEAD_DIMS.get(config, {}).get(dq_mode, ())


def dq_serves(config: str, d: int) -> bool:
    """Whether dQ-kernel ``config`` runs head dim ``d``."""
    return d in DQ_CONFIG_HEAD_DIMS.get(config, ())


#: (form, head dim, causal) -> (config, keys): up to ``keys`` keys a head the main kernel runs two CTAs an SM of one
#: consumer warpgroup and 64 keys each in a form whose pick is otherwise one CTA (d=64's reduce form takes them at
#: every length: ``REDUCE_PICKS``). Empty: nothing measured holds in both harnesses. On the H200 (whole backward,
#: TFLOP/s):
#: * d=128, separate form, causal: ``bwd_64x64_dp1_c2_fold`` beside the dQ pick 230 against 218 at 512 keys and 309
#:   against 300 at 1024 in the sweep (cuDNN 209 / 298; sweeps/2026-12-02-h200-attention-bwd-c2-d128.json; 1-2%
#:   behind without the mask), but 145 against cuDNN's 212 at 512 causal keys in the attention-bwd bench right after
#:   (bench/results/2026-12-02-h200-attention-bwd-4.json: 0.686x, where the one-CTA pick had 214 in -bwd-3).
#: * d=64, separate form at 512 keys: 186 against 172 causal in -c2.json, 140 against cuDNN's 170 in the bench right
#:   after (-c2-bench.json), 138 against 142 and 175.6 against cuDNN's 170.6 in session 21 (-c2-d64.json,
#:   -c2-d64-bench.json).
#: The s512 causal points move 10-30% between runs and harnesses with any config (s512-d64-causal with the same
#: pick: 172.7 in -bwd-3, 155.3 in -bwd-4), most with two CTAs an SM; not taken until the two agree there.
SHORT: dict[tuple[str, int, bool], tuple[str, int]] = {}

#: Head dim -> the reduce form's main kernel (CONFIGS): d=64 two CTAs an SM of one consumer warpgroup (ahead of the
#: one-CTA picks at 1024-8192 keys, causal or not: -c2.json, -erw.json); d=128 the 64-query split dQ with the folded
#: row vectors, dK/dV by TMA out of the Q/dO ring (``_sr``). d=64 with K and V in registers (+1.8-2.3% at 1024 keys).
REDUCE_PICKS: dict[int, str] = {64: "bwd_64x64_dp1_c2_kvr", 128: "bwd_64x128_dp2_dqsplit_fold_sr"}

#: (head dim, causal) -> (config, keys): from ``keys`` keys a head the reduce form's main kernel is ``config``
#: instead of ``REDUCE_PICKS``'s. d=64: FA3's tile, 128-query steps with the split dQ by query rows (see the config),
#: half the dQ partials' L2 traffic a FLOP of the two-CTA pick. On the H200 (whole backward, TFLOP/s, against
#: bwd_64x64_dp1_c2; sweeps/2026-12-02-h200-attention-bwd-rows.json, -rows-2048.json): 345 / 350 at 1024 keys, 397 /
#: 392 at 2048, 443 / 411 at 4096; causal 244 / 278 at 1024, 328 / 343 at 2048, 398 / 382 at 4096. With dK/dV by TMA
#: out of the Q/dO ring (``_sr``, on an H100, -store-in-ring.json): 354 against the two-CTA pick's 329 at 1024 keys
#: without the mask, so from 1024 there; with it 324 / 328 at 2048, 388 / 383 at 4096 (the threshold stays).
REDUCE_LONG: dict[tuple[int, bool], tuple[str, int]] = {(64, False): ("bwd_128x128_dp2_dqsplit_fold_sr", 1024),
                                                        (64, True): ("bwd_128x128_dp2_dqsplit_fold_sr", 4096)}


def choose_config(d: int, causal: bool, dq_mode: str = "separate", keys: int | None = None) -> str:
    """The main kernel's config for a call. Atomic: two consumer warpgroups of 64 keys and 64-query steps at both
    head dims (offline, sm_90a: d=64 without spills; d=128 spills, test/codegen/test_attention_bwd_codegen.py
    ``SPILLS``). Separate: the same at both head dims (at d=128 its 120/172 spill bytes cost less than halving the
    query step: 1.11-1.17x ``bwd_32x128_dp2`` on the H200, sweeps/2026-12-01-h200-attention-bwd-configs.json).
    Reduce: ``REDUCE_PICKS`` (d=64: two CTAs an SM of one consumer warpgroup and 64 keys, from ``REDUCE_LONG``'s
    keys 128-query steps with dQ split by query rows; d=128: 64-query steps
    with the split dQ and the folded row vectors, 8/40 spill bytes, 1.13-1.17x the 0-spill 32-query split on the
    H200 once ptxas stopped serializing its wgmmas, sweeps/2026-12-01-h200-attention-bwd-configs-6.json).
    At d=64 without a mask the separate form takes the persistent walk (+1-5%; the causal mask's uneven tiles make
    it slower there). Every pick is the fastest config of its form in those sweeps (s1024/s4096, causal or not;
    deeper Q/dO rings within 2%: sweeps/2026-12-01-h200-attention-bwd-configs.json, -2 and -5). With few ``keys`` a
    head (``SHORT``: d=128's separate form with the mask) two CTAs an SM of one consumer warpgroup and 64 keys each."""
    if dq_mode == "reduce" and d in REDUCE_PICKS:
        long, most = REDUCE_LONG.get((d, bool(causal)), (None, 0))
        return long if long and keys is not None and keys >= most else REDUCE_PICKS[d]
    short, most = SHORT.get((dq_mode, d, bool(causal)), (None, 0))
    if short and keys is not None and keys <= most:
        return short
    if d == 64 and not causal and dq_mode == "separate":
        return "bwd_64x128_dp2_p"
    return "bwd_64x128_dp2"


def choose_dq_config(d: int, causal: bool) -> str:
    """The dQ kernel's config: 128 queries (two warpgroups of 64) x 128 keys per step, persistent; no spills at d=64
    or 128 (offline, sm_90a). On the H200 128 keys a step ran 1-3% ahead of 64 (sweeps/2026-12-01-h200-attention-
    bwd-configs.json), and the persistent walk 0.5-4% ahead of a CTA per tile at 7 of 8 points, 1.4% behind at one
    (-configs-2)."""
    return "dq_128x128_dp2_p"


#: Head dim -> the fewest keys at which the default form is "reduce" (outside deterministic mode; other head dims:
#: "separate"). Measured on the H200, side by side (sweeps/2026-12-01-h200-attention-bwd-configs-7.json): at d=64
#: the reduce form's pick ran 0.92x/0.99x the separate form's at 512 keys (without/with the causal mask), 0.98x/1.05x
#: at 1024 and 1.02-1.09x from 2048 (the gain grows with the sequence: one main kernel, 5 GEMMs a step, against two
#: kernels and 7). At d=128 its split-dQ fold (``bwd_64x128_dp2_dqsplit_fold``) ran 0.97x the separate form at 1024
#: keys, 1.03-1.04x at 2048, 1.08x at 4096 and 1.11-1.13x at 8192 (sweeps/2026-12-01-h200-attention-bwd-configs-6).
#: Keyed by (head dim, causal): without the mask d=64's reduce pick ran 0.966x the separate form at 1024 keys again
#: with carry_index (-configs-9: 1.066 vs 1.031 ms); the reduce form with two CTAs an SM (``REDUCE_PICKS``) ran 1.04x
#: the separate pick there (2026-12-02-h200-attention-bwd-c2.json), so it starts at 1024 again.
REDUCE_FROM_KEYS: dict[tuple[int, bool], int] = {(64, False): 1024, (64, True): 1024, (128, False): 2048,
                                                 (128, True): 2048}

#: ``REDUCE_FROM_KEYS`` where the key count is whole KV tiles of the reduce form's config (its block_n: the runtime's
#: kv_tma, dK/dV by TMA out of the Q/dO ring, the ``_sr`` picks). On an H100 (-store-in-ring.json, TFLOP/s, reduce /
#: separate / cuDNN): d=128 at 1024 keys 425 / 410 / 398 without the mask, 298 / 269 / 282 with it; at 512 keys
#: 317 / 333 / 294 and 179 / 188 / 169.
REDUCE_FROM_WHOLE_KEYS: dict[tuple[int, bool], int] = {(128, False): 1024, (128, True): 1024}


def reduce_by_default(d: int | None, causal: bool, keys: int | None) -> bool:
    """Whether a call's default form is "reduce" outside deterministic mode: ``REDUCE_FROM_KEYS``, or
    ``REDUCE_FROM_WHOLE_KEYS`` for a key count of whole KV tiles (keys None: as for many keys)."""
    key = (d, bool(causal))
    start = REDUCE_FROM_KEYS.get(key)
    if key in REDUCE_FROM_WHOLE_KEYS and keys is not None and \
            keys % CONFIGS[choose_config(d, causal, "reduce", keys)].block_n == 0:
        start = REDUCE_FROM_WHOLE_KEYS[key]
    return start is not None and (keys is None or keys >= start)


def backward_prior(d: int, causal: bool, keys: int) -> bool:
    """Ours where the recorded grids put it ahead, for a choice that may not measure (runtime.choice's prior): from
    4096 keys (attention-bwd-6 and -7, H200: 1.01-1.08x cuDNN at d=64/128, causal or not); at 512-1024 keys it ran
    0.92-1.08x, so those go to the vendor's backward."""
    return d in (64, 128) and keys >= 4096
