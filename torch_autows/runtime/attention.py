"""Attention runtime: support check, compiled-kernel cache and launch of the generated flash forward.

``support_reason(q, k, v, is_causal, scale)`` says why a call cannot run the generated kernel (None:
it can; works on fake tensors). ``attention`` raises ``Unsupported`` with that reason, else runs
templates.attention -> passes.pipeline -> codegen.gluon and returns (out, lse); ``out`` is in q's
layout when q is a transposed [B, S, H, D] tensor (``empty_out``), or the ``out=`` given. Head dims 64, 96, 128,
192 and 256 are served; 96 and 192 run in wider tiles, so their q/k/v in [B, S, H, D] rows with several heads
are read from [B, H, S, D] copies (``_in_place``'s ``own_cols``). v may have a head dim of its own where
``V_HEAD_DIMS`` lists the pair (192 / 128, MLA prefill): the output takes v's, and k and v, which the kernel addresses
with one (rb, rh, ch), are read as [B, H, S, D] rows (copies where they are not) unless there is one kv head.
"""
from __future__ import annotations

import functools
import math
from dataclasses import replace

import torch

from ..ir import Options
from ..templates.attention import HEAD_DIMS as TEMPLATE_HEAD_DIMS
from ..templates.attention import AttentionRequest, tile_cols, tile_d
from . import choice
from . import device as dev
from .fallback import Unsupported
from .gemm import DTYPES
from .launch import BoundCache, Tma, compile_kernel

LOG2E = 1.4426950408889634

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
_WIDE = Options(block_m=128, block_n=64, stages=2, data_partition=2, persistent=True, serpentine=True, group_m=16,
                raw_max=True)
CONFIGS: dict[str, Options] = {
    "ws_p_128x128": _ONE_Q,
    "ws_p_128x128_q2": _Q2,
    # The running max on unscaled scores (one FFMA per score in the softmax; positive scales only).
    "ws_p_128x128_q2_rm": replace(_Q2, raw_max=True),
    # raw_max, and a head's causal query tiles back to back in groups of 16 (group_m): the CTAs of a wave
    # share K/V in L2. Non-causal grids ignore group_m. Picked, except d=64 from 8192 keys.
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
    # Picked for d=64 from 8192 keys.
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
    # (sweeps/2026-12-02-h200-attention-mla-2.json). Picked for 192/128.
    "ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2": replace(_WIDE, split_d=True, split_d_binary=True, defer_mma=True, stages=3,
                                                  lead_chains=True, tile_buffers=2),
    "ws_p_128x128_q2_rm_g16_sdb": replace(_Q2, raw_max=True, group_m=16, split_d=True, split_d_binary=True),
    # d=96 in the d=128 pick's schedule, in three 32-column pieces: K 3 + V 4 ring slots fit (the padded tiles: 2 + 3).
    # +2-11% over the padded d=128 tiles, 1.04-1.11x cuDNN (H200, s1024-s16384, causal or not); the binary pieces
    # above are 4-7% ahead of it.
    "ws_p_128x128_q2_rm_g16_sd": replace(_Q2, raw_max=True, group_m=16, split_d=True),
}

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
    "ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2": (),  # 192 / 128 only (V_HEAD_DIMS)
}


#: Head dims (q and k, v and o) served where they differ, with the configs that serve each pair (compiled offline
#: without spills, interpreted under every policy: test/passes/test_split_d.py), the first picked: DeepSeek-style MLA
#: prefill, d_qk 192 (128 + 64 in binary pieces) and d_v 128 (one piece) in the d=192 pick's schedule, there with two
#: Q copies: on the H200 0.93-1.01x cuDNN without the mask, 1.04-1.08x with it, at s1024-s16384 (the one-copy form
#: 0.93-0.97x / 0.98-1.00x, the 128-key variants 3-15% behind it: sweeps/2026-12-02-h200-attention-mla*.json); the
#: measured choice keeps cuDNN where it is faster.
V_HEAD_DIMS: dict[tuple[int, int], tuple[str, ...]] = {
    (192, 128): ("ws_p_128x64_rm_g16_sdb_dm_s3_lc_q2", "ws_p_128x64_rm_g16_sdb_dm_s3_lc")}


