"""The attention backward's row-wise work around the generated kernels, one fused Triton kernel each on CUDA
(FlashAttention-3's preprocess and dQ-convert kernels):

* ``preprocess(out, grad_out, lse, grad_lse, workspace=None) -> (delta, lse2)``: delta = rowsum(fp32(dO) * fp32(O))
  - dlse and lse2 = lse * log2 e (0 where lse is -inf), one read of O and dO; with ``workspace`` (the atomic and
  reduce forms' fp32 dQ workspace, uninitialised) the same kernel zeroes it, as cuDNN's and FlashAttention-3's
  preprocess do: one launch where ``torch.zeros`` took a fill kernel of its own. Written in torch
  (``templates.attention_bwd.preprocess``) it is four kernels with fp32 copies of both tensors: on the H200 at 16k
  tokens x 2048 wide, about 0.2 ms, a tenth of a whole s1024 backward.
* ``postprocess(dq_acc, scale, q) -> dq``: the atomic and reduce forms' dQ, scale * the fp32 workspace (its
  [B*H*Sqp, D] rows, Sqp >= Sq per head) in q's dtype, one read and one write (torch: two kernels and an fp32 copy).

Same numbers as the torch versions up to the order of the fp32 row sum. Where a kernel does not apply (tensors not
on CUDA, a head dim's stride not 1, no dO), the torch version runs; CPU tests run these kernels in Triton's
interpreter and compile them offline for sm_90a.
"""
from __future__ import annotations

import functools

import torch
import triton

from ..templates import attention_bwd as tmpl
from . import device as dev
from .launch import JitLaunches

#: Rows per program: a [ROWS, D] tile of O and of dO (32 KB in bf16 at D=128).
ROWS = {64: 128, 128: 64}


#: The row kernels' bound launches (launch.JitLaunches): a repeated call skips Triton's per-call argument binding.
_LAUNCHES = JitLaunches()


def _rows(d: int) -> int:
    return ROWS.get(d, 64)


