"""Split-K GEMMs on sm_90 (passes/split_k): the sum is deterministic, launches on two streams at once each get their
own workspace, a CUDA graph replays a split-K launch, torch.compile(mode="reduce-overhead") records one, and the
decode configs the heuristic picks for a few rows are right."""
from __future__ import annotations

import pytest
import torch

from torch_autows.runtime import gemm as rt

SPLIT = [c for c, o in rt.CONFIGS.items() if o.split_k > 1]


def _inputs(m, k, n, trans_b=True, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) / k ** 0.5
    return a, (w.t() if trans_b else w.t().contiguous())


def _rel(out, ref):
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item()


@pytest.mark.parametrize("config", SPLIT)
def test_repeated_launches_are_bitwise_equal(config, repeated_split_launches):
    a, b = _inputs(13, 3000, 1000)  # ragged rows, columns and K steps
    repeated_split_launches(lambda out: rt.gemm(a, b, None, torch.bfloat16, config=config, out=out), (13, 1000),
                            a.float() @ b.float(), 1e-2)


def test_two_streams_at_once():
    config = "dec_128x128_s4"
    cases = [_inputs(8, 8192, 4096, seed=s) for s in range(2)]
    streams = [torch.cuda.Stream() for _ in cases]
    outs = [torch.full((8, 4096), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in cases]
    torch.cuda.synchronize()
    for _ in range(5):
        for (a, b), s, out in zip(cases, streams, outs):
            with torch.cuda.stream(s):
                rt.gemm(a, b, None, torch.bfloat16, config=config, out=out)
    torch.cuda.synchronize()
    for (a, b), out in zip(cases, outs):
        assert _rel(out, a.float() @ b.float()) < 1e-2


def test_cuda_graph_replays_a_split_launch():
    a, b = _inputs(4, 4096, 2048)
    out = torch.empty(4, 2048, device="cuda", dtype=torch.bfloat16)
    rt.gemm(a, b, None, torch.bfloat16, config="dec_64x128_s3", out=out)  # first call outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        rt.gemm(a, b, None, torch.bfloat16, config="dec_64x128_s3", out=out)
    for _ in range(3):
        out.fill_(float("nan"))
        a.copy_(torch.randn_like(a))
        g.replay()
        torch.cuda.synchronize()
        assert _rel(out, a.float() @ b.float()) < 1e-2


@pytest.mark.parametrize("m", [1, 8, 16, 32, 64, 128])
@pytest.mark.parametrize("k,n", [(4096, 4096), (14336, 4096), (8192, 10240)])
def test_heuristic_decode_configs(m, k, n):
    a, b = _inputs(m, k, n)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    rt.gemm(a, b, None, torch.bfloat16, config="auto", out=out)
    torch.cuda.synchronize()
    assert rt.choose_config(m, n, k).startswith("dec_")
    assert _rel(out, a.float() @ b.float()) < 1e-2


def test_reduce_overhead_compile_with_a_split_k_site():
    """torch.compile(backend="autows", mode="reduce-overhead") on a decode GEMM our split-K kernel serves: cudagraph
    trees record and replay it (a split-K workspace kept from the capture made them refuse: "tensor(s) in the
    cudagraph pool not tracked as outputs", the decode MLP at 64 rows on the H200)."""
    import torch_autows
    from torch_autows.runtime import fallback

    assert rt.CONFIGS[rt.choose_config(8, 4096, 14336)].split_k > 1  # the site is a split-K launch
    torch._dynamo.reset()
    lin = torch.nn.Linear(14336, 4096, bias=False).cuda().to(torch.bfloat16)
    before = fallback.counters["gemm.autows"]
    with torch_autows.config.patch(choice="autows"), torch.no_grad():
        f = torch.compile(lin, backend="autows", mode="reduce-overhead", dynamic=False)
        for _ in range(4):  # cudagraph trees record on a later call, then replay
            x = torch.randn(8, 14336, device="cuda", dtype=torch.bfloat16)
            y = f(x).float()
            assert _rel(y, x.float() @ lin.weight.float().t()) < 1e-2
    assert fallback.counters["gemm.autows"] > before
