"""Attention backward template, the main kernel (passes/BACKWARD.md §2): dK, dV and the fp32 dQ workspace of
``(out, lse) = attention(q, k, v)`` from dO, in FlashAttention-3's transposed frame.

One tile is BN keys (block ``pid_n``) of one (batch, kv-head) ``pid_bh`` of B*Hkv. K_n and V_n are loaded once and
stay in SMEM; dK_n and dV_n accumulate in registers while the loop walks, for each of the G q-heads of the group,
the Q blocks that see these keys (causal: from m_lo = n*BN // BM on). Per step (q-head h, Q block m), with c =
scale * log2 e and lse2 = lse * log2 e, delta = rowsum(dO * O) (minus dlse with a gradient into lse) from the
preprocess (``runtime/attention_bwd.py``):

    S^T = K Q^T   dP^T = V dO^T   P^T = exp2(mask(S^T * c) - lse2)   dS^T = P^T (dP^T - delta)
    dV += P^T dO   dK += dS^T Q   dQ_acc[h, m] += (dS^T)^T K   (dS^T through SMEM: smem_store, then a trans view)

and at the end dK *= scale. With ``Options.fold_rows`` (``folds_rows``: for 64-query steps at d=128) lse2 and delta
enter as the accumulators' initial values instead: S^T starts at -lse2/c, dP^T at -delta (scalars ``qk_fold`` = c
and ``lse_fold`` = -1/c), so P^T = exp2(mask(c * S^T)) and dS^T = P^T dP^T. With ``dq="none"`` (the separate form,
deterministic) dQ is left out: no dS SMEM tile, no dQ mma, no adds, 4 GEMMs a step; the attention_bwd_dq template
computes dQ. With ``dq="atomic"`` dQ_acc
[B*Hq*Sq, tile_d] f32 is added to with per-element fp32 atomics (several KV blocks add to one Q block); with
``dq="reduce"`` each chain's [BM, D] partial goes to its own fp32 SMEM staging tile and one TMA bulk reduce-add
(``tma_reduce_add``) adds it into dQ_acc [B*Hq*Sqp, tile_d], Sqp = ``padded_rows(Sq, BM)``: a whole tile lands in its
head's own rows (a 2-D descriptor clips only at the end of the tensor, so without the padding a head's last tile would
reach into the next head's rows). The postprocess turns scale * dQ_acc (its first Sq rows per head) into dQ.
Tensors are read through the forward's 2-D row views (rows ``b*rb + h*rh + s``, columns ``h*ch + d``): q, k, v
and do each with their own (rb, rh, ch), dk and dv written
through pointers with (dk_rb, dk_rh, dk_ch) and rows of D + (Hkv-1)*dk_ch elements. Rows past a head's end are
other heads' rows, so every padded score must give P = 0: the mask keeps key < Skv, query < Sq and (causal,
top-left) key <= query, and lse2/delta ([B*Hq, Sq] views, ``row_vectors``) are loaded with Q and dO by the producer:
each step's [1, BM] columns by TMA, which reads 0 past Sq, so no NaN enters (a consumer reading them from global memory
itself waited out the load's latency at the top of every step: 16-23% of the kernel's time on the H200,
sweeps/2026-12-01-h200-attention-bwd-ablate.json). dK/dV rows are stored up to Skv, dQ rows added up to Sq.

The host side, pure torch (templates of their own later; ``runtime/attention_bwd.py`` runs it around the launch):

    delta, lse2 = preprocess(out, grad_out, lse, grad_lse)   rowsum(fp32(dO) * fp32(O)) [- dlse]; fin0(lse) * log2 e
    values = kernel_values(q, k, v, grad_out, delta, lse2, causal, scale, block_n)
                                                           a value per argument name: 2-D row views, the zeroed
                                                           fp32 dQ workspace, dK/dV (rows of the KV blocks the
                                                           kernel skips already zero), scalars
    dq, dk, dv = gradients(values, scale, q, k)            dQ = scale * dQ_acc in q's dtype; [B, H, S, D] each

Causal: a KV block whose first key is at or past Sq sees no query; the runtime launches only the blocks n <
cdiv(min(Sq, Skv), BN) (the ``NB`` scalar: ``kv_blocks``) and zeroes the rest of dK/dV
itself, so every loop runs at least once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..ir import Arg, Grid, Op, Options, Program, TileType, Value, op

#: Head dims the template takes (tile width = head dim).
HEAD_DIMS = (64, 128)
#: Operand dtypes: bf16/fp16 for the GPU; f32 for the CPU interpreter's exact checks (codegen takes 16-bit only).
DTYPES = ("bf16", "fp16", "f32")
#: What the kernel does with dQ: "atomic" adds each step's dS K into the fp32 workspace dq_acc with per-element
#: atomics; "reduce" adds it with one TMA bulk reduce-add per tile (through an fp32 SMEM staging tile, FA3's form) into
#: a workspace of ``padded_rows`` rows per head; "none" leaves dQ out (no dS SMEM tile, no dQ mma, no adds: 4 GEMMs a
#: step) for the separate dQ kernel (templates/attention_bwd_dq.py).
DQ_FORMS = ("atomic", "reduce", "none")


@dataclass(frozen=True)
class AttentionBwdRequest:
    d: int
    dtype: str = "bf16"
    causal: bool = False
    dq: str = "atomic"  # DQ_FORMS
    kv_tma: bool = False  # dK/dV stored by TMA (Skv % block_n == 0: no tile row in another head; see build)

    def __post_init__(self):
        if self.dq not in DQ_FORMS:
            raise ValueError(f"attention_bwd template: dq={self.dq!r}; use one of {DQ_FORMS} ('none': dQ by the "
                             f"attention_bwd_dq template)")
        if self.dtype not in DTYPES:
            raise ValueError(f"attention_bwd template: dtype {self.dtype!r} not served; use one of {DTYPES}")
        if self.d not in HEAD_DIMS:
            raise ValueError(f"attention_bwd template: head dim {self.d} not served; use one of {HEAD_DIMS}")


def q_blocks(BM: int, BN: int, causal: bool) -> tuple[str, str]:
    """(first Q block, Q blocks per q-head) that KV block ``pid_n`` sees, as index expressions."""
    lo = "(pid_n*%d)//%d" % (BN, BM) if causal else "0"
    return lo, "(cdiv(Sq,%d)-%s)" % (BM, lo)


#: |c| of the folded form's scale is at least this (``qk_fold``): 1/c stays finite (c = 0 is a valid scale).
FOLD_MIN = 2.0 ** -100


def folds_rows(req: AttentionBwdRequest, opts: Options) -> bool:
    """Whether the step folds lse2 and delta into S^T's and dP^T's initial accumulators (``Options.fold_rows``): S^T
    starts at -lse2/c broadcast over its rows and dP^T at -delta, so c * S^T is exp2's argument and the mma gives
    dP^T - delta directly; the two vectors die when their mmas are issued instead of living across the S^T/dP^T waits,
    the mask, exp2 and the dV mma's issue (in the transposed frame a thread holds 16 of a 64-query step's columns:
    32 registers). ``bwd_64x128_dp2``'s separate form at d=128 spills 120 bytes, causal 172, without it and none with
    it (its broadcast initial values are emitted so that ptxas does not wait for S^T before dP^T's issue:
    codegen/sm90.py ``_zeros``); on the H200 the folded config (``bwd_64x128_dp2_fold``) is not faster there; at d=64
    (reduce form, persistent, no mask) it is, by 1.3-1.5% (``bwd_64x128_dp2_p_fold``, picked). c is ``qk_fold``:
    scale * log2 e with its magnitude raised to ``FOLD_MIN`` if smaller (``fold_scale``): 1/c is then finite, and a
    raised c (|scale| < 5.4e-31, or 0) changes exp2's argument by less than |S| * 2**-100."""
    return opts.fold_rows