def v_head_dims_text() -> str:
    """The served (q/k, v) head-dim pairs of ``V_HEAD_DIMS``, for messages: "192/128"."""
    return ", ".join(f"{d}/{dv}" for d, dv in V_HEAD_DIMS)


def serves(config: str, d: int, d_v: int | None = None) -> bool:
    """Whether ``config`` runs head dim ``d`` (and v head dim ``d_v``: None, the same) without spilling (HEAD_DIMS,
    V_HEAD_DIMS)."""
    if d_v is not None and d_v != d:
        return config in V_HEAD_DIMS.get((d, d_v), ())
    return d in HEAD_DIMS.get(config, ())


def choose_config(d: int, causal: bool, seqlen_kv: int, d_v: int | None = None) -> str:
    """The config for a call, from the H200 grid sweeps (bench/results/sweeps/, median of 3 interleaved rounds
    against cuDNN in one process):

    * raw_max everywhere: 0.919 against 0.873 cuDNN geomean for the same kernel without it (FFMA softmax);
    * causal query tiles grouped 16 per head: +10-20% on causal s1024-s4096 (0.956 geomean with both);
    * d=64 with 8192 keys or more: three consumer warpgroups of 64 rows (192 per tile), +4-10% there. Shorter
      sequences have too few 192-row tiles per SM, and up to 12% lose;
    * d=96 and d=192 in column pieces instead of tiles padded to 128 / 256 columns: equal pieces (split_d) +2-11%
      over the padded kernel at d=96, +18-33% at d=192 with P V deferred; the widest pieces first (split_d_binary:
      64 + 32, 128 + 64) 4-7% ahead of the equal ones at d=96 (1.05-1.18x cuDNN) and -0.5..+7% at d=192 (0.93-0.97x
      cuDNN: the prior leaves d=192 with SDPA), at d=192 with both Q K^T pieces issued before the deferred P V
      (lead_chains) +1.2-2.4% more (sweeps/2026-12-01-h200-attention-split-d*.json, -lead-chains.json);
    * d=256 in 128x64 tiles with P V deferred and a third V slot: +1.7-6.1% over the same tiles undeferred
      (sweeps/2026-12-02-h200-attention-d256-3.json);
    * causal d=128 up to 4096 keys: the two consumers ping-pong their mmas, +1.5-4% (-pp-2.json; longer causal
      sequences not measured with it yet).
    """
    if d_v is not None and d_v != d:
        return V_HEAD_DIMS[(d, d_v)][0]
    if d == 64 and seqlen_kv >= 8192:
        return "ws_p3_192x128_q2_rm_g8"
    if d == 128 and causal and seqlen_kv <= 4096:
        return "ws_p_128x128_q2_rm_g16_pp"
    if d == 96:
        return "ws_p_128x128_q2_rm_g16_sdb"
    if d == 192:
        return "ws_p_128x64_rm_g16_sdb_dm_s3_lc"
    if tile_d(d) > 128:
        return "ws_p_128x64_rm_g16_dm_s3"
    return "ws_p_128x128_q2_rm_g16"


def support_reason(q, k, v, is_causal=False, scale=None, *, check_device: bool = True) -> str | None:
    why = dev.sm90_reason(q.device, check_device)
    if why:
        return why
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {q.dtype}; generated attention takes bfloat16 or float16"
    D, Dv = q.shape[-1], v.shape[-1]
    if D not in TEMPLATE_HEAD_DIMS:
        served = ", ".join(map(str, TEMPLATE_HEAD_DIMS))
        return f"head_dim {D} not served by autows attention ({served} are); falling back to torch SDPA"
    if Dv != D and (D, Dv) not in V_HEAD_DIMS:
        return (f"head dims {D} (q, k) and {Dv} (v): autows attention serves a v head dim of its own only as "
                f"{v_head_dims_text()}; falling back to torch SDPA")
    if q.shape[-2] < 1 or k.shape[-2] < 1:
        return "an empty sequence"
    if q.numel() == 0 or k.numel() == 0:
        return "an empty batch or no heads"
    return dev.alignment_reason(q=q, k=k, v=v)


