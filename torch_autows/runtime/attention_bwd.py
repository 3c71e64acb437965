"""Attention backward runtime: support check, config choice and launch of the generated kernels
(templates/attention_bwd.py, templates/attention_bwd_dq.py; passes/BACKWARD.md).

``backward(grad_out, grad_lse, q, k, v, out, lse, is_causal, scale, config=None, dq_mode=None, dq_config=None)
-> (dq, dk, dv)`` runs the preprocess (delta, lse2: ``attention_bwd_rows``, one Triton kernel) and then one of three
forms (``dq_mode``):

* "atomic": the main kernel computes dK, dV and adds each step's dQ into a zeroed fp32 workspace with fp32 atomics;
  the dQ conversion (``attention_bwd_rows``) gives dQ = scale * workspace. The adds reorder from run to run: not
  bit-reproducible.
* "reduce": as "atomic", but each step's dQ tile goes registers -> an fp32 SMEM staging tile -> one TMA bulk
  reduce-add (``cp.reduce.async.bulk.tensor ... .add.f32``, FlashAttention-3's dQ accumulation) into a workspace
  padded to whole Q blocks per head; no per-element atomics. Not bit-reproducible either (the adds reorder).
* "separate": the main kernel without dQ (4 GEMMs a step), then the dQ kernel (one CTA per Q block, looping over
  the KV blocks; it recomputes S and dP). Every gradient element is written once by one CTA: deterministic.

``dq_mode`` None picks by head dim, mask and keys (``choose_dq_mode``): "reduce" at d=64 from 1024 keys with the causal
mask and 2048 without, at d=128 from 2048, "separate" elsewhere, "separate" always under deterministic algorithms.
Measured on the H200 (bench/results/2026-12-01-h200-attention-bwd-2.json and -4; sweeps/2026-12-01-h200-attention-
bwd-configs-6.json, -7 and 2026-12-02 -9): separate ran 1.18-1.53x the atomic form everywhere; reduce ran separate's
0.91x (512 keys) to 1.09x (8192) at d=64, 0.97x (1024) to 1.13x (8192) at d=128. "atomic" must be asked for; with
deterministic algorithms on, asking for "atomic" or "reduce" raises ``Unsupported``.
``config`` names the main kernel's config (``CONFIGS``), ``dq_config`` the dQ kernel's
(``DQ_CONFIGS``, separate form only); None: ``choose_config`` / ``choose_dq_config``. It raises ``Unsupported``
with ``support_reason``'s reason where it cannot serve a call; ``attention_grad.attention_backward`` then runs the
vendor's backward. A repeated call with the same shapes, strides, dtypes, arguments and deterministic mode runs the
first call's plan (``_Plan``: no checks or choices again; the generated kernels launched with only the new tensors'
addresses, ``launch.BoundCache``): on the H200 154-226 us of CPU a call against 242-374 for the first path
(bench/results/sweeps/2026-12-02-h200-host-cost-2.json; cuDNN's backward 65-136).
"""
from __future__ import annotations

import functools
from dataclasses import replace

import torch

from ..ir import Options, walk
from ..templates import attention_bwd_dq as dq_host
from ..templates.attention_bwd import HEAD_DIMS, AttentionBwdRequest, gradients, kernel_values, kv_buffers, kv_gradients
from ..templates.attention_bwd_dq import AttentionBwdDqRequest
from . import attention_bwd_rows as rows
from . import device as dev
from .fallback import Unsupported
from .gemm import DTYPES
from .launch import BoundCache, Tma, compile_kernel

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
#: row vectors.
REDUCE_PICKS: dict[int, str] = {64: "bwd_64x64_dp1_c2", 128: "bwd_64x128_dp2_dqsplit_fold"}