def backward_args(dt: str, outs: tuple, out_views: str, rows: str = "ptr") -> tuple:
    """The arguments both backward kernels take, in order: q, k, v, dO (descriptors), lse2 and delta (f32, [B*Hq, Sq]
    with rows ``row_pitch(Sq)`` apart: ``rows`` "tensor", TMA descriptors, or "ptr", pointers), ``outs``, the
    lengths, head counts and scales, then the 2-D row views' (rb, rh, ch) of q, k/v, dO and ``out_views`` (the
    written gradients'), and BH."""
    views = [Arg(f"{t}_{s}", "scalar", "i32") for t in ("q", "kv", "do", out_views) for s in ("rb", "rh", "ch")]
    return (Arg("q", "tensor", dt, ("BHSq", "D")), Arg("k", "tensor", dt, ("BHSkv", "D")),
            Arg("v", "tensor", dt, ("BHSkv", "D")), Arg("do", "tensor", dt, ("BHSq", "D")),
            Arg("lse2", rows, "f32", ("BHq", "Sq")), Arg("delta", rows, "f32", ("BHq", "Sq")), *outs,
            Arg("Sq", "scalar", "i32"), Arg("Skv", "scalar", "i32"), Arg("Hq", "scalar", "i32"),
            Arg("Hkv", "scalar", "i32"), Arg("G", "scalar", "i32"), Arg("qk_scale", "scalar", "f32"),
            Arg("scale", "scalar", "f32"), *views, Arg("BH", "scalar", "i32"))