def options_for(config: str, scale: float) -> Options:
    """The config's options for a call: ``raw_max`` (max on unscaled scores) holds for positive scales
    only, so any other scale gets the scaled form."""
    opts = CONFIGS[config]
    return replace(opts, raw_max=False) if opts.raw_max and not scale > 0 else opts


def o_tma_ok(Sq: int, d: int, opts: Options, out: torch.Tensor | None = None) -> bool:
    """Whether O may be stored by TMA (templates.attention, ``o_tma``): every query tile whole (Sq % block_m == 0) and
    no padding columns (d a power of two, or split in pieces: ``split_d``), so no tile row or column lies in another
    head; ``out`` 16-byte aligned
    (TMA's rule; a row pitch of whole 16 bytes is _out_view's). cross_tile refuses TMA stores (passes/cross_tile)."""
    return (Sq % opts.block_m == 0 and tile_cols(d, opts) == d and not opts.cross_tile
            and (out is None or out.data_ptr() % 16 == 0))


def _plan(req: AttentionRequest, opts: Options):
    """(Program, Launcher) of a request (launch.compile_kernel caches them)."""
    kernel = compile_kernel("attention", req, opts)
    return kernel.program, kernel.launcher


def _in_place(t: torch.Tensor, bshd_first: bool = False, own_cols: bool = False):
    """(tensor, rb, rh, ch, ld) of a [B, H, S, D] tensor addressed as rows of sequence positions (see the
    template) with a row pitch of ``ld`` elements, without a copy; None when it cannot be.

    Two row orders: [B, H, S, D] (rb=H*S, rh=S, ch=0; rows of D) and [B, S, H, D], the layout models
    transpose (rb=S, rh=0, ch=D; rows of H*D). Rows may be longer than that (``ld``), as for q, k and v
    sliced from one fused QKV projection [B, S, 3, H, D]. TMA needs ``ld`` a multiple of 16 bytes.
    With a length-1 dim both orders may fit; ``bshd_first`` says which to try first. ``own_cols``: only a view
    whose rows end at the head's last column (not [B, S, H, D] rows with H > 1), for a kernel whose tiles are
    wider than D (templates.attention.tile_d): TMA then reads the columns past D as zeros, not the next head."""
    B, H, S, D = t.shape
    sb, sh, ss, sd = t.stride()
    if t.numel() == 0:  # nothing to address (and no pitch to derive)
        return None
    if D > 1 and sd != 1:
        return None
    forms = [(H * S, S, 0, D, ((S, ss), (H, sh), (B, sb))), (S, 0, D, H * D, ((S, ss), (B, sb)))]
    for rb, rh, ch, cols, order in forms[::-1] if bshd_first else forms:
        if ch and H > 1 and (sh != D or own_cols):
            continue
        ld, ok, rows = None, True, 1  # the pitch: the stride of the innermost row dim with more than one entry
        for n, st in order:
            if n > 1:
                ld = st // rows if ld is None and st % rows == 0 else ld
                ok = ok and ld is not None and st == rows * ld
            rows *= n
        ld = cols if ld is None else ld
        if ok and ld >= cols and (ld * t.element_size()) % 16 == 0:
            return t, rb, rh, ch, ld
    return None


def _rows_view(t: torch.Tensor, own_cols: bool = False):
    """``_in_place(t, own_cols=own_cols)``, or a [B, H, S, D]-contiguous copy's."""
    return _in_place(t, own_cols=own_cols) or _in_place(t.contiguous(), own_cols=own_cols)


