"""Attention backward template, the separate dQ kernel (passes/BACKWARD.md step 8; Triton's tutorial
``06-fused-attention.py`` ``_attn_bwd_dq``): dQ of ``(out, lse) = attention(q, k, v)`` from dO, with no atomics.

Structured as the forward (templates/attention.py), in the normal frame (queries on rows): one tile is BM query rows
(block ``pid_m``) of one (batch, q-head) ``pid_bh`` of B*Hq. Q_m, dO_m, lse2_m and delta_m are loaded once; the loop
walks the KV blocks n of the head's kv-head (causal, top-left: up to the diagonal block) and recomputes the scores:

    S = Q K_n^T   dP = dO V_n^T   P = exp2(mask(S * c) - lse2)   dS = P (dP - delta)   dQ += bf16(dS) K_n

(c = scale * log2 e; lse2 and delta from the preprocess, ``templates.attention_bwd.preprocess``; dS stays in
registers as the A operand, as the forward's P V). At the end dQ *= scale, stored in q's dtype through a pointer
with (dq_rb, dq_rh, dq_ch) and rows of D + (Hq-1)*dq_ch elements, up to Sq rows. Every dQ element is written once,
by one CTA: with the main kernel built with ``dq="none"`` (templates/attention_bwd.py) the backward is deterministic.
Rows past Sq are other heads' rows: the mask also keeps query < Sq (P = 0 there, no inf), and lse2/delta (rows
``row_pitch(Sq)`` apart) are read once a tile through pointers with a bound. (Row i of dS only feeds row i of dQ and
rows past Sq are not stored, so the forward's mask without the query bound would give the same dQ; but at d=128 ptxas
then spills 204 bytes, with it none.)

Host side: ``kernel_values(q, k, v, grad_out, delta, lse2, causal, scale, fill=None, views=None)`` gives a value per
argument name (the 2-D row views of ``templates.attention_bwd.row_views``, or those of the main kernel's values, a new
contiguous [B, Hq, Sq, D] dQ under "dq"), ``q_tiles`` the grid's Q blocks per (batch, q-head), ``gradient`` dQ.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ir import Arg, Grid, Options, Program, TileType, Value, op
from .attention_bwd import DTYPES, HEAD_DIMS, LOG2E, ROW_PITCH_EXPR, backward_args, row_views


@dataclass(frozen=True)
class AttentionBwdDqRequest:
    d: int
    dtype: str = "bf16"
    causal: bool = False
    dq_tma: bool = False  # dQ stored by TMA (Sq % block_m == 0: no tile row in another head; see build)

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"attention_bwd_dq template: dtype {self.dtype!r} not served; use one of {DTYPES}")
        if self.d not in HEAD_DIMS:
            raise ValueError(f"attention_bwd_dq template: head dim {self.d} not served; use one of {HEAD_DIMS}")


def build(req: AttentionBwdDqRequest, opts: Options) -> Program:
    BM, BN, D, dt = opts.block_m, opts.block_n, req.d, req.dtype
    T = TileType
    args = backward_args(dt, (Arg("dq", "tensor" if req.dq_tma else "ptr", dt, ("BHSq", "D"), out=True),), "dq")
    # causal tiles differ in length: the longest (last Q blocks) first, as the forward
    mi = "(cdiv(Sq,%d)-1-pid_m)" % BM if req.causal else "pid_m"
    b, h = "(pid_bh//Hq)", "(pid_bh%Hq)"
    row0 = "%s*%d" % (mi, BM)
    q_at = ("%s*q_rb+%s*q_rh+%s*%d" % (b, h, mi, BM), "%s*q_ch" % h)
    do_at = ("%s*do_rb+%s*do_rh+%s*%d" % (b, h, mi, BM), "%s*do_ch" % h)
    kv_at = ("%s*kv_rb+(%s//G)*kv_rh+j*%d" % (b, h, BN), "(%s//G)*kv_ch" % h)
    vec = {"offset": "pid_bh*%s+%s*%d" % (ROW_PITCH_EXPR, mi, BM), "size": "pid_bh*%s+Sq" % ROW_PITCH_EXPR}
    ub = "cdiv(Skv,%d)" % BN
    if req.causal:  # blocks strictly right of the diagonal are fully masked: skip them
        ub = "min(cdiv(Skv,%d),cdiv(%s*%d+%d,%d))" % (BN, mi, BM, BM, BN)
    s_t, acc_t, col_t = T("f32", (BM, BN)), T("f32", (BM, D)), T("f32", (BM, 1))
    loop_body = (
        op("load", [Value("k", T(dt, (BN, D), "smem"))], arg="k", coords=kv_at),
        op("load", [Value("v", T(dt, (BN, D), "smem"))], arg="v", coords=kv_at),
        op("trans", [Value("kt", T(dt, (D, BN), "smem"))], ["k"]),
        op("mma", [Value("s", s_t)], ["q", "kt"]),
        op("trans", [Value("vt", T(dt, (D, BN), "smem"))], ["v"]),
        op("mma", [Value("dp", s_t)], ["do", "vt"]),
        op("mulc", [Value("s2", s_t)], ["s"], c="qk_scale"),
        op("mask", [Value("sm", s_t)], ["s2"], row=row0, col="j*%d" % BN, kv_len="Skv", q_len="Sq",
           causal=req.causal),
        op("sub", [Value("sd", s_t)], ["sm", "lr"]),
        op("exp2", [Value("p", s_t)], ["sd"]),
        op("sub", [Value("dd", s_t)], ["dp", "dr"]),
        op("mul", [Value("ds", s_t)], ["p", "dd"]),
        op("cast", [Value("ds16", T(dt, (BM, BN)))], ["ds"]),
        op("mma", [Value("dq_new", acc_t)], ["ds16", "k", "dq"]),
        op("yield", [], ["dq_new"]),
    )
    body = (
        op("load", [Value("q", T(dt, (BM, D), "smem"))], arg="q", coords=q_at),
        op("load", [Value("do", T(dt, (BM, D), "smem"))], arg="do", coords=do_at),
        op("load_vec", [Value("lv", T("f32", (BM,)))], arg="lse2", **vec),
        op("load_vec", [Value("dl", T("f32", (BM,)))], arg="delta", **vec),
        op("expand", [Value("lr", col_t)], ["lv"], axis=1),
        op("expand", [Value("dr", col_t)], ["dl"], axis=1),
        op("zeros", [Value("dq0", acc_t)]),
        op("loop", [Value("dq_f", acc_t)], ["dq0"], loop_body, var="j", lb=0, ub=ub, iter_args=("dq",), min_trip=1),
        op("mulc", [Value("dqs", acc_t)], ["dq_f"], c="scale"),
        op("cast", [Value("dq16", T(dt, (BM, D)))], ["dqs"]),
        # dq_tma: whole Q tiles (the runtime's rule), so a TMA store of the tile stays in its head's rows; it stages in
        # the chain's Q slot (passes/buffers.stage_in_slots), as the forward's O
        op("store", [], ["dq16"], arg="dq", coords=("%s*dq_rb+%s*dq_rh+%s*%d" % (b, h, mi, BM), "%s*dq_ch" % h))
        if req.dq_tma else
        op("store_ptr", [], ["dq16"], arg="dq", row="%s*dq_rb+%s*dq_rh+%s*%d" % (b, h, mi, BM), col="%s*dq_ch" % h,
           ld="%d+(Hq-1)*dq_ch" % D, rows_valid="Sq-%s*%d" % (mi, BM)),
    )
    name = f"attn_bwd_dq_{dt}_d{req.d}_{BM}x{BN}" + ("_causal" if req.causal else "") + \
        ("_p" if opts.persistent else "") + ("_tma" if req.dq_tma else "")
    tiles = (("pid_bh", "BH"), ("pid_m", "cdiv(Sq,%d)" % BM))
    grid = Grid(tiles[::-1] if req.causal else tiles, persistent=opts.persistent, group=1)
    return Program(name, args, grid, opts, body, template="attention_bwd_dq")


# ------------------------------------------------------------------------------------------ host side


def q_tiles(Sq: int, block_m: int) -> int:
    """Q blocks per (batch, q-head): the grid is B*Hq times this."""
    return -(-Sq // block_m)


def kernel_values(q, k, v, grad_out, delta, lse2, causal: bool, scale: float, fill: float | None = None,
                  views: dict | None = None) -> dict:
    """A value per argument name of the attention_bwd_dq template: the 2-D row views of q, k, v and dO
    (``templates.attention_bwd.row_views``; ``views``: taken from that dict, e.g. the main kernel's values, so no
    layout is copied twice), lse2 and delta from the preprocess, and a new [B, Hq, Sq, D] dQ in q's dtype under
    "dq" (its 2-D view; left uninitialised, ``fill``: filled, as the interpreter's poison). ``grad_out`` None: zeros."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    names = [f"{p}_{x}" for p in ("q", "kv", "do") for x in ("rb", "rh", "ch")] + ["q", "k", "v", "do"]
    rows = {n: views[n] for n in names} if views is not None else row_views(q, k, v, grad_out)
    dq = (torch.empty if fill is None else (lambda *s, **kw: torch.full(s, fill, **kw)))(
        B, Hq, Sq, D, dtype=q.dtype, device=q.device)
    return {**rows, "lse2": lse2, "delta": delta, "dq": dq.view(B * Hq * Sq, D),
            "Sq": Sq, "Skv": Skv, "Hq": Hq, "Hkv": Hkv, "G": Hq // Hkv, "qk_scale": scale * LOG2E, "scale": scale,
            "BH": B * Hq, "dq_rb": Hq * Sq, "dq_rh": Sq, "dq_ch": 0}


def gradient(values: dict, q: torch.Tensor) -> torch.Tensor:
    """dQ [B, Hq, Sq, D] from the values after the kernel ran."""
    return values["dq"].view(q.shape)