def build(req: AttentionBwdRequest, opts: Options) -> Program:
    BM, BN, D, dt = opts.block_m, opts.block_n, req.d, req.dtype
    T = TileType
    dq_arg = {"atomic": (Arg("dq_acc", "ptr", "f32", ("BHSq", "D"), out=True),),
              "reduce": (Arg("dq_acc", "tensor", "f32", ("BHSqp", "D"), out=True),), "none": ()}[req.dq]
    kv_out = "tensor" if req.kv_tma else "ptr"
    outs = (*dq_arg,
            Arg("dk", kv_out, dt, ("BHSkv", "D"), out=True), Arg("dv", kv_out, dt, ("BHSkv", "D"), out=True))
    args = backward_args(dt, outs, "dk", rows="tensor") + (Arg("NB", "scalar", "i32"),)
    fold = folds_rows(req, opts)
    if fold:
        args += (Arg("qk_fold", "scalar", "f32"), Arg("lse_fold", "scalar", "f32"))
    b, kvh = "(pid_bh//Hkv)", "(pid_bh%Hkv)"
    lo, per_head = q_blocks(BM, BN, req.causal)
    h = "(%s*G+j//%s)" % (kvh, per_head)  # the q-head of step j
    m = "(%s+j%%%s)" % (lo, per_head)  # its Q block
    row = "(%s*Hq+%s)*Sq+%s*%d" % (b, h, m, BM)  # first row of the step in [B*Hq*Sq] (the atomic dq_acc)
    kv_at = ("%s*kv_rb+%s*kv_rh+pid_n*%d" % (b, kvh, BN), "%s*kv_ch" % kvh)
    q_at = ("%s*q_rb+%s*q_rh+%s*%d" % (b, h, m, BM), "%s*q_ch" % h)
    do_at = ("%s*do_rb+%s*do_rh+%s*%d" % (b, h, m, BM), "%s*do_ch" % h)
    vec_at = ("%s*Hq+%s" % (b, h), "%s*%d" % (m, BM))  # the step's lse2/delta columns (TMA: 0 past Sq)
    st_t, kd_t, col_t = T("f32", (BN, BM)), T("f32", (BN, D)), T("f32", (1, BM))
    mask = {"row": "pid_n*%d" % BN, "col": "%s*%d" % (m, BM), "kv_len": "Skv", "q_len": "Sq", "causal": req.causal,
            "keys_on_rows": True}
    dq_ops = (op("smem_store", [Value("dss", T(dt, (BN, BM), "smem"))], ["ds16"]),
              op("trans", [Value("ds", T(dt, (BM, BN), "smem"))], ["dss"]),
              op("mma", [Value("dq", T("f32", (BM, D)))], ["ds", "k"]))
    if req.dq == "reduce":  # the whole tile, into the head's own padded rows: TMA clips nothing, no mask needed
        prow = "(%s*Hq+%s)*(cdiv(Sq,%d)*%d)+%s*%d" % (b, h, BM, BM, m, BM)
        dq_add = (op("tma_reduce_add", [], ["dq"], arg="dq_acc", coords=(prow, "0")),)
    else:
        dq_add = (op("atomic_add_ptr", [], ["dq"], arg="dq_acc", row=row, col=0, ld=D,
                     rows_valid="Sq-%s*%d" % (m, BM)),)
    ka, va = ("kr", "vr") if opts.kv_regs else ("k", "v")  # S^T's and dP^T's A: K and V in SMEM, or in registers
    if fold:  # S^T's and dP^T's accumulators start at -lse2/c and -delta (see folds_rows); dP^T - delta comes out
        rows_in = (
            op("mulc", [Value("lc", col_t)], ["lr"], c="lse_fold"),
            op("zeros", [Value("z", st_t)]),
            op("add", [Value("s0", st_t)], ["z", "lc"]),
            op("trans", [Value("qt", T(dt, (D, BM), "smem"))], ["q"]),
            op("mma", [Value("st", st_t)], [ka, "qt", "s0"]),
            op("sub", [Value("d0", st_t)], ["z", "dr"]),
            op("trans", [Value("dot", T(dt, (D, BM), "smem"))], ["do"]),
            op("mma", [Value("dd", st_t)], [va, "dot", "d0"]),
            op("mulc", [Value("sd", st_t)], ["st"], c="qk_fold"),
            op("mask", [Value("sm", st_t)], ["sd"], **mask),
            op("exp2", [Value("pt", st_t)], ["sm"]),
            op("cast", [Value("p16", T(dt, (BN, BM)))], ["pt"]),
            op("mma", [Value("dv_new", kd_t)], ["p16", "do", "dv"]),
        )
    else:
        rows_in = (
            op("trans", [Value("qt", T(dt, (D, BM), "smem"))], ["q"]),
            op("mma", [Value("st", st_t)], [ka, "qt"]),
            op("trans", [Value("dot", T(dt, (D, BM), "smem"))], ["do"]),
            op("mma", [Value("dpt", st_t)], [va, "dot"]),
            op("mulc", [Value("s2", st_t)], ["st"], c="qk_scale"),
            op("mask", [Value("sm", st_t)], ["s2"], **mask),
            op("sub", [Value("sd", st_t)], ["sm", "lr"]),
            op("exp2", [Value("pt", st_t)], ["sd"]),
            op("cast", [Value("p16", T(dt, (BN, BM)))], ["pt"]),
            op("mma", [Value("dv_new", kd_t)], ["p16", "do", "dv"]),
            op("sub", [Value("dd", st_t)], ["dpt", "dr"]),
        )
    loop_body = (
        op("load", [Value("q", T(dt, (BM, D), "smem"))], arg="q", coords=q_at),
        op("load", [Value("do", T(dt, (BM, D), "smem"))], arg="do", coords=do_at),
        op("load", [Value("lvs", T("f32", (1, BM), "smem"))], arg="lse2", coords=vec_at),
        op("load", [Value("dls", T("f32", (1, BM), "smem"))], arg="delta", coords=vec_at),
        op("smem_read", [Value("lr", col_t)], ["lvs"]),
        op("smem_read", [Value("dr", col_t)], ["dls"]),
        *rows_in,
        op("mul", [Value("dst", st_t)], ["pt", "dd"]),
        op("cast", [Value("ds16", T(dt, (BN, BM)))], ["dst"]),
        *(dq_ops if req.dq != "none" else ()),
        op("mma", [Value("dk_new", kd_t)], ["ds16", "q", "dk"]),  # after dQ: it runs under dQ's adds
        *(dq_add if req.dq != "none" else ()),
        op("yield", [], ["dk_new", "dv_new"]),
    )
    dk_row = "%s*dk_rb+%s*dk_rh+pid_n*%d" % (b, kvh, BN)
    out = {"row": dk_row, "col": "%s*dk_ch" % kvh, "ld": "%d+(Hkv-1)*dk_ch" % D, "rows_valid": "Skv-pid_n*%d" % BN}
    # the split-dQ kernel's registers are full at the dK/dV stores (dV still live): per-row pointers instead of a 64-bit
    # address per element (passes/BACKWARD.md step 8 (b): 96 spill bytes -> 0 at d=128; elsewhere they cost spills)
    store = {"row_ptr": True} if opts.dq_split else {}

    def kv_store(x: str, arg: str) -> tuple[Op, ...]:
        # kv_tma: whole KV tiles (the runtime's rule), so a TMA store of the tile stays in its head's rows; it stages
        # in the chain's K (dK) or V (dV) slot where only its partition reads it (passes/buffers.stage_in_slots)
        if req.kv_tma:
            return (op("store", [], [x], arg=arg, coords=(dk_row, "%s*dk_ch" % kvh)),)
        return (op("store_ptr", [], [x], arg=arg, **out, **store),)
    body = (
        op("load", [Value("k", T(dt, (BN, D), "smem"))], arg="k", coords=kv_at),
        op("load", [Value("v", T(dt, (BN, D), "smem"))], arg="v", coords=kv_at),
        *((op("smem_read", [Value("kr", T(dt, (BN, D)))], ["k"]), op("smem_read", [Value("vr", T(dt, (BN, D)))], ["v"]))
          if opts.kv_regs else ()),
        op("zeros", [Value("dk0", kd_t)]),
        op("zeros", [Value("dv0", kd_t)]),
        op("loop", [Value("dk_f", kd_t), Value("dv_f", kd_t)], ["dk0", "dv0"], loop_body, var="j", lb=0,
           ub="G*%s" % per_head, iter_args=("dk", "dv"), min_trip=1),
        op("mulc", [Value("dks", kd_t)], ["dk_f"], c="scale"),
        op("cast", [Value("dk16", T(dt, (BN, D)))], ["dks"]),
        *kv_store("dk16", "dk"),
        op("cast", [Value("dv16", T(dt, (BN, D)))], ["dv_f"]),
        *kv_store("dv16", "dv"),
    )
    name = (f"attn_bwd_{dt}_d{req.d}_{BM}x{BN}" + ("_causal" if req.causal else "") + ("_p" if opts.persistent else "")
            + ("_kvtma" if req.kv_tma else "")
            + ("_fold" if opts.fold_rows else "") + {"atomic": "", "reduce": "_tmared", "none": "_nodq"}[req.dq])
    # Causal: KV block n sees the Q blocks from the diagonal on (block 0 the longest). ``group_m`` > 1 walks them
    # grouped: ``group_m`` heads' block 0, then their block 1, ... (longest first within the group, and the group's
    # CTAs still share its Q/dO in L2; a walk with the block outermost lost 13-16% at d=64 for want of that sharing,
    # sweeps/2026-12-01-h200-attention-bwd-configs-3.json). 1, every runtime config: head by head.
    group = opts.group_m if req.causal else 1
    grid = Grid((("pid_bh", "BH"), ("pid_n", "NB")), persistent=opts.persistent, group=group)
    return Program(name, args, grid, opts, body, template="attention_bwd")