def _kv_views(k: torch.Tensor, v: torch.Tensor, own_cols: bool = False):
    """Row views of k and v with the same (rb, rh, ch), which the kernel shares between them: v in place if
    it can be read in k's row order, else a copy of v in that order (``own_cols``: see ``_in_place``)."""
    kv = _rows_view(k, own_cols)
    bshd = bool(kv[3])
    vv = _in_place(v, bshd, own_cols)
    # the kernel addresses v with k's (rb, rh, ch); with one head ch is never used (v's head dim may differ from k's)
    if vv is None or vv[1:3] != kv[1:3] or (vv[3] != kv[3] and v.shape[1] > 1):
        vv = _in_place(v.transpose(1, 2).contiguous().transpose(1, 2) if bshd else v.contiguous(), bshd, own_cols)
    return kv, vv


def empty_out(q: torch.Tensor, d: int | None = None) -> torch.Tensor:
    """The output for q: [B, Hq, Sq, D] in q's layout when q is read as [B, S, H, D] rows (models transpose it
    back to [B, S, H*D], which is then a view), else contiguous."""
    B, H, S, D = q.shape
    d = d or D
    view = _in_place(q)
    if view is not None and view[3]:  # ch != 0: q is read as [B, S, H, D]
        return q.new_empty((B, S, H, d)).transpose(1, 2)
    return q.new_empty((B, H, S, d))


def _out_view(out: torch.Tensor):
    """``_in_place(out)`` when its rows are packed (the kernel stores O with a pitch it derives), else None."""
    view = _in_place(out)
    B, H, S, D = out.shape
    return view if view is not None and view[4] == (H * D if view[3] else D) else None


def _tma(view) -> Tma:
    """The 2-D TMA argument of a ``_rows_view``: B*rb rows of D (or, [B, S, H, D], H*D) columns, ld apart."""
    t, rb, _, ch, ld = view
    B, H, S, D = t.shape
    return Tma(t, (B * rb, H * D if ch else D), (ld, 1))


#: A call's metadata -> (launch.Bound, out's allocation (shape, transposed), lse shape), for calls that read
#: q, k, v and write out in place: a repeated call passes only addresses (see runtime.gemm._BOUND).
_BOUND = BoundCache(256)


def _new(q, shape, transposed: bool, dtype=None) -> torch.Tensor:
    t = torch.empty(shape, device=q.device, dtype=dtype or q.dtype)
    return t.transpose(1, 2) if transposed else t


#: A ``_BOUND`` entry for a key whose decision is the vendor's path (runtime.choice): the call returns None.
VENDOR = ("vendor",)


def site_decision(q, k, v, is_causal: bool, scale: float | None, vendor) -> choice.Decision:
    """The choice for an attention site seen at compile time with static sizes (fake tensors allowed): made on
    real random tensors like them on the same GPU (see runtime.gemm.site_decision)."""
    q, k, v = (choice.materialize(t) for t in (q, k, v))
    return _decide(q, k, v, is_causal, scale if scale is not None else q.shape[-1] ** -0.5, vendor)


