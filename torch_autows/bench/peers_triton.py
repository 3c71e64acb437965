"""Triton 3.6 auto-warp-specialized peers: a TMA GEMM and a flash-attention forward loop.

Both use ``tl.range(..., warp_specialize=True)`` with ``num_warps=4`` and in-kernel descriptors
(``tl.make_tensor_descriptor``, so the kernels take plain pointers and need ``triton.set_allocator``) —
the only form Triton 3.6's Hopper WS pass accepts (shared/research/triton36.md). The pass drops WS
silently in many cases, so ``ws_note`` reads the compiled kernel's ttgir and says when it is missing.

``compile_offline_*`` build the same kernels for sm_90 without a GPU (tests).
"""
from __future__ import annotations

import triton
import triton.language as tl

GEMM_BM, GEMM_BN, GEMM_BK, GEMM_STAGES, GEMM_GROUP_M = 128, 256, 64, 3, 8
ATTN_BM, ATTN_BN = 128, 128
NUM_WARPS = 4
SMEM_LIMIT = 232448  # 227 KB per CTA on sm_90; not checked by triton.compile


@triton.jit
def ws_matmul_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K,
                     HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     GROUP_M: tl.constexpr, NUM_STAGES: tl.constexpr):
    # C[M, N] = A[M, K] @ B[K, N] (+ bias[N]); row-major; program_id(1) is the batch (bmm).
    pid = tl.program_id(0)
    batch = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    group = GROUP_M * num_pid_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_pid_m - first_m, GROUP_M)
    off_m = (first_m + (pid % group) % size_m) * BM
    off_n = ((pid % group) // size_m) * BN
    a_base = a_ptr + batch.to(tl.int64) * M * K
    b_base = b_ptr + batch.to(tl.int64) * K * N
    c_base = c_ptr + batch.to(tl.int64) * M * N
    a_desc = tl.make_tensor_descriptor(a_base, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_base, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    c_desc = tl.make_tensor_descriptor(c_base, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BK), num_stages=NUM_STAGES, warp_specialize=True):
        a = a_desc.load([off_m, k * BK])
        b = b_desc.load([k * BK, off_n])
        acc = tl.dot(a, b, acc)
    if HAS_BIAS:
        bias_desc = tl.make_tensor_descriptor(bias_ptr, shape=[1, N], strides=[N, 1], block_shape=[1, BN])
        acc = acc + bias_desc.load([0, off_n]).to(tl.float32)
    c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


@triton.jit
def ws_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, sm_scale, Hq, Hkv, S,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        CAUSAL: tl.constexpr, NUM_STAGES: tl.constexpr):
    # q/o [B, Hq, S, D], k/v [B, Hkv, S, D], contiguous, viewed as 2-D [rows, D]; S % BLOCK_M == 0.
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // Hq
    off_h = off_bh % Hq
    off_kvh = off_h // (Hq // Hkv)
    q_rows = off_bh * S + start_m * BLOCK_M
    kv_rows = (off_b * Hkv + off_kvh) * S
    total_q = tl.num_programs(1) * S
    total_kv = (tl.num_programs(1) // Hq) * Hkv * S
    q_desc = tl.make_tensor_descriptor(q_ptr, shape=[total_q, HEAD_DIM], strides=[HEAD_DIM, 1], block_shape=[BLOCK_M, HEAD_DIM])
    k_desc = tl.make_tensor_descriptor(k_ptr, shape=[total_kv, HEAD_DIM], strides=[HEAD_DIM, 1], block_shape=[BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(v_ptr, shape=[total_kv, HEAD_DIM], strides=[HEAD_DIM, 1], block_shape=[BLOCK_N, HEAD_DIM])
    o_desc = tl.make_tensor_descriptor(o_ptr, shape=[total_q, HEAD_DIM], strides=[HEAD_DIM, 1], block_shape=[BLOCK_M, HEAD_DIM])
    qk_scale = sm_scale * 1.44269504  # log2(e): exp2 below
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    q = q_desc.load([q_rows, 0])
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if CAUSAL:
        hi = (start_m + 1) * BLOCK_M  # one loop, mask applied by select on every block (no scf.if)
    else:
        hi = S
    for start_n in tl.range(0, hi, BLOCK_N, num_stages=NUM_STAGES, warp_specialize=True):
        k = k_desc.load([kv_rows + start_n, 0])
        qk = tl.dot(q, k.T)
        if CAUSAL:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            qk = tl.where(offs_m[:, None] >= offs_n[None, :], qk * qk_scale, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_ij = tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = v_desc.load([kv_rows + start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        l_i = l_i * alpha + l_ij
        m_i = m_ij
    acc = acc / l_i[:, None]
    o_desc.store([q_rows, 0], acc.to(o_desc.dtype))


def attention_stages(head_dim: int) -> int:
    # num_stages is the WS pass's SMEM buffer count; 3 K/V stages at D=128 exceed 227 KB.
    return 3 if head_dim <= 64 else 2


def _set_allocator() -> None:
    import torch

    def alloc(size: int, alignment: int, stream):
        return torch.empty(size, device="cuda", dtype=torch.int8)

    triton.set_allocator(alloc)


def matmul(a, b, bias=None, out=None):
    """a [M, K] @ b [K, N] (+ bias [N]) or batched a [B, M, K] @ b [B, K, N]; returns (out, compiled kernel)."""
    import torch

    _set_allocator()
    batched = a.dim() == 3
    nb = a.shape[0] if batched else 1
    M, K = a.shape[-2:]
    N = b.shape[-1]
    if K % 8 or N % 8:
        raise ValueError(f"TMA needs 16-byte aligned rows: K={K}, N={N}")
    a, b = a.contiguous(), b.contiguous()
    c = out if out is not None else torch.empty((*a.shape[:-1], N), device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(M, GEMM_BM) * triton.cdiv(N, GEMM_BN), nb)
    kern = ws_matmul_kernel[grid](a, b, c, bias if bias is not None else c, M, N, K, bias is not None,
                                  GEMM_BM, GEMM_BN, GEMM_BK, GEMM_GROUP_M, GEMM_STAGES, num_warps=NUM_WARPS)
    return c, kern


def attention(q, k, v, is_causal: bool, scale: float | None = None, out=None):
    """SDPA forward (out only) for q [B, Hq, S, D], k/v [B, Hkv, S, D]; returns (out, compiled kernel)."""
    import torch

    _set_allocator()
    B, Hq, S, D = q.shape
    Hkv = k.shape[1]
    if S % ATTN_BM or k.shape[2] != S:
        raise ValueError(f"needs Sq == Skv and S % {ATTN_BM} == 0, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o = out if out is not None else torch.empty_like(q)
    scale = scale if scale is not None else D ** -0.5
    grid = (S // ATTN_BM, B * Hq)
    kern = ws_attention_kernel[grid](q, k, v, o, scale, Hq, Hkv, S, D, ATTN_BM, ATTN_BN, is_causal,
                                     attention_stages(D), num_warps=NUM_WARPS)
    return o, kern


def ws_note(kern) -> str | None:
    """A note when the compiled kernel lacks warp specialization or exceeds SMEM; None when it is fine."""
    if kern is None:
        return "no compiled kernel handle to inspect"
    notes = []
    if "ttg.warp_specialize" not in kern.asm.get("ttgir", ""):
        notes.append("ttg.warp_specialize absent from ttgir: Triton dropped WS")
    shared = getattr(kern.metadata, "shared", 0)
    if shared > SMEM_LIMIT:
        notes.append(f"SMEM {shared} B > {SMEM_LIMIT} B")
    return "; ".join(notes) or None


# ---- offline compilation for sm_90 (no GPU needed) -------------------------------------------------
# ``divisible`` names the arguments the launcher would specialize as multiples of 16 (pointers, and ints
# such as M/N/K of the benchmark shapes), so the offline kernel matches the one compiled on the GPU.

def _compile(fn, sig: dict, consts: dict, divisible: tuple[str, ...], num_warps: int):
    from triton.backends.compiler import GPUTarget

    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    src = triton.compiler.ASTSource(fn, sig, consts, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def compile_offline_matmul(dtype: str = "bf16", has_bias: bool = False, num_warps: int = NUM_WARPS):
    sig = {"a_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "c_ptr": f"*{dtype}", "bias_ptr": f"*{dtype}",
           "M": "i32", "N": "i32", "K": "i32", "HAS_BIAS": "constexpr", "BM": "constexpr", "BN": "constexpr",
           "BK": "constexpr", "GROUP_M": "constexpr", "NUM_STAGES": "constexpr"}
    consts = {"HAS_BIAS": has_bias, "BM": GEMM_BM, "BN": GEMM_BN, "BK": GEMM_BK, "GROUP_M": GEMM_GROUP_M,
              "NUM_STAGES": GEMM_STAGES}
    divisible = ("a_ptr", "b_ptr", "c_ptr", "bias_ptr", "M", "N", "K")
    return _compile(ws_matmul_kernel, sig, consts, divisible, num_warps)


def compile_offline_attention(head_dim: int = 128, causal: bool = False, dtype: str = "bf16",
                              num_warps: int = NUM_WARPS):
    sig = {"q_ptr": f"*{dtype}", "k_ptr": f"*{dtype}", "v_ptr": f"*{dtype}", "o_ptr": f"*{dtype}", "sm_scale": "fp32",
           "Hq": "i32", "Hkv": "i32", "S": "i32", "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr",
           "BLOCK_N": "constexpr", "CAUSAL": "constexpr", "NUM_STAGES": "constexpr"}
    consts = {"HEAD_DIM": head_dim, "BLOCK_M": ATTN_BM, "BLOCK_N": ATTN_BN, "CAUSAL": causal,
              "NUM_STAGES": attention_stages(head_dim)}
    divisible = ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "Hq", "S")
    return _compile(ws_attention_kernel, sig, consts, divisible, num_warps)