#: (head dim, causal) -> (config, keys): from ``keys`` keys a head the reduce form's main kernel is ``config``
#: instead of ``REDUCE_PICKS``'s. d=64: FA3's tile, 128-query steps with the split dQ by query rows (see the config),
#: half the dQ partials' L2 traffic a FLOP of the two-CTA pick. On the H200 (whole backward, TFLOP/s, against
#: bwd_64x64_dp1_c2; sweeps/2026-12-02-h200-attention-bwd-rows.json, -rows-2048.json): 345 / 350 at 1024 keys, 397 /
#: 392 at 2048, 443 / 411 at 4096; causal 244 / 278 at 1024, 328 / 343 at 2048, 398 / 382 at 4096.
REDUCE_LONG: dict[tuple[int, bool], tuple[str, int]] = {(64, False): ("bwd_128x128_dp2_dqsplit_fold", 2048),
                                                        (64, True): ("bwd_128x128_dp2_dqsplit_fold", 4096)}


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


def choose_dq_mode(dq_mode: str | None = None, d: int | None = None, keys: int | None = None,
                   causal: bool = False) -> str:
    """The form for a call at head dim ``d`` with ``keys`` keys a head, with the causal mask or not: ``dq_mode`` if
    given; else "reduce" where ``REDUCE_FROM_KEYS`` says so (keys None: as for many keys) and "separate" elsewhere
    (ahead of "atomic" everywhere), and "separate" always while deterministic algorithms are on (every gradient
    element written once).
    Raises ``Unsupported`` for "atomic" or "reduce" asked for while deterministic algorithms are on."""
    if dq_mode is not None and dq_mode not in DQ_MODES:
        raise ValueError(f"attention backward dq_mode={dq_mode!r}; use one of {DQ_MODES} or None (chosen per call)")
    deterministic = torch.are_deterministic_algorithms_enabled()
    if dq_mode in NONDETERMINISTIC and deterministic:
        how = "fp32 atomics" if dq_mode == "atomic" else "TMA reduce-adds"
        raise Unsupported(f"{dq_mode} dQ is not deterministic (its {how} reorder; torch.use_deterministic_algorithms "
                          f"is on); dq_mode='separate' is")
    if dq_mode is None:
        start = REDUCE_FROM_KEYS.get((d, bool(causal)))
        many = start is not None and (keys is None or keys >= start)
        return "reduce" if many and not deterministic else "separate"
    return dq_mode


def _same(*ts) -> bool:
    return all(t.dtype == ts[0].dtype for t in ts)


def support_reason(q, k, v, out, lse, grad_out, is_causal=False, scale=None, *,
                   check_device: bool = True) -> str | None:
    """Why ``backward`` cannot serve this call (None: it can). Works on fake tensors."""
    why = dev.sm90_reason(q.device, check_device)
    if why:
        return why
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {q.dtype}; the generated attention backward takes bfloat16 or float16"
    if not _same(q, k, v, out, *(() if grad_out is None else (grad_out,))):
        return "q, k, v, out and grad_out differ in dtype; the generated attention backward takes one dtype"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "q, k and v must be [B, H, S, D]"
    D = q.shape[-1]
    if D not in HEAD_DIMS or k.shape[-1] != D or v.shape[-1] != D:
        return (f"head_dim {D} (k {k.shape[-1]}, v {v.shape[-1]}) not served by the generated attention backward "
                f"({', '.join(map(str, HEAD_DIMS))} are, the same for q, k and v)")
    B, Hq, Sq, _ = q.shape
    if k.shape[:3] != v.shape[:3] or k.shape[0] != B or Hq % max(k.shape[1], 1):
        return "k and v must share [B, Hkv, Skv] with q's batch and Hq a multiple of Hkv"
    if Sq < 1 or k.shape[2] < 1 or q.numel() == 0 or k.numel() == 0:
        return "an empty sequence, batch or head count"
    if tuple(out.shape) != tuple(q.shape) or tuple(lse.shape) != (B, Hq, Sq):
        return "out must be q's shape and lse [B, Hq, Sq]"
    tensors = {"q": q, "k": k, "v": v, **({} if grad_out is None else {"grad_out": grad_out})}
    return dev.alignment_reason(**tensors)


