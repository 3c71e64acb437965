"""Model peers on the Llama-style decoder (llama.py): eager, torch.compile default, max-autotune, backend="autows".

Correctness: output hidden states against the same weights run in fp32 (attention by the chunked fp32
reference of the attention bench, so 1 x 16384 fits). Tolerance: 1e-2, raised to twice eager bf16's own
error when that is larger (4 layers of bf16 rounding), so a compiled model must be about as accurate as
eager. Every timed peer also gets a GPU-time split into GEMM / attention / rest kernels from torch.profiler
kernel names (best effort).
"""
from __future__ import annotations

import re

from .peers_attention import attention_fp32
from .results import error_text
from .runner import TOL, Bound, Peer, Ref, Suite

_ATTN = re.compile(r"attn|attention|fmha|flash|sdpa|flex", re.I)
_GEMM = re.compile(r"gemm|nvjet|xmma|cutlass|cublas|matmul|wgmma|(^|_)(b?mm|addmm|tem_fused)(_|$)", re.I)
PROFILE_ITERS = 3


#: Inductor's generated pointwise / reduction kernels: named after the source ops they fuse, so a RoPE kernel
#: feeding SDPA is ``triton_poi_fused__scaled_dot_product_cudnn_attention_...``; they are "rest" whatever follows.
_FUSED = re.compile(r"^triton_(poi|per|red)_")


def classify_kernel(name: str) -> str:
    """'attention', 'gemm' or 'rest' from a CUDA kernel name (attention first: its kernels often say gemm)."""
    if _FUSED.search(name):
        return "rest"
    if _ATTN.search(name):
        return "attention"
    if _GEMM.search(name):
        return "gemm"
    return "rest"


def split_from_events(events: list[tuple[str, float]], iters: int) -> dict:
    """Events (kernel name, total device microseconds over ``iters`` calls) -> ms per call by class, top kernels."""
    total = {"gemm": 0.0, "attention": 0.0, "rest": 0.0}
    for name, us in events:
        total[classify_kernel(name)] += us
    top = sorted(events, key=lambda e: -e[1])[:12]
    split = {f"{k}_ms": v / iters / 1e3 for k, v in total.items()}
    split["top_kernels"] = [[name[:100], round(us / iters / 1e3, 4), classify_kernel(name)] for name, us in top]
    return split


def profile_split(fn, context) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with context():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(PROFILE_ITERS):
                fn()
            torch.cuda.synchronize()
    events = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0.0)
        if us and us > 0:
            events.append((e.key, float(us)))
    return {"split": split_from_events(events, PROFILE_ITERS)}


def make_inputs(case) -> dict:
    import torch

    from .llama import LlamaConfig, build_model

    cfg = LlamaConfig(n_layers=case.layers)
    model = build_model(cfg, device="cuda", dtype=torch.bfloat16, seed=0)
    x = torch.randn(case.batch, case.seqlen, cfg.hidden, device="cuda", dtype=torch.bfloat16)
    return {"model": model, "x": x, "cfg": cfg}


def reference(case, inp) -> Ref:
    import torch

    from .llama import LlamaDecoder

    with torch.device("cuda"):
        ref_model = LlamaDecoder(inp["cfg"])
    ref_model.load_state_dict(inp["model"].state_dict())  # copies bf16 weights into the fp32 parameters
    ref_model.eval()
    for layer in ref_model.layers:
        layer.attn.sdpa = _fp32_sdpa
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            out = ref_model(inp["x"].float())
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    del ref_model
    return Ref(out)


def _fp32_sdpa(q, k, v, is_causal: bool, enable_gqa: bool):
    return attention_fp32(q, k, v, is_causal, q.shape[-1] ** -0.5)[0]


def tolerance(case, rows: list[dict]) -> float:
    eager = next((r for r in rows if r.get("impl") == "eager" and not r.get("error")), None)
    base = TOL["bf16"]
    if eager is None or eager.get("rel_err") is None:
        return base
    return max(base, 2 * eager["rel_err"])


def _no_grad():
    import torch

    return torch.no_grad()


def _bound(fn) -> Bound:
    return Bound(fn, context=_no_grad, extra=lambda: profile_split(fn, _no_grad))


def _bind_eager(case, inp) -> Bound:
    model, x = inp["model"], inp["x"]
    return _bound(lambda: model(x))


def _compiled(**kw):
    def bind(case, inp) -> Bound:
        import torch

        model, x = inp["model"], inp["x"]
        cm = torch.compile(model, dynamic=False, **kw)
        return _bound(lambda: cm(x))

    return bind


def autows_backend():
    """The autows dynamo backend callable (works without the entry point, e.g. with PYTHONPATH=.)."""
    from torch_autows.inductor.backend import autows

    return autows


def _bind_autows(case, inp) -> Bound:
    import torch

    try:
        backend = autows_backend()
    except Exception as e:  # not written yet / broken: the row records why
        raise RuntimeError(f"autows backend not importable: {error_text(e)}") from e
    model, x = inp["model"], inp["x"]
    cm = torch.compile(model, backend=backend, dynamic=False)
    b = _bound(lambda: cm(x))
    b.counters = ("gemm", "bmm", "attention")
    b.inspect = site_notes()
    return b


def site_notes():
    """An ``inspect`` for a compiled autows peer: the measured choice's decisions its compile asked for (each site's
    side, both times and how it was decided), as the row's note."""
    from torch_autows.runtime import choice

    since = choice.mark()
    return lambda: choice.used_since(since)


def all_peers() -> tuple[list[Peer], list[str]]:
    peers = [Peer("eager", _bind_eager, "plain eager PyTorch (cuBLAS + SDPA default)"),
             Peer("inductor", _compiled(), "torch.compile(model) (Inductor default mode)"),
             Peer("inductor-max-autotune", _compiled(mode="max-autotune-no-cudagraphs"),
                  'torch.compile(model, mode="max-autotune-no-cudagraphs")'),
             Peer("autows", _bind_autows, 'torch.compile(model, backend="autows"); fails unless an autows kernel ran')]
    return peers, []


def suite(cases: list, peers: list[Peer]) -> Suite:
    return Suite("model", cases, peers, make_inputs, reference, tolerance=tolerance)
