"""Attention-forward peers: cuDNN and FA2 through SDPA, compiled flex_attention, Triton 3.6 auto-WS, autows."""
from __future__ import annotations

from .results import error_text
from .runner import Bound, Peer, Ref, Skip, Suite

REF_CHUNK_BYTES = 1 << 30  # fp32 score block per step of the reference
DEVICE = "cuda"  # tests run the CPU-capable peers with "cpu"


def _dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


def make_inputs(case) -> dict:
    import torch

    dt = _dtype(case.dtype)
    B, S, D = case.batch, case.seqlen, case.head_dim
    q = torch.randn(B, case.heads, S, D, device=DEVICE, dtype=dt)
    k = torch.randn(B, case.kv_heads, S, D, device=DEVICE, dtype=dt)
    v = torch.randn(B, case.kv_heads, S, case.dv, device=DEVICE, dtype=dt)
    return {"q": q, "k": k, "v": v, "scale": D ** -0.5}


def attention_fp32(q, k, v, causal: bool, scale: float, chunk_bytes: int = REF_CHUNK_BYTES):
    """(out fp32, lse fp32) by plain fp32 math (no TF32), in blocks of heads x query rows so it fits in memory.

    Causal is top-left aligned (SDPA's ``is_causal``); k/v heads are shared by Hq / Hkv query heads (GQA).
    """
    import torch

    B, Hq, S, D = q.shape
    Hkv, Skv, Dv = k.shape[1], k.shape[2], v.shape[-1]
    rep = Hq // Hkv
    qf = q.reshape(B * Hq, S, D)
    kf = k.reshape(B * Hkv, Skv, D)
    vf = v.reshape(B * Hkv, Skv, Dv)
    out = torch.empty(B * Hq, S, Dv, device=q.device, dtype=torch.float32)
    lse = torch.empty(B * Hq, S, device=q.device, dtype=torch.float32)
    rows = max(1, min(S, chunk_bytes // (4 * Skv)))
    heads = max(1, chunk_bytes // (4 * Skv * rows))
    bh = torch.arange(B * Hq, device=q.device)
    kv_index = (bh // Hq) * Hkv + (bh % Hq) // rep
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for h0 in range(0, B * Hq, heads):
            idx = kv_index[h0:h0 + heads]
            kh, vh = kf.index_select(0, idx).float(), vf.index_select(0, idx).float()
            for r0 in range(0, S, rows):
                s = torch.matmul(qf[h0:h0 + heads, r0:r0 + rows].float(), kh.transpose(1, 2)) * scale
                if causal:
                    qi = torch.arange(r0, r0 + s.shape[1], device=q.device)
                    s.masked_fill_(qi[:, None] < torch.arange(Skv, device=q.device)[None, :], float("-inf"))
                m = torch.logsumexp(s, dim=-1)
                lse[h0:h0 + heads, r0:r0 + rows] = m
                p = torch.exp(s - m[..., None]).nan_to_num_(0.0)
                out[h0:h0 + heads, r0:r0 + rows] = torch.matmul(p, vh)
                del s, p
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return out.reshape(B, Hq, S, Dv), lse.reshape(B, Hq, S)


def reference(case, inp) -> Ref:
    out, lse = attention_fp32(inp["q"], inp["k"], inp["v"], case.causal, inp["scale"])
    return Ref(out, lse)


def _sdpa_peer(backend_name: str, only_dv: bool = False):
    """SDPA under one backend; ``only_dv``: timed only for a v head dim of its own (where FA2 cannot run)."""
    def bind(case, inp) -> Bound:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if only_dv and case.dv == case.head_dim:
            raise Skip("timed only where v has a head dim of its own")

        q, k, v, scale = inp["q"], inp["k"], inp["v"], inp["scale"]
        ctx = lambda: sdpa_kernel([getattr(SDPBackend, backend_name)])
        call = lambda kk, vv, gqa: F.scaled_dot_product_attention(q, kk, vv, is_causal=case.causal, scale=scale,
                                                                 enable_gqa=gqa)
        if not case.gqa:
            return Bound(lambda: call(k, v, False), context=ctx)
        try:
            with ctx():
                call(k, v, True)
            if q.is_cuda:
                torch.cuda.synchronize()
            return Bound(lambda: call(k, v, True), context=ctx)
        except RuntimeError as e:
            rep = case.heads // case.kv_heads
            ke, ve = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            note = (f"enable_gqa not served ({error_text(e)[:120]}); k/v expanded to {case.heads} heads "
                    "outside the timing")
            return Bound(lambda: call(ke, ve, False), context=ctx, note=note)

    return bind


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _bind_flex(case, inp) -> Bound:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q, k, v, scale = inp["q"], inp["k"], inp["v"], inp["scale"]
    S = case.seqlen
    mask = create_block_mask(_causal, None, None, S, S, device=q.device) if case.causal else None
    compiled = torch.compile(flex_attention, dynamic=False)
    return Bound(lambda: compiled(q, k, v, block_mask=mask, scale=scale, enable_gqa=case.gqa))


def _bind_triton(case, inp) -> Bound:
    import torch

    from . import peers_triton

    if case.dv != case.head_dim:
        raise Skip("the Triton peer has one head dim")
    q, k, v, scale = inp["q"], inp["k"], inp["v"], inp["scale"]
    out = torch.empty_like(q)
    state = {}

    def fn():
        o, state["kernel"] = peers_triton.attention(q, k, v, case.causal, scale, out=out)
        return o

    note = "causal: one loop to the diagonal, mask applied by select on every block" if case.causal else None
    return Bound(fn, out=out, inspect=lambda: peers_triton.ws_note(state.get("kernel")), note=note)


def _bind_autows(case, inp, mode: str = "autows") -> Bound:
    from torch_autows import ops
    from torch_autows.runtime.attention import choose_config

    from .peers_decode import _choice

    q, k, v, scale = inp["q"], inp["k"], inp["v"], inp["scale"]
    note = f"config {choose_config(case.head_dim, case.causal, case.seqlen, case.dv)}" if mode == "autows" else None
    return Bound(lambda: ops.attention(q, k, v, is_causal=case.causal, scale=scale, enable_gqa=case.gqa),
                 counters=("attention",) if mode == "autows" else (), context=_choice(mode), note=note)


def _bind_chosen(case, inp) -> Bound:
    return _bind_autows(case, inp, "measure")


def all_peers() -> tuple[list[Peer], list[str]]:
    peers = [Peer("cudnn", _sdpa_peer("CUDNN_ATTENTION"), "SDPA under sdpa_kernel([SDPBackend.CUDNN_ATTENTION])"),
             Peer("fa2", _sdpa_peer("FLASH_ATTENTION"), "SDPA under sdpa_kernel([SDPBackend.FLASH_ATTENTION])"),
             Peer("efficient", _sdpa_peer("EFFICIENT_ATTENTION", only_dv=True),
                  "SDPA under sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]), only where v has a head dim of its own "
                  "(FA2 has one head dim)"),
             Peer("flex", _bind_flex, "torch.compile(flex_attention), causal via create_block_mask"),
             Peer("triton-autows", _bind_triton,
                  "Triton 3.6 flash loop, tl.range(warp_specialize=True), 128x128, 4 warps"),
             Peer("autows", _bind_autows, "torch_autows.ops.attention forced to the generated kernel (fails if it "
                  "fell back to torch; lse checked)"),
             Peer("autows-chosen", _bind_chosen, "torch_autows.ops.attention with the measured choice (ours or "
                  "SDPA's pick): what a user gets; not a peer in the ratio")]
    return peers, []


def suite(cases: list, peers: list[Peer]) -> Suite:
    return Suite("attention", cases, peers, make_inputs, reference)