#: Tests set this to a float (NaN) that fills dK/dV (and the separate form's dQ) before the launch, so a row the
#: kernel fails to write shows.
POISON: float | None = None

#: (a call's metadata, kernel) -> (launch.Bound, its tensor arguments' names) for calls whose q, k, v and dO are read
#: in place.
_BOUND = BoundCache(256)

_VIEWS = ("q", "k", "v", "do")


def _key(grad_out, grad_lse, q, k, v, out, lse, is_causal, scale, *kernel):
    return tuple((t.shape, t.stride(), t.dtype) if t is not None else None for t in (grad_out, grad_lse, q, k, v, out,
                                                                                      lse)) + (
        q.device, bool(is_causal), float(scale), *kernel)


def _launch(template: str, request, opts: Options, values: dict, grid: int, key, in_place: bool, device) -> None:
    """Run one kernel on ``values`` (a value per argument name; q, k, v and do as 2-D row views; every tensor argument
    of the kernel, the reduce form's dQ workspace too, goes through a TMA descriptor of its whole shape): through the
    bound launch cached under ``key`` where there is one, else compiled (cached by launch.compile_kernel) and launched,
    and bound for next time where ``in_place``."""
    hit = _BOUND.get(key)
    if hit is not None and hit[0](*(values[n].data_ptr() for n in hit[1])):
        return
    idx = dev.index(device)
    grid = dev.grid(grid, opts.persistent, idx, opts.ctas_per_sm)
    try:  # no directory to write the kernel source to (or another OSError): the vendor's backward serves the call
        kernel = compile_kernel(template, request, opts)
        launcher = kernel.launcher
    except OSError as e:
        raise Unsupported(f"could not build the kernel: {e}") from e
    names = tuple(a.name for a in kernel.program.args if a.kind != "scalar")
    descs = [a.name for a in kernel.program.args if a.kind == "tensor"]
    args = launcher.ordered({**values, **{n: Tma(values[n], tuple(values[n].shape), tuple(values[n].stride()))
                                          for n in descs}})
    try:
        launcher(grid, args, idx)
    except OSError as e:
        raise Unsupported(f"could not compile the kernel: {e}") from e
    if in_place:
        _BOUND.remember(key, launcher, grid, args, idx, names)


@functools.lru_cache(maxsize=256)
def _stages_in_slots(template: str, request, opts: Options) -> bool:
    """Whether ``request``'s program stages every TMA store in a slot its partition has finished reading
    (passes/buffers.stage_in_slots): the gradients then go out by TMA with the SMEM plan of the pointer stores. Where
    a store would need SMEM of its own (the dq_split configs' dV: K is read by both chains), the pointer form stays."""
    try:
        program = compile_kernel(template, request, opts).program
    except OSError:  # no directory for the kernel source: _launch says so for the form it falls back to
        return False
    return all(o.attr("stage") for pt in program.partitions for o in walk(pt.body) if o.kind == "store")


def tma_request(template: str, request, opts: Options, whole: bool, field: str):
    """``request`` with ``field`` (kv_tma, dq_tma: gradient tiles stored by TMA) set where its tiles are ``whole`` (no
    tile row in another head) and the stores stage in slots (``_stages_in_slots``), else ``request``."""
    tma = replace(request, **{field: True})
    return tma if whole and _stages_in_slots(template, tma, opts) else request


