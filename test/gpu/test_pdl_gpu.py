"""``config.pdl`` on sm_90: chains of generated kernels where each reads what the one before it wrote, launched with
programmatic dependent launch, eagerly and replayed from a CUDA graph. Every output is poisoned with NaN before the
chain runs and every input is fresh random data, so a kernel that read its input before the previous kernel's writes
were visible (a missing or misplaced ``griddepcontrol.wait``) shows as NaN or a stale value."""
from __future__ import annotations

import pytest
import torch

from torch_autows import config
from torch_autows.ops import torch_attention
from torch_autows.runtime import attention as rta
from torch_autows.runtime import gemm as rtg

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

BF = torch.bfloat16


def _rel(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def _weights(seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w1 = torch.randn(4096, 2048, device="cuda", dtype=BF, generator=g) / 45  # [N, K]: nn.Linear's layout
    w2 = torch.randn(1024, 4096, device="cuda", dtype=BF, generator=g) / 64
    w3 = torch.randn(2048, 1024, device="cuda", dtype=BF, generator=g) / 32
    return w1, w2, w3


def _chain(x, w1, w2, w3, outs, configs):
    """x -> (x w1^T) -> (. w2^T) -> (. w3^T) -> attention over the last as q, k and v: each kernel reads the output
    the previous one wrote."""
    h1 = rtg.gemm(x, w1.t(), None, BF, config=configs[0], out=outs[0])
    h2 = rtg.gemm(h1, w2.t(), None, BF, config=configs[1], out=outs[1])
    h3 = rtg.gemm(h2, w3.t(), None, BF, config=configs[2], out=outs[2])
    q = h3.view(1, -1, 16, 128).transpose(1, 2)  # [1, 16, rows, 128]
    o, _ = rta.attention(q, q, q, True, 128 ** -0.5, config="auto", out=outs[3].transpose(1, 2))
    return h1, h2, h3, outs[3].transpose(1, 2)


def _reference(x, w1, w2, w3):
    h1 = (x.float() @ w1.float().t()).to(BF)
    h2 = (h1.float() @ w2.float().t()).to(BF)
    h3 = (h2.float() @ w3.float().t()).to(BF)
    q = h3.view(1, -1, 16, 128).transpose(1, 2)
    return h1, h2, h3, torch_attention(q.float(), q.float(), q.float(), True, 128 ** -0.5)[0]


#: (rows, the configs of the three GEMMs): decode tiles (swap-AB, split-K) and the large-GEMM pick
CHAINS = [(16, ("decs_64x128_m16_s1", "dec_64x128_s2", "decs_128x128_m16_s1")),
          (1024, ("ws_p_128x256", "ws_p_128x128", "ws_p_128x256"))]


@pytest.mark.parametrize("rows,configs", CHAINS)
@pytest.mark.parametrize("graph", [False, True])
def test_chain_reads_what_the_previous_kernel_wrote(rows, configs, graph, monkeypatch):
    monkeypatch.setattr(config, "pdl", True)
    w1, w2, w3 = _weights(rows)
    x = torch.randn(rows, 2048, device="cuda", dtype=BF)
    outs = [torch.empty(rows, n, device="cuda", dtype=BF) for n in (4096, 1024, 2048)]
    outs.append(torch.empty(1, rows, 16, 128, device="cuda", dtype=BF))  # attention's out, in q's [B, S, H, D] rows
    _chain(x, w1, w2, w3, outs, configs)  # compile and bind outside the capture
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            result = _chain(x, w1, w2, w3, outs, configs)
    for i in range(3):
        x.copy_(torch.randn_like(x))
        for t in outs:
            t.fill_(float("nan"))
        if graph:
            g.replay()
        else:
            result = _chain(x, w1, w2, w3, outs, configs)
        torch.cuda.synchronize()
        for name, got, ref in zip(("h1", "h2", "h3", "o"), result, _reference(x, w1, w2, w3)):
            assert not got.isnan().any(), (i, name)
            assert _rel(got, ref) < 2e-2, (i, name, _rel(got, ref))
    kernels = [rtg.compile_kernel("gemm", rtg.GemmRequest(1, 1, 1, "bf16", trans_b=True), rtg.CONFIGS[c])
               for c in configs]
    assert all(k.launcher.pdl for k in kernels)