def _decide(q, k, v, is_causal: bool, scale: float, vendor) -> choice.Decision:
    """The measured / cached / prior choice (runtime.choice) between our kernel and ``vendor`` (SDPA's fused pick,
    given by the caller) for this call."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    layout = tuple(bool(x and x[3]) for x in (_in_place(q), _in_place(k), _in_place(v)))  # [B, S, H, D] rows?
    Dv = v.shape[-1]
    key = ("attention", str(q.dtype), D if Dv == D else (D, Dv), is_causal, scale > 0, Hq, Hkv, layout,
           choice.bucket(B), choice.bucket(Sq), choice.bucket(Skv))
    ours = functools.partial(attention, q, k, v, is_causal, scale, "auto")
    theirs = functools.partial(vendor, q, k, v, is_causal, scale) if vendor is not None else None
    return choice.decide(key, ours, theirs, choice.attention_prior(D, is_causal, Skv), q.device)


def attention(q, k, v, is_causal: bool, scale: float, config: str | None = None,
              out: torch.Tensor | None = None, lse: torch.Tensor | None = None, vendor=None):
    """(out, lse) by the generated kernel. With ``vendor`` (a function of (q, k, v, is_causal, scale)) and no
    ``config``, the call returns None where runtime.choice finds the vendor faster (the caller runs it); a
    config name (or "auto": the heuristic's) always runs our kernel."""
    choose = vendor is not None and config is None
    key = (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, v.shape, v.stride(), v.dtype,
           is_causal, scale, config, out is not None and (out.shape, out.stride(), out.dtype),
           lse is not None and (lse.shape, lse.stride(), lse.dtype), choose and choice.mode())
    hit = _BOUND.get(key)
    if hit is VENDOR:
        return None
    if hit is not None:
        bound, out_alloc, lse_shape = hit
        o = out if out is not None else _new(q, *out_alloc)
        m = lse if lse is not None else _new(q, lse_shape, False, torch.float32)
        if bound(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), m.data_ptr()):
            return o, m
    why = support_reason(q, k, v, is_causal, scale)
    if why:
        raise Unsupported(why)
    if choose and not _decide(q, k, v, is_causal, scale, vendor).use_ours:
        _BOUND.put(key, VENDOR)
        return None
    config = None if config == "auto" else config
    B, Hq, Sq, D = q.shape
    Hkv, Skv, Dv = k.shape[1], k.shape[2], v.shape[-1]
    config = config or choose_config(D, is_causal, Skv, Dv)
    if not serves(config, D, Dv):
        dims = f"{D}/{Dv}" if Dv != D else str(D)
        raise ValueError(f"attention config {config!r} does not serve head dims {dims} (HEAD_DIMS, V_HEAD_DIMS)")
    opts = options_for(config, scale)
    # tiles wider than D (a padded head dim): q, k and v read so that the columns past D are zeros; with a v head dim
    # of its own, k and v (which share their row addressing) in [B, H, S, D] rows unless there is one head
    own_cols = tile_cols(D, opts) != D
    qv, (kv, vv) = _rows_view(q, own_cols), _kv_views(k, v, own_cols or (Dv != D and Hkv > 1))
    given = out
    ov = _out_view(out) if out is not None else None
    if ov is None:  # none given, or in neither layout (then written through a copy, below)
        out = empty_out(q, Dv)
        ov = _out_view(out)
    lse = lse if lse is not None else torch.empty((B, Hq, Sq), device=q.device, dtype=torch.float32)
    req = AttentionRequest(D, DTYPES[q.dtype], bool(is_causal), o_tma=o_tma_ok(Sq, Dv, opts, out),
                           d_v=Dv if Dv != D else 0)
    try:  # no directory to write the kernel source to (or another OSError): torch serves the call, with why
        program, launcher = _plan(req, opts)
    except OSError as e:
        raise Unsupported(f"could not build the kernel: {e}") from e
    BH = B * Hq
    values = {"q": _tma(qv), "k": _tma(kv), "v": _tma(vv), "o": _tma(ov) if req.o_tma else out, "lse": lse,
              "Sq": Sq, "Skv": Skv, "Hq": Hq, "Hkv": Hkv, "G": Hq // Hkv, "qk_scale": float(scale) * LOG2E, "BH": BH}
    for prefix, view in (("q", qv), ("kv", kv), ("o", ov)):  # (rb, rh, ch) of each row view
        values.update(zip((f"{prefix}_rb", f"{prefix}_rh", f"{prefix}_ch"), view[1:4]))
    args = launcher.ordered(values)  # by templates.attention's argument names
    tiles = BH * math.ceil(Sq / program.options.block_m)
    idx = dev.index(out.device)
    grid = dev.grid(tiles, program.grid.persistent, idx)
    try:  # the first launch of a specialisation compiles it (Triton's cache may be unwritable)
        launcher(grid, args, idx)
    except OSError as e:
        raise Unsupported(f"could not compile the kernel: {e}") from e
    if qv[0] is q and kv[0] is k and vv[0] is v and (given is None or given is out):  # no copies were made
        bshd = bool(qv[3])  # empty_out's layout
        out_alloc = ((B, Sq, Hq, Dv) if bshd else (B, Hq, Sq, Dv), bshd)  # v's head dim
        _BOUND.remember(key, launcher, grid, args, idx, out_alloc, (B, Hq, Sq))
    if given is not None and given is not out:
        given.copy_(out)
        out = given
    return out, lse