def _checked(config: str | None, d: int, causal: bool, dq_mode: str, keys: int | None = None) -> str:
    if not any(serves(c, d, dq_mode) for c in CONFIGS):
        raise Unsupported(f"no config serves head dim {d} in the {dq_mode} form without spills (CONFIG_HEAD_DIMS); "
                          f"dq_mode='separate' does")
    config = config or choose_config(d, causal, dq_mode, keys)
    if not serves(config, d, dq_mode):
        raise ValueError(f"attention backward config {config!r} serves head dims "
                         f"{CONFIG_HEAD_DIMS.get(config, {}).get(dq_mode, ())} in the {dq_mode} form, not {d}; use "
                         f"one of {sorted(c for c in CONFIGS if serves(c, d, dq_mode))}")
    return config


class _Plan:
    """What a repeated call needs besides its tensors (``backward``'s fast path): the form, the sizes of what it
    allocates, and the main and dQ kernels' bound launches with the names of their tensor arguments. Built after a
    call that read q, k, v, dO and lse in place; ``run`` returns None (the caller takes the full path) where a bound
    launch cannot serve the call (an address not 16-byte aligned, a launch hook)."""

    def __init__(self, q, k, form: str, values: dict, block_n: int, scale: float, main, dq):
        self.shape_q = tuple(q.shape)
        self.form, self.scale = form, scale
        self.launched = values["NB"] * block_n  # keys of the launched KV blocks (``kernel_values``)
        self.ws = values["dq_acc"].shape[0] if "dq_acc" in values else 0
        self.main, self.dq = main, dq

    def run(self, grad_out, grad_lse, q, k, v, out, lse):
        delta, lse2 = rows.preprocess(out, grad_out, lse, grad_lse)
        dk, dv = kv_buffers(k, self.launched)
        addr = {"q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "do": grad_out.data_ptr(),
                "lse2": lse2.data_ptr(), "delta": delta.data_ptr(), "dk": dk.data_ptr(), "dv": dv.data_ptr()}
        if self.ws:
            acc = torch.zeros(self.ws, self.shape_q[3], dtype=torch.float32, device=q.device)
            addr["dq_acc"] = acc.data_ptr()
        if not self.main[0](*(addr[n] for n in self.main[1])):
            return None
        if self.form != "separate":
            return rows.postprocess(acc, self.scale, q), dk, dv
        dq = torch.empty(self.shape_q, dtype=q.dtype, device=q.device)
        addr["dq"] = dq.data_ptr()
        if not self.dq[0](*(addr[n] for n in self.dq[1])):
            return None
        return dq, dk, dv


#: (a call's metadata, its config arguments, deterministic mode) -> _Plan. The choice tables are read once per key.
_PLANS = BoundCache(256)

#: The tensor arguments a plan can address (``_Plan.run``); a kernel with another one gets no plan.
_PLANNED = {"q", "k", "v", "do", "lse2", "delta", "dk", "dv", "dq_acc", "dq"}


def _remember_plan(key, q, k, form: str, values: dict, block_n: int, scale: float, main, dq=None) -> None:
    """Keep the plan of a call whose kernels were bound (``main``, and ``dq`` in the separate form)."""
    if main is None or (dq is None) != (form != "separate"):
        return
    if set(main[1]) | set(dq[1] if dq else ()) <= _PLANNED:
        _PLANS.put(key, _Plan(q, k, form, values, block_n, scale, main, dq))


