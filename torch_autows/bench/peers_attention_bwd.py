"""Attention-backward peers: cuDNN's and FA2's backward kernels, compiled flex_attention's backward, autows (in
each dQ form: the chosen one as ``autows``, atomic as ``autows-atomic``, the TMA reduce-add form as ``autows-reduce``,
and the separate dQ kernel, what deterministic mode runs, as ``autows-separate``).

Every peer times only the backward: dQ, dK, dV from q, k, v, dO and the forward's out and lse, which are
computed once per case outside the timing, by the forward the peer's backward belongs to (cuDNN's backward
reads cuDNN's out/lse, FA2's reads FA2's; autows takes the cuDNN forward's, or FA2's where cuDNN does not run).
flex runs its compiled forward once and times ``torch.autograd.grad`` on the saved graph (``retain_graph``), so
the timed call is its compiled backward graph alone.

The checked output is dQ, dK, dV flattened and concatenated, each divided by the norm of its fp32 reference, so
the relative error weighs the three gradients alike (a wrong dQ cannot hide behind a large dV), and each gradient
is also checked alone against the tolerance (``checked``); that runs outside the timing (``Bound.result``).
Reference: ``attention_grad._math_backward`` on fp32 copies, TF32 off, in chunks of (batch, kv-head) groups so
s16384 fits in memory.
"""
from __future__ import annotations

from .peers_attention import make_inputs as _qkv
from .results import error_text
from .runner import TOL, Bound, CheckFailed, Peer, Ref, Suite

REF_CHUNK_BYTES = 1 << 30  # fp32 score block of one step of the reference (it holds about six of them)


def make_inputs(case) -> dict:
    """q, k, v and dO (random normal, the case's dtype) and the scale; forwards are made on demand (``forward``)."""
    import torch

    inp = _qkv(case)
    inp["grad_out"] = torch.randn_like(inp["q"])
    inp["forwards"] = {}
    return inp


def forward(inp: dict, kind: str, causal: bool):
    """(out, lse fp32 [B, Hq, S]) of the ``kind`` forward ("cudnn" or "flash"), computed once per case; a forward
    that cannot run raises its error again to every peer that asks for it."""
    from torch_autows.sdpa_fallback import fused_attention

    memo = inp["forwards"]
    if kind not in memo:
        try:
            memo[kind] = fused_attention(kind, inp["q"], inp["k"], inp["v"], causal, inp["scale"])
        except Exception as e:
            memo[kind] = RuntimeError(f"{kind} forward (for the saved out/lse): {error_text(e)}")
    res = memo[kind]
    if isinstance(res, Exception):
        raise res
    return res