# ------------------------------------------------------------------------------------------ host side

LOG2E = 1.4426950408889634


def kv_blocks(Sq: int, Skv: int, block_n: int, causal: bool) -> int:
    """KV blocks to launch per (batch, kv-head), the kernel's ``NB`` scalar: causal,
    only those whose first key is below Sq (the others see no query)."""
    return -(-(min(Sq, Skv) if causal else Skv) // block_n)


def padded_rows(Sq: int, block_m: int) -> int:
    """Rows per head of the "reduce" form's dQ workspace: Sq rounded up to the Q block, so that a step's whole [BM, D]
    tile lands in its own head's rows (the query rows past Sq add exact zeros there: P = 0 for them)."""
    return -(-Sq // block_m) * block_m


#: lse2/delta rows start ``row_pitch(Sq)`` f32 apart: a multiple of 4 (16 bytes, a TMA descriptor's row alignment).
ROW_PITCH = 4


def row_pitch(Sq: int) -> int:
    """The row pitch (elements) of the [B*Hq, Sq] lse2/delta views: Sq rounded up to ``ROW_PITCH``."""
    return -(-Sq // ROW_PITCH) * ROW_PITCH


#: ``row_pitch(Sq)`` as a kernel index expression (a kernel reading those views through pointers).
ROW_PITCH_EXPR = "(cdiv(Sq,%d)*%d)" % (ROW_PITCH, ROW_PITCH)


def row_vectors(B: int, Hq: int, Sq: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Two new f32 [B*Hq, Sq] views with rows ``row_pitch(Sq)`` apart (the preprocess writes them; the main kernel
    reads their step columns by TMA, which gives 0 past Sq, the dQ kernel by pointer)."""
    base = torch.empty(2, B * Hq, row_pitch(Sq), dtype=torch.float32, device=device)
    return base[0, :, :Sq], base[1, :, :Sq]


def preprocess(out: torch.Tensor, grad_out: torch.Tensor | None, lse: torch.Tensor,
               grad_lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(delta, lse2), each [B*Hq, Sq] f32 (``row_vectors``): delta = rowsum(fp32(dO) * fp32(O)) - dlse (a gradient
    into lse folds in here: dS = P (dP - delta + dlse)); lse2 = lse * log2 e, 0 where lse is -inf (a row with every
    key masked)."""
    B, Hq, Sq = lse.shape
    delta = torch.zeros(lse.shape, dtype=torch.float32, device=lse.device)
    if grad_out is not None:
        delta = (grad_out.float() * out.float()).sum(-1)
    if grad_lse is not None:
        delta = delta - grad_lse.float()
    lse = lse.float()
    lse2 = torch.where(lse == float("-inf"), torch.zeros_like(lse), lse * LOG2E)
    d, l2 = row_vectors(B, Hq, Sq, lse.device)
    d.copy_(delta.reshape(B * Hq, Sq))
    l2.copy_(lse2.reshape(B * Hq, Sq))
    return d, l2


def _rows(t: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """``t`` [B, H, S, D] as the 2-D row view the kernel reads (element (b, h, s, d) at row b*rb + h*rh + s,
    column h*ch + d) and (rb, rh, ch); a layout that is neither [B, H, S, D] nor [B, S, H, D] is copied."""
    B, H, S, D = t.shape
    if t.transpose(1, 2).is_contiguous() and not t.is_contiguous():
        return t.transpose(1, 2).reshape(B * S, H * D), (S, 0, D)
    t = t.contiguous()
    return t.reshape(B * H * S, D), (H * S, S, 0)


def fold_scale(scale: float) -> float:
    """``qk_fold``, the folded form's c (``folds_rows``): scale * log2 e, its magnitude at least ``FOLD_MIN``
    (``lse_fold`` is -1/c)."""
    c = scale * LOG2E
    return c if abs(c) >= FOLD_MIN else math.copysign(FOLD_MIN, c)


def kv_buffers(k: torch.Tensor, launched: int, fill: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """New dK, dV of ``k``'s shape and dtype, left uninitialised (``fill``: filled, as the interpreter's poison) for
    the first ``launched`` keys of each head (the KV blocks the kernel runs) and zero past them (causal, keys at or
    past Sq: no CTA writes them)."""
    make = torch.empty if fill is None else (lambda *s, **kw: torch.full(s, fill, **kw))
    dk, dv = (make(*k.shape, dtype=k.dtype, device=k.device) for _ in range(2))
    if launched < k.shape[2]:
        dk[:, :, launched:] = 0
        dv[:, :, launched:] = 0
    return dk, dv


def workspace_rows(dq: str, Sq: int, block_m: int | None = None) -> int:
    """Rows per head of the dQ workspace of form ``dq`` (``DQ_FORMS``): Sq ("atomic"), ``padded_rows(Sq, block_m)``
    ("reduce", which needs ``block_m``), 0 ("none": no workspace)."""
    if dq not in DQ_FORMS:
        raise ValueError(f"workspace_rows: dq={dq!r}; use one of {DQ_FORMS}")
    if dq == "reduce" and block_m is None:
        raise ValueError("workspace_rows: the reduce form's workspace is padded to the Q block; pass block_m")
    return {"atomic": Sq, "reduce": padded_rows(Sq, block_m or 1), "none": 0}[dq]


def kernel_values(q, k, v, grad_out, delta, lse2, causal: bool, scale: float, block_n: int,
                  fill: float | None = None, dq: str = "atomic", block_m: int | None = None,
                  fold: bool = False, dq_acc: torch.Tensor | None = None) -> dict:
    """A value per argument name of the attention_bwd template. dK/dV are new [B, Hkv, Skv, D] tensors (their
    2-D views under "dk"/"dv"), left uninitialised (``fill``: filled, as the interpreter's poison) except the rows
    of the KV blocks the kernel is not launched for (causal, keys at or past Sq), which are zero; the dQ
    workspace is zero: [B*Hq*Sq, D] (``dq="atomic"``) or [B*Hq*padded_rows(Sq, block_m), D] (``dq="reduce"``, which
    needs ``block_m``); ``dq="none"``: the kernel without dQ, no workspace. ``grad_out`` None: zeros (only a
    gradient into lse flows). ``fold``: the folded step's scalars too (``qk_fold``, ``lse_fold``;
    ``Options.fold_rows``). ``dq_acc``: the workspace to use, already zero ([B*Hq*workspace_rows, D] f32: the
    runtime's row kernel zeroes it beside delta, ``runtime.attention_bwd_rows.preprocess``); None: a new zeroed one."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    NB = kv_blocks(Sq, Skv, block_n, causal)
    dk, dv = kv_buffers(k, NB * block_n, fill)
    ws_rows = workspace_rows(dq, Sq, block_m)
    if ws_rows and dq_acc is None:
        dq_acc = torch.zeros(B * Hq * ws_rows, D, dtype=torch.float32, device=q.device)
    elif ws_rows and (tuple(dq_acc.shape) != (B * Hq * ws_rows, D) or dq_acc.dtype != torch.float32):
        raise ValueError(f"kernel_values: dq_acc is {tuple(dq_acc.shape)} {dq_acc.dtype}; the {dq} form needs "
                         f"({B * Hq * ws_rows}, {D}) float32")
    vals = {**row_views(q, k, v, grad_out), "lse2": lse2, "delta": delta,
            **({"dq_acc": dq_acc} if ws_rows else {}),
            "dk": dk.view(B * Hkv * Skv, D), "dv": dv.view(B * Hkv * Skv, D),
            "Sq": Sq, "Skv": Skv, "Hq": Hq, "Hkv": Hkv, "G": Hq // Hkv, "qk_scale": scale * LOG2E, "scale": scale,
            "BH": B * Hkv, "NB": NB}
    if fold:
        c = fold_scale(scale)
        vals.update(qk_fold=c, lse_fold=-1.0 / c)
    vals.update(dk_rb=Hkv * Skv, dk_rh=Skv, dk_ch=0)
    return vals


def row_views(q, k, v, grad_out) -> dict:
    """The 2-D row views of q, k, v and dO under their argument names and their (rb, rh, ch) scalars (k and v share
    one triple: v or both are copied where their layouts differ). ``grad_out`` None: zeros."""
    if grad_out is None:
        grad_out = torch.zeros_like(q)
    (q2, qs), (k2, ks), (v2, vs), (do2, ds) = (_rows(t) for t in (q, k, v, grad_out))
    if vs != ks:
        k2, ks = _rows(k.contiguous())
        v2, vs = _rows(v.contiguous())
    vals = {"q": q2, "k": k2, "v": v2, "do": do2}
    for pre, s in (("q", qs), ("kv", ks), ("do", ds)):
        vals.update(zip((f"{pre}_rb", f"{pre}_rh", f"{pre}_ch"), s))
    return vals


def postprocess(dq_acc: torch.Tensor, scale: float, q: torch.Tensor) -> torch.Tensor:
    """dQ [B, Hq, Sq, D] in q's dtype, contiguous: scale * the fp32 workspace, [B*Hq*Sq, D] or (the reduce form)
    [B*Hq*Sqp, D] with Sqp >= Sq rows per head, of which the first Sq are dQ's."""
    B, Hq, Sq, D = q.shape
    return (dq_acc.view(B, Hq, -1, D)[:, :, :Sq] * scale).to(q.dtype).contiguous()


def kv_gradients(values: dict, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dk, dv) [B, Hkv, Skv, D] from the values after the kernel ran."""
    return values["dk"].view(k.shape), values["dv"].view(k.shape)


def gradients(values: dict, scale: float, q: torch.Tensor, k: torch.Tensor, post=postprocess):
    """(dq, dk, dv) [B, H, S, D] from the values after the kernel ran; ``post`` turns the dQ workspace into dQ
    (``postprocess``'s signature; the runtime passes its Triton kernel)."""
    return (post(values["dq_acc"], scale, q), *kv_gradients(values, k))