def preprocess(out: torch.Tensor, grad_out: torch.Tensor | None, lse: torch.Tensor,
               grad_lse: torch.Tensor | None = None, kernel=None,
               workspace: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(delta, lse2), each [B*H, S] f32 with rows ``row_pitch(S)`` apart (``templates.attention_bwd.row_vectors``), as
    ``templates.attention_bwd.preprocess``; one Triton kernel on CUDA. ``workspace``: a contiguous f32 [B*H*SP, D]
    tensor (SP >= S rows per head: the dQ workspace, ``templates.attention_bwd.workspace_rows``) zeroed as well, every
    row (the same kernel on CUDA). ``kernel``: the kernel to launch (tests pass the interpreted one)."""
    B, H, S, D = out.shape
    if workspace is not None and (workspace.dtype != torch.float32 or not workspace.is_contiguous()
                                  or workspace.dim() != 2 or workspace.shape[1] != D
                                  or workspace.shape[0] % (B * H) or workspace.shape[0] < B * H * S):
        raise ValueError(f"preprocess: workspace {tuple(workspace.shape)} {workspace.dtype}; pass a contiguous "
                         f"float32 [B*H*SP, {D}] tensor with SP >= {S} rows per head")
    if (grad_out is None or out.stride(-1) != 1 or grad_out.stride(-1) != 1
            or (kernel is None and out.device.type != "cuda")):
        if workspace is not None:
            workspace.zero_()
        return tmpl.preprocess(out, grad_out, lse, grad_lse)
    n = B * H * S
    sp = S if workspace is None else workspace.shape[0] // (B * H)
    lse = lse.float().reshape(n).contiguous()
    dlse = None if grad_lse is None else grad_lse.float().reshape(n).contiguous()
    delta, lse2 = tmpl.row_vectors(B, H, S, out.device)
    block = _rows(D)
    scalars = (B * H * sp, H, S, sp, delta.stride(0), *out.stride()[:3], *grad_out.stride()[:3], D,
               triton.next_power_of_2(D), block, dlse is not None, workspace is not None, tmpl.LOG2E)
    tensors = (out, grad_out, lse, lse if dlse is None else dlse, delta, lse2,
               delta if workspace is None else workspace)
    grid = triton.cdiv(B * H * sp, block)
    if kernel is not None:  # tests: the interpreted kernel, as Triton's JIT launches it
        kernel[(grid,)](*tensors, *scalars)
    else:
        _LAUNCHES.launch(_delta_kernel(), grid, (*tensors, *scalars), ("delta", out.dtype, scalars),
                         dev.index(out.device))
    return delta, lse2


def postprocess(dq_acc: torch.Tensor, scale: float, q: torch.Tensor, kernel=None) -> torch.Tensor:
    """dQ [B, H, Sq, D] in q's dtype, contiguous, as ``templates.attention_bwd.postprocess``; one Triton kernel on
    CUDA. ``kernel``: the kernel to launch (tests pass the interpreted one)."""
    if kernel is None and dq_acc.device.type != "cuda":
        return tmpl.postprocess(dq_acc, scale, q)
    B, H, Sq, D = q.shape
    n = B * H * Sq
    sqp = dq_acc.shape[0] // (B * H)
    dq = torch.empty(B, H, Sq, D, dtype=q.dtype, device=q.device)
    block = _rows(D)
    args = (dq_acc, dq, float(scale), n, Sq, sqp, D, triton.next_power_of_2(D), block)
    if kernel is not None:
        kernel[(triton.cdiv(n, block),)](*args)
    else:
        _LAUNCHES.launch(_dq_kernel(), triton.cdiv(n, block), args, ("dq", q.dtype, args[2:]), dev.index(q.device))
    return dq


@functools.cache
def _delta_kernel():
    """delta[r] = sum_d fp32(O[r, d]) * fp32(dO[r, d]) (- dlse[r]); lse2[r] = lse[r] * log2 e, or 0 where lse[r] is
    -inf; row r = (b * H + h) * S + s of O and dO ([B, H, S, D], any strides but a unit one on D), stored at
    (b * H + h) * SP + s (rows of the [B*H, S] outputs SP apart). The programs walk the n = B*H*SQP rows w of the dQ
    workspace [B*H*SQP, D] (SQP >= S rows per head; without one, ZERO False, SQP = S): row w is head w // SQP's
    row s = w % SQP, live for delta and lse2 where s < S, and (ZERO) set to zero in the workspace."""
    import triton.language as tl

    @triton.jit
    def attention_bwd_delta(o_ptr, do_ptr, lse_ptr, dlse_ptr, delta_ptr, lse2_ptr, ws_ptr, n, H, S, SQP, SP,
                            o_sb, o_sh, o_ss, do_sb, do_sh, do_ss, D: tl.constexpr, DP: tl.constexpr,
                            BLOCK: tl.constexpr, HAS_DLSE: tl.constexpr, ZERO: tl.constexpr, LOG2E: tl.constexpr):
        w = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        bh = w // SQP
        s = w % SQP
        live = (w < n) & (s < S)
        b = bh // H
        h = bh % H
        d = tl.arange(0, DP)
        mask = live[:, None] & (d < D)[None, :]
        o = tl.load(o_ptr + (b * o_sb + h * o_sh + s * o_ss)[:, None] + d[None, :], mask=mask, other=0.0)
        g = tl.load(do_ptr + (b * do_sb + h * do_sh + s * do_ss)[:, None] + d[None, :], mask=mask, other=0.0)
        delta = tl.sum(o.to(tl.float32) * g.to(tl.float32), 1)
        r = bh * S + s
        if HAS_DLSE:
            delta -= tl.load(dlse_ptr + r, mask=live, other=0.0)
        lse = tl.load(lse_ptr + r, mask=live, other=0.0)
        at = bh * SP + s
        tl.store(delta_ptr + at, delta, mask=live)
        tl.store(lse2_ptr + at, tl.where(lse == float("-inf"), 0.0, lse * LOG2E), mask=live)
        if ZERO:
            tl.store(ws_ptr + w[:, None] * D + d[None, :], tl.zeros([BLOCK, DP], tl.float32),
                     mask=(w < n)[:, None] & (d < D)[None, :])

    return attention_bwd_delta


@functools.cache
def _dq_kernel():
    """dq[r, d] = scale * acc[(r // Sq) * Sqp + r % Sq, d] in dq's dtype; row r = (b * H + h) * Sq + s."""
    import triton.language as tl

    @triton.jit
    def attention_bwd_dq_convert(acc_ptr, dq_ptr, scale, n, Sq, Sqp, D: tl.constexpr, DP: tl.constexpr,
                                 BLOCK: tl.constexpr):
        r = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        src = r // Sq * Sqp + r % Sq
        d = tl.arange(0, DP)
        mask = (r < n)[:, None] & (d < D)[None, :]
        x = tl.load(acc_ptr + src[:, None] * D + d[None, :], mask=mask, other=0.0)
        tl.store(dq_ptr + r[:, None] * D + d[None, :], (x * scale).to(dq_ptr.dtype.element_ty), mask=mask)

    return attention_bwd_dq_convert


def compile_offline(which: str, dtype: str = "bf16", d: int = 128, zero: bool = True):
    """``which`` ("delta" or "dq") compiled for sm_90a without a GPU (tests); ``zero``: the delta kernel zeroing a
    workspace too."""
    from triton.backends.compiler import GPUTarget

    if which == "delta":
        fn = _delta_kernel()
        sig = {"o_ptr": f"*{dtype}", "do_ptr": f"*{dtype}", **dict.fromkeys(("lse_ptr", "dlse_ptr", "delta_ptr",
                                                                             "lse2_ptr", "ws_ptr"), "*fp32"),
               **dict.fromkeys(("n", "H", "S", "SQP", "SP", "o_sb", "o_sh", "o_ss", "do_sb", "do_sh", "do_ss"),
                               "i32")}
        consts = {"D": d, "DP": triton.next_power_of_2(d), "BLOCK": _rows(d), "HAS_DLSE": True, "ZERO": zero,
                  "LOG2E": tmpl.LOG2E}
    else:
        fn = _dq_kernel()
        sig = {"acc_ptr": "*fp32", "dq_ptr": f"*{dtype}", "scale": "fp32", "n": "i32", "Sq": "i32", "Sqp": "i32"}
        consts = {"D": d, "DP": triton.next_power_of_2(d), "BLOCK": _rows(d)}
    sig.update(dict.fromkeys(consts, "constexpr"))
    src = triton.compiler.ASTSource(fn, sig, consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