def grads_fp32(q, k, v, grad_out, causal: bool, scale: float, chunk_bytes: int = REF_CHUNK_BYTES):
    """(dq, dk, dv) fp32 of ``attention(q, k, v)`` for ``grad_out`` by ``attention_grad._math_backward`` on fp32
    copies (no TF32), out recomputed in fp32; chunked over (batch, kv-head) units, each with its Hq / Hkv query
    heads (GQA: dK, dV summed over the group). Top-left causal, as SDPA's ``is_causal``."""
    import torch

    from torch_autows.attention_grad import _math_backward, reference_attention

    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    units = B * Hkv
    qu, gu = (t.reshape(units, G, Sq, D) for t in (q, grad_out))
    ku, vu = (t.reshape(units, 1, Skv, t.shape[-1]) for t in (k, v))
    dq = torch.empty(units, G, Sq, D, device=q.device, dtype=torch.float32)
    dk = torch.empty(units, Skv, D, device=q.device, dtype=torch.float32)
    dv = torch.empty(units, Skv, v.shape[-1], device=q.device, dtype=torch.float32)
    step = max(1, chunk_bytes // (4 * G * Sq * Skv))
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for u0 in range(0, units, step):
            sl = slice(u0, u0 + step)
            qc, gc = qu[sl].float(), gu[sl].float()
            kc = ku[sl].float().expand(-1, G, -1, -1)
            vc = vu[sl].float().expand(-1, G, -1, -1)
            out, lse = reference_attention(qc, kc, vc, causal, scale)
            gq, gk, gv = _math_backward(gc, None, qc, kc, vc, out, lse, causal, scale)
            dq[sl], dk[sl], dv[sl] = gq, gk.sum(1), gv.sum(1)
            del out, lse, gq, gk, gv
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return dq.view(B, Hq, Sq, D), dk.view(B, Hkv, Skv, D), dv.view(B, Hkv, Skv, v.shape[-1])


def flat(grads, norms) -> object:
    """dQ, dK, dV each divided by its norm (the reference's), flattened and concatenated: the checked output."""
    import torch

    return torch.cat([(g.float() / n).reshape(-1) for g, n in zip(grads, norms)])


def reference(case, inp) -> Ref:
    """The fp32 gradients (``grads_fp32``) normalised as ``flat``; keeps their norms, shapes and normalised parts
    in ``inp`` for the peers' checks (``checked``)."""
    import torch

    grads = grads_fp32(inp["q"], inp["k"], inp["v"], inp["grad_out"], case.causal, inp["scale"])
    inp["norms"] = [float(torch.linalg.vector_norm(g).clamp_min(1e-30)) for g in grads]
    inp["shapes"] = [tuple(g.shape) for g in grads]
    out = flat(grads, inp["norms"])
    inp["ref_parts"] = list(torch.split(out, [g.numel() for g in grads]))
    return Ref(out)


def checked(case, inp: dict, who: str):
    """``Bound.result`` of a peer: (dq, dk, dv) -> ``flat``. Checks the shapes, and each gradient alone against its
    reference part (relative error within the case's tolerance: the runner's check of the concatenation is their
    root mean square, which could let one of the three pass at sqrt(3) x the tolerance)."""
    import math

    import torch

    tol = TOL.get(case.dtype, 1e-2)

    def result(grads):
        got = [tuple(g.shape) for g in grads]
        if got != inp["shapes"]:
            raise CheckFailed(f"{who} returned gradients of shapes {got}, expected {inp['shapes']} (dq, dk, dv)")
        res = flat(grads, inp["norms"])
        parts = torch.split(res, [p.numel() for p in inp["ref_parts"]])
        errs = [float(torch.linalg.vector_norm(a - b)) for a, b in zip(parts, inp["ref_parts"])]
        for name, err in zip(("dq", "dk", "dv"), errs):
            if err > tol:  # NaN is left to the runner's NaN/Inf check
                overall = math.sqrt(sum(e * e for e in errs) / 3)
                raise CheckFailed(f"{name} rel_err {err:.3e} > tolerance {tol:.0e}", overall)
        return res

    return result


def poison(inp: dict):
    """``Bound.poison``: the gradients are allocated by the kernels, so there is no output buffer to fill with NaN.
    Instead the allocator's cache is emptied and blocks of the gradients' sizes are filled with NaN and freed just
    before the checked call, so its same-size allocations most likely get them back (best effort: the caching
    allocator promises nothing), not the warm call's or an earlier peer's correct gradients."""

    def fill():
        import torch

        if not inp["q"].is_cuda:
            return
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        blocks = [torch.full(s, float("nan"), dtype=inp["q"].dtype, device=inp["q"].device) for s in inp["shapes"]]
        torch.cuda.synchronize()
        del blocks

    return fill


def _bound(case, inp, fn, who: str, note: str | None = None) -> Bound:
    return Bound(fn, result=checked(case, inp, who), poison=poison(inp), note=note)


def _bind_cudnn(case, inp) -> Bound:
    import torch

    from torch_autows.attention_grad import _cudnn_backward

    out, lse = forward(inp, "cudnn", case.causal)
    q, k, v, scale = inp["q"], inp["k"], inp["v"], inp["scale"]
    go = torch.empty_like(out).copy_(inp["grad_out"])  # cuDNN reads dO with O's strides: laid out so here
    return _bound(case, inp, lambda: _cudnn_backward(go, q, k, v, out, lse, case.causal, scale), "cudnn")


def _bind_fa2(case, inp) -> Bound:
    from torch_autows.attention_grad import _expand_kv, _flash_backward, _reduce_kv

    out, lse = forward(inp, "flash", case.causal)
    q, k, v, go, scale = inp["q"], inp["k"], inp["v"], inp["grad_out"], inp["scale"]
    call = lambda: _flash_backward(go, q, k, v, out, lse, case.causal, scale)
    if not case.gqa:
        return _bound(case, inp, call, "fa2")
    try:  # FA2 sums dK/dV over the groups itself where torch's kernel takes grouped k/v heads: the faster peer
        checked(case, inp, "fa2 on grouped k/v")(call())
        return _bound(case, inp, call, "fa2", "grouped k/v heads taken as they are")
    except (RuntimeError, CheckFailed) as e:
        group = case.heads // case.kv_heads
        ke, ve = _expand_kv(k, group).contiguous(), _expand_kv(v, group).contiguous()
        note = (f"grouped k/v not served ({error_text(e)[:120]}); k/v expanded to {case.heads} heads outside the "
                "timing, dK/dV summed over each group inside it (as attention_grad)")

        def fn():
            dq, dk, dv = _flash_backward(go, q, ke, ve, out, lse, case.causal, scale)
            return dq, _reduce_kv(dk, group), _reduce_kv(dv, group)

        return _bound(case, inp, fn, "fa2", note)


def _bind_flex(case, inp) -> Bound:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from .peers_attention import _causal

    q, k, v = (inp[n].detach().requires_grad_() for n in ("q", "k", "v"))
    go, scale, S = inp["grad_out"], inp["scale"], case.seqlen
    mask = create_block_mask(_causal, None, None, S, S, device=q.device) if case.causal else None
    compiled = torch.compile(flex_attention, dynamic=False)
    out = compiled(q, k, v, block_mask=mask, scale=scale, enable_gqa=case.gqa)  # the saved graph, not timed
    return _bound(case, inp, lambda: torch.autograd.grad(out, (q, k, v), go, retain_graph=True), "flex",
                  "compiled forward run once; timed: torch.autograd.grad on its saved graph (compiled backward)")


def _bind_autows(case, inp, dq_mode: str | None = None, who: str = "autows") -> Bound:
    try:
        out, lse = forward(inp, "cudnn", case.causal)
        src = "cudnn"
    except RuntimeError:
        out, lse = forward(inp, "flash", case.causal)
        src = "flash"
    from torch_autows.runtime import attention_bwd  # not in every checkout yet: the row records the ImportError

    q, k, v, go, scale = inp["q"], inp["k"], inp["v"], inp["grad_out"], inp["scale"]
    kw = {} if dq_mode is None else {"dq_mode": dq_mode}
    return _bound(case, inp, lambda: attention_bwd.backward(go, None, q, k, v, out, lse, case.causal, scale, **kw),
                  who, None if src == "cudnn" else "out/lse of the flash forward")


def _bind_autows_atomic(case, inp) -> Bound:
    return _bind_autows(case, inp, "atomic", "autows-atomic")


def _bind_autows_reduce(case, inp) -> Bound:
    return _bind_autows(case, inp, "reduce", "autows-reduce")


def _bind_autows_separate(case, inp) -> Bound:
    return _bind_autows(case, inp, "separate", "autows-separate")


def all_peers() -> tuple[list[Peer], list[str]]:
    peers = [Peer("cudnn", _bind_cudnn, "aten._scaled_dot_product_cudnn_attention_backward on the cuDNN forward's "
                  "out/lse (attention_grad._cudnn_backward)"),
             Peer("fa2", _bind_fa2, "aten._scaled_dot_product_flash_attention_backward on the flash forward's "
                  "out/lse (attention_grad._flash_backward)"),
             Peer("flex", _bind_flex, "torch.compile(flex_attention): torch.autograd.grad on the saved graph, "
                  "causal via create_block_mask"),
             Peer("autows", _bind_autows, "torch_autows.runtime.attention_bwd.backward, what a user gets (the "
                  "form chosen per call, choose_dq_mode: reduce or separate); fails where it raises Unsupported"),
             Peer("autows-atomic", _bind_autows_atomic, "the same with dq_mode='atomic': pre + main kernel with "
                  "dQ by fp32 atomic adds + post"),
             Peer("autows-reduce", _bind_autows_reduce, "the same with dq_mode='reduce': pre + main kernel with dQ "
                  "by a TMA bulk reduce-add per tile (FA3's form) + post"),
             Peer("autows-separate", _bind_autows_separate, "the same with dq_mode='separate', what deterministic mode "
                  "runs (torch.use_deterministic_algorithms): pre + main kernel for dK/dV + a dQ kernel + post, every "
                  "gradient element written once")]
    return peers, []


def suite(cases: list, peers: list[Peer]) -> Suite:
    return Suite("attention-bwd", cases, peers, make_inputs, reference)