def backward(grad_out, grad_lse, q, k, v, out, lse, is_causal: bool, scale: float, config: str | None = None,
             dq_mode: str | None = None, dq_config: str | None = None):
    """(dq, dk, dv), [B, H, S, D] each (dk/dv with k's heads), of ``(out, lse) = attention(q, k, v, is_causal,
    scale)`` by the generated kernels; ``grad_out`` or ``grad_lse`` may be None (no gradient into it). ``dq_mode``
    "atomic", "reduce" or "separate" forces a form (None: ``choose_dq_mode``); ``config`` / ``dq_config`` name the main
    and the dQ kernel's configs (None: chosen). Raises ``Unsupported`` where ``support_reason`` gives a reason (or for
    the atomic and reduce forms under deterministic algorithms, or a form no config serves at the head dim).
    A call with the metadata, arguments and deterministic mode of an earlier one that read its tensors in place
    takes that call's plan (``_Plan``): no checks or choices again, only the allocations and bound launches."""
    plan_key = (_key(grad_out, grad_lse, q, k, v, out, lse, is_causal, scale), config, dq_mode, dq_config,
                torch.are_deterministic_algorithms_enabled())
    plan = _PLANS.get(plan_key)
    if plan is not None and POISON is None:
        got = plan.run(grad_out, grad_lse, q, k, v, out, lse)
        if got is not None:
            return got
    why = support_reason(q, k, v, out, lse, grad_out, is_causal, scale)
    if why:
        raise Unsupported(why)
    D = q.shape[-1]
    causal, scale = bool(is_causal), float(scale)
    dq_mode = choose_dq_mode(dq_mode, D, k.shape[2], causal)
    config = _checked(config, D, causal, dq_mode, k.shape[2])
    if dq_mode == "separate":
        dq_config = dq_config or choose_dq_config(D, causal)
        if not dq_serves(dq_config, D):
            raise ValueError(f"attention backward dq_config {dq_config!r} does not serve head dim {D}; use one of "
                             f"{sorted(c for c in DQ_CONFIGS if dq_serves(c, D))}")
    elif dq_config is not None:
        raise ValueError(f"dq_config={dq_config!r} is for the separate form; pass dq_mode='separate' with it")
    opts = CONFIGS[config]
    form = "none" if dq_mode == "separate" else dq_mode
    delta, lse2 = rows.preprocess(out, grad_out, lse, grad_lse)
    values = kernel_values(q, k, v, grad_out, delta, lse2, causal, scale, opts.block_n, POISON, dq=form,
                           block_m=opts.block_m, fold=opts.fold_rows)
    in_place = grad_out is not None and all(values[n].data_ptr() == t.data_ptr() for n, t in zip(_VIEWS,
                                                                                                 (q, k, v, grad_out)))
    call = plan_key[0]
    Sq, Skv = q.shape[2], k.shape[2]
    # dK/dV by TMA where every KV tile is whole; not the atomic form (asked for only, never chosen): at d=128 its
    # registers are full at the stores and the staged stores spill more (540 against 440 bytes offline)
    main = tma_request("attention_bwd", AttentionBwdRequest(D, DTYPES[q.dtype], causal, dq=form), opts,
                       Skv % opts.block_n == 0 and form != "atomic", "kv_tma")
    # one CTA per (batch, kv-head) and launched KV block
    _launch("attention_bwd", main, opts, values,
            values["BH"] * values["NB"], call + ("main", config, form), in_place, q.device)
    main_bound = _BOUND.get(call + ("main", config, form))
    if dq_mode != "separate":
        if in_place and POISON is None:
            _remember_plan(plan_key, q, k, dq_mode, values, opts.block_n, scale, main_bound)
        return gradients(values, scale, q, k, post=rows.postprocess)
    dq_opts = DQ_CONFIGS[dq_config]
    dq_values = dq_host.kernel_values(q, k, v, grad_out, delta, lse2, causal, scale, POISON, views=values)
    dq_req = tma_request("attention_bwd_dq", AttentionBwdDqRequest(D, DTYPES[q.dtype], causal), dq_opts,
                         Sq % dq_opts.block_m == 0, "dq_tma")
    # one CTA per (batch, q-head) and block of queries
    _launch("attention_bwd_dq", dq_req, dq_opts, dq_values,
            dq_values["BH"] * dq_host.q_tiles(q.shape[2], dq_opts.block_m), call + ("dq", dq_config), in_place,
            q.device)
    if in_place and POISON is None:
        _remember_plan(plan_key, q, k, dq_mode, values, opts.block_n, scale, main_bound,
                       _BOUND.get(call + ("dq", dq_config)))
    return (dq_host.gradient(dq_values, q), *kv_gradients(values, k))
